"""A small certificate maker: a CA and the node and client certificates it signs.

``accord dev --tls`` makes a fresh cluster's certificates with it, and tests make
their CAs (a second CA to be refused, an expired or rotated certificate) the same way::

    ca = CertificateAuthority.create("accord dev CA")
    node = ca.issue("n1", hosts=("127.0.0.1", "localhost"))
    files = node.write(Path("certs"), "n1", ca)     # n1.crt, n1.key, ca.crt
    # etcd-style flags: --cert-file certs/n1.crt --key-file certs/n1.key --trusted-ca-file certs/ca.crt

Keys are ECDSA P-256: every TLS stack accord meets (OpenSSL behind Python's ``ssl``
and gRPC's BoringSSL, Go's crypto/tls behind etcdctl) speaks it, and making one takes
well under a millisecond where a 2048-bit RSA key takes tens, which matters to a test
that makes a dozen. Certificates carry what etcd's own tooling (cfssl profiles in
etcd's docs) gives a member: both the ``serverAuth`` and ``clientAuth`` extended key
usages (a member is a server to its clients and a client to its peers) and the hosts
as subject alternative names (IP addresses as IP SANs, so a client dialing
``https://127.0.0.1:2379`` verifies the name). Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from accord.raft.storage.files import replace_durably

DEFAULT_HOSTS = ("127.0.0.1", "localhost")
DEFAULT_VALID = datetime.timedelta(days=365)
_BACKDATE = datetime.timedelta(minutes=5)
"""Certificates start a little in the past, so a peer whose clock runs behind accepts them."""


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def write_pem(path: Path, data: bytes, *, private: bool = False) -> Path:
    """Write ``data`` to ``path`` atomically and durably (``replace_durably``), so a
    node re-reading certificates on change never sees half a file and a power cut
    never leaves none; ``private`` files get mode 0600. Returns ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_durably(path, data, mode=0o600 if private else 0o644)


@dataclass(frozen=True, slots=True)
class CertFiles:
    """Where one party's certificate, key and trusted CA were written."""

    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        """The certificate, parsed."""
        return x509.load_pem_x509_certificate(self.cert_pem)

    def write(self, folder: Path, name: str, ca: CertificateAuthority | None = None) -> CertFiles:
        """Write ``<name>.crt`` and ``<name>.key`` (and ``ca.crt`` if ``ca``) into ``folder``."""
        cert = write_pem(folder / f"{name}.crt", self.cert_pem)
        key = write_pem(folder / f"{name}.key", self.key_pem, private=True)
        ca_path = folder / "ca.crt"
        if ca is not None:
            write_pem(ca_path, ca.cert_pem)
        return CertFiles(cert, key, ca_path)


class CertificateAuthority:
    """A self-signed CA that issues leaf certificates (kept in memory; ``write`` saves it)."""

    def __init__(self, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
        self.cert = cert
        self.key = key

    @classmethod
    def create(cls, common_name: str = "accord CA", *,
               valid: datetime.timedelta = DEFAULT_VALID) -> CertificateAuthority:
        """A fresh CA with a new key."""
        key = _key()
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        now = _now()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - _BACKDATE).not_valid_after(now + valid)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_cert_sign=True, crl_sign=True,
                content_commitment=False, key_encipherment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert, key)

    @property
    def cert_pem(self) -> bytes:
        """The CA certificate, PEM (what ``--trusted-ca-file`` / ``--cacert`` point at)."""
        return self.cert.public_bytes(serialization.Encoding.PEM)

    @property
    def key_pem(self) -> bytes:
        """The CA's private key, PEM."""
        return _key_pem(self.key)

    def issue(self, common_name: str, *, hosts: Sequence[str] = DEFAULT_HOSTS,
              server: bool = True, client: bool = True,
              not_before: datetime.datetime | None = None,
              not_after: datetime.datetime | None = None) -> Issued:
        """A new key and a certificate for it signed by this CA.

        ``hosts`` become subject alternative names (IPs as IP SANs); ``server`` and
        ``client`` choose the extended key usages. ``not_before``/``not_after``
        default to five minutes ago and a year from now (tests pass past dates to
        make an expired certificate)."""
        if not (server or client):
            raise ValueError("a certificate must be usable as a server, a client or both")
        key = _key()
        now = _now()
        usages = ([ExtendedKeyUsageOID.SERVER_AUTH] if server else []) + (
            [ExtendedKeyUsageOID.CLIENT_AUTH] if client else [])
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before or now - _BACKDATE)
            .not_valid_after(not_after or now + DEFAULT_VALID)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, key_encipherment=False, key_cert_sign=False,
                crl_sign=False, content_commitment=False, data_encipherment=False,
                key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                self.key.public_key()), critical=False)
        )
        if hosts:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        return Issued(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))

    def write(self, folder: Path, name: str = "ca") -> Path:
        """Write ``<name>.crt`` and ``<name>.key`` into ``folder``; returns the certificate's path."""
        write_pem(folder / f"{name}.key", self.key_pem, private=True)
        return write_pem(folder / f"{name}.crt", self.cert_pem)


def make_cluster_pki(folder: Path, names: Sequence[str], *, hosts: Sequence[str] = DEFAULT_HOSTS,
                     client_name: str = "client",
                     ca_name: str = "accord CA") -> tuple[CertificateAuthority, dict[str, CertFiles]]:
    """A CA and one certificate per member of ``names`` plus one for ``client_name``,
    written into ``folder`` (``ca.crt``, ``<name>.crt``, ``<name>.key``).

    The members' certificates serve both client and peer traffic (etcd's docs use
    one certificate per member for both); the client's certificate carries
    ``client_name`` as its common name, the user name etcd's ``--client-cert-auth``
    authenticates it as."""
    ca = CertificateAuthority.create(ca_name)
    ca.write(folder)
    files = {n: ca.issue(n, hosts=hosts).write(folder, n, ca) for n in names}
    files[client_name] = ca.issue(client_name, hosts=(), server=False).write(folder, client_name, ca)
    return ca, files
