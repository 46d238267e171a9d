"""How a client dials an endpoint: plaintext or TLS, with etcdctl's ``--cacert/--cert/--key``.

::

    tls = TLSOptions(cacert="ca.crt", cert="client.crt", key="client.key")
    channel = aio_channel("https://127.0.0.1:2379", tls)

An endpoint's scheme decides, as etcdctl's: ``https://`` dials TLS, ``http://`` dials
plaintext, and an endpoint without a scheme dials TLS when any TLS option is given.
``cacert`` is the CA that signed the servers (without it, the system's trusted roots);
``cert`` and ``key`` (both or neither) are the client certificate a server with
``--client-cert-auth`` asks for. The files are read when a channel is made, so a
client made after a rotation uses the new ones; an unreadable file is a
``TLSOptionsError`` naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import grpc

ChannelOptions = Sequence[tuple[str, int | str]]


class TLSOptionsError(ValueError):
    """A TLS option cannot be used; the message names the option and the file."""


@dataclass(frozen=True, slots=True)
class TLSOptions:
    """The client side of TLS: a trusted CA and an optional client certificate (PEM files)."""

    cacert: str | None = None
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if bool(self.cert) != bool(self.key):
            raise TLSOptionsError("--cert and --key go together: give both or neither")

    @property
    def enabled(self) -> bool:
        """Whether any option is set (endpoints without a scheme then dial TLS)."""
        return bool(self.cacert or self.cert or self.key)

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials from the files (read now)."""
        return grpc.ssl_channel_credentials(
            root_certificates=_read("--cacert", self.cacert),
            private_key=_read("--key", self.key),
            certificate_chain=_read("--cert", self.cert))


def _read(option: str, path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise TLSOptionsError(f"{option} {path}: no such file") from None
    except OSError as e:
        raise TLSOptionsError(f"{option} {path}: cannot read it ({e.strerror})") from None
    if b"-----BEGIN" not in data:
        raise TLSOptionsError(f"{option} {path}: not a PEM file")
    return data


def split_endpoint(endpoint: str, tls: TLSOptions | None) -> tuple[str, bool]:
    """``(host:port, secure)`` for an endpoint as a user writes it (see the module docstring)."""
    ep = endpoint.strip()
    if ep.startswith("https://"):
        return ep[len("https://"):].rstrip("/"), True
    if ep.startswith("http://"):
        return ep[len("http://"):].rstrip("/"), False
    return ep.rstrip("/"), tls is not None and tls.enabled


def aio_channel(endpoint: str, tls: TLSOptions | None,
                options: ChannelOptions = ()) -> grpc.aio.Channel:
    """An asyncio channel to ``endpoint``, secure when its scheme (or ``tls``) says so."""
    target, secure = split_endpoint(endpoint, tls)
    if secure:
        return grpc.aio.secure_channel(target, (tls or TLSOptions()).credentials(), options=options)
    return grpc.aio.insecure_channel(target, options=options)


def sync_channel(endpoint: str, tls: TLSOptions | None,
                 options: ChannelOptions = ()) -> grpc.Channel:
    """A blocking channel to ``endpoint``, secure when its scheme (or ``tls``) says so."""
    target, secure = split_endpoint(endpoint, tls)
    if secure:
        return grpc.secure_channel(target, (tls or TLSOptions()).credentials(), options=options)
    return grpc.insecure_channel(target, options=options)
