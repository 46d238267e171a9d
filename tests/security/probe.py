"""Look at the certificate a TLS port serves, the way a new client connection sees it."""

from __future__ import annotations

import socket
import ssl

from accord.node.certs import CertFiles


def served_cn(port: int, client: CertFiles) -> str:
    """The common name of the certificate 127.0.0.1:``port`` serves to a new connection
    (made with ``client``'s certificate and CA, offering HTTP/2 as gRPC clients do)."""
    ctx = ssl.create_default_context(cafile=str(client.ca))
    ctx.load_cert_chain(str(client.cert), str(client.key))
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), 5) as raw, \
            ctx.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
        subject = dict(rdn[0] for rdn in conn.getpeercert()["subject"])
        return str(subject["commonName"])
