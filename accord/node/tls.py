"""TLS for a node's two kinds of traffic, from etcd's flags, re-read when the files change.

A node has up to two ``TLSFiles``: the client side (``--cert-file``, ``--key-file``,
``--trusted-ca-file``, ``--client-cert-auth``) and the peer side (the same flags with
``--peer-``). ``ReloadingTLS`` loads one, checks it the way an operator wants to hear
about it at startup (a missing or unreadable file, something that is not PEM, a key
that does not belong to the certificate, a certificate that expired or is not valid
yet: each a ``TLSFileError`` naming the flag and the file), and builds what the
servers need:

* ``server_context()`` / ``client_context()``: ``ssl.SSLContext`` objects for the peer
  transport's accepted and dialed connections (the raft layer never reads
  configuration: the node hands it these two callables);
* ``grpc_credentials()``: gRPC server credentials for the client port, made with
  ``grpc.dynamic_ssl_server_credentials``, whose fetcher gRPC calls on every new
  handshake.

Rotation without restart: each of those calls first compares the files' identity
(inode, size, modification time) with what was loaded; when they differ, it loads and
checks them again and the next connection uses the new certificate. Connections
already open keep the session they negotiated (as etcd's do). A rotation caught half
way (a new certificate beside the old key) fails the check: the node logs why, keeps
serving with the previous files, and tries again once the files change again.

Client verification follows etcd (``pkg/transport``'s ``ServerConfig``): a server
requires and verifies client certificates when ``client-cert-auth`` is on *or* a
trusted CA file is given; with neither, any client may connect. A dialing node
verifies the server against the trusted CA (the system's roots without one) and
checks the address it dialed against the certificate's subject alternative names.
The lowest protocol version accepted is TLS 1.2, etcd's default.
"""

from __future__ import annotations

import datetime
import logging
import os
import ssl
import threading
from dataclasses import dataclass

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from accord.node.config import Config, ConfigError

log = logging.getLogger("accord.node.tls")


class TLSFileError(ConfigError):
    """A certificate, key or CA file cannot be used; the message names the flag and file."""


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """One side's TLS settings, as etcd's flags name them (``prefix`` is ``""`` or ``"peer-"``)."""

    cert_file: str
    key_file: str
    trusted_ca_file: str = ""
    client_cert_auth: bool = False
    prefix: str = ""

    @property
    def verify_clients(self) -> bool:
        """Whether connecting parties must present a certificate the CA signed (etcd's rule)."""
        return self.client_cert_auth or bool(self.trusted_ca_file)

    def flag(self, name: str) -> str:
        """The flag a setting comes from, for messages (``--peer-cert-file``)."""
        return f"--{self.prefix}{name}"

    def paths(self) -> list[tuple[str, str]]:
        """(flag, path) of every file in use."""
        out = [(self.flag("cert-file"), self.cert_file), (self.flag("key-file"), self.key_file)]
        if self.trusted_ca_file:
            out.append((self.flag("trusted-ca-file"), self.trusted_ca_file))
        return out


@dataclass(frozen=True, slots=True)
class LoadedTLS:
    """The bytes of one side's files, checked."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes | None
    subject: str
    not_after: datetime.datetime


def _read(flag: str, path: str) -> bytes:
    if not path:
        raise TLSFileError(f"{flag} is empty")
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except FileNotFoundError:
        raise TLSFileError(f"{flag} {path}: no such file") from None
    except IsADirectoryError:
        raise TLSFileError(f"{flag} {path}: is a directory, not a file") from None
    except OSError as e:
        raise TLSFileError(f"{flag} {path}: cannot read it ({e.strerror})") from None


def _certs(flag: str, path: str, data: bytes) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        certs = []
    if not certs:
        raise TLSFileError(f"{flag} {path}: no PEM certificate in it")
    return certs


def _public(key: object) -> bytes:
    return key.public_bytes(  # type: ignore[attr-defined, no-any-return]
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def load_files(files: TLSFiles, now: datetime.datetime | None = None) -> LoadedTLS:
    """Read and check ``files``; ``TLSFileError`` says what is wrong with which file."""
    cert_flag, key_flag = files.flag("cert-file"), files.flag("key-file")
    cert_pem = _read(cert_flag, files.cert_file)
    key_pem = _read(key_flag, files.key_file)
    leaf = _certs(cert_flag, files.cert_file, cert_pem)[0]
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        raise TLSFileError(f"{key_flag} {files.key_file}: the key is encrypted; "
                           "give an unencrypted PEM key") from None
    except ValueError:
        raise TLSFileError(f"{key_flag} {files.key_file}: not a PEM private key") from None
    if _public(key.public_key()) != _public(leaf.public_key()):
        raise TLSFileError(f"{key_flag} {files.key_file} does not match the certificate in "
                           f"{cert_flag} {files.cert_file} (a key of another certificate?)")
    at = now or datetime.datetime.now(datetime.UTC)
    if leaf.not_valid_after_utc <= at:
        raise TLSFileError(f"{cert_flag} {files.cert_file}: the certificate expired on "
                           f"{leaf.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC")
    if leaf.not_valid_before_utc > at:
        raise TLSFileError(f"{cert_flag} {files.cert_file}: the certificate is not valid before "
                           f"{leaf.not_valid_before_utc:%Y-%m-%d %H:%M:%S} UTC")
    ca_pem = None
    if files.trusted_ca_file:
        ca_flag = files.flag("trusted-ca-file")
        ca_pem = _read(ca_flag, files.trusted_ca_file)
        _certs(ca_flag, files.trusted_ca_file, ca_pem)
    return LoadedTLS(cert_pem, key_pem, ca_pem, leaf.subject.rfc4514_string(),
                     leaf.not_valid_after_utc)


def _identity(files: TLSFiles) -> tuple[tuple[int, int, int], ...]:
    """What changes when a file is rewritten or renamed over: (inode, size, mtime) each."""
    out = []
    for _, path in files.paths():
        try:
            st = os.stat(path)
        except OSError:
            out.append((0, 0, 0))
            continue
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


def _contexts(files: TLSFiles, loaded: LoadedTLS) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """(server, client) contexts presenting ``files``' certificate."""
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # check_hostname and CERT_REQUIRED
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            ctx.load_cert_chain(files.cert_file, files.key_file)
        except (ssl.SSLError, OSError) as e:
            raise TLSFileError(f"{files.flag('cert-file')} {files.cert_file} / "
                               f"{files.flag('key-file')} {files.key_file}: {e}") from None
    if loaded.ca_pem is not None:
        cadata = loaded.ca_pem.decode("ascii", errors="replace")
        client.load_verify_locations(cadata=cadata)
        server.load_verify_locations(cadata=cadata)
    else:
        client.load_default_certs(ssl.Purpose.SERVER_AUTH)
        if files.verify_clients:
            server.load_default_certs(ssl.Purpose.CLIENT_AUTH)
    if files.verify_clients:
        server.verify_mode = ssl.CERT_REQUIRED
    return server, client


class ReloadingTLS:
    """One side's TLS material, re-read when its files change (see the module docstring)."""

    def __init__(self, files: TLSFiles) -> None:
        """Load and check ``files`` now; ``TLSFileError`` if they cannot be used."""
        self.files = files
        self._lock = threading.Lock()  # gRPC calls the fetcher from its own threads
        self._identity = _identity(files)
        self._failed: tuple[tuple[int, int, int], ...] | None = None
        self.loaded = load_files(files)
        self._server, self._client = _contexts(files, self.loaded)
        self.generation = 1
        """Bumped on every successful re-read (1: the files read at startup)."""

    def refresh(self) -> bool:
        """Re-read the files if they changed since the last look; True if new ones are in use."""
        identity = _identity(self.files)
        with self._lock:
            if identity == self._identity or identity == self._failed:
                return False
            try:
                loaded = load_files(self.files)
                server, client = _contexts(self.files, loaded)
            except TLSFileError as e:
                self._failed = identity
                log.warning("TLS files changed but cannot be used; keeping the previous ones: %s", e)
                return False
            self._identity, self._failed = identity, None
            self.loaded, self._server, self._client = loaded, server, client
            self.generation += 1
        log.info("re-read TLS files %s: now presenting %s, valid until %s UTC",
                 ", ".join(p for _, p in self.files.paths()), loaded.subject,
                 f"{loaded.not_after:%Y-%m-%d %H:%M:%S}")
        return True

    def server_context(self) -> ssl.SSLContext:
        """The context for the next accepted connection (the files re-read if they changed)."""
        self.refresh()
        return self._server

    def client_context(self) -> ssl.SSLContext:
        """The context for the next dialed connection (the files re-read if they changed)."""
        self.refresh()
        return self._client

    def _grpc_config(self) -> grpc.ServerCertificateConfiguration:
        return grpc.ssl_server_certificate_configuration(
            [(self.loaded.key_pem, self.loaded.cert_pem)], root_certificates=self.loaded.ca_pem)

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """Server credentials for one ``add_secure_port`` that follow the files as they change.

        Call once per port: gRPC keeps a configuration per listening port and asks the
        fetcher on every handshake; the fetcher answers a new configuration once per
        re-read, None ("unchanged") otherwise."""
        with self._lock:
            served = [self.generation]
            initial = self._grpc_config()

        def fetch() -> grpc.ServerCertificateConfiguration | None:
            try:
                self.refresh()
                with self._lock:
                    if self.generation == served[0]:
                        return None
                    served[0] = self.generation
                    return self._grpc_config()
            except Exception:  # an error must not escape into gRPC's core
                log.exception("re-reading TLS files for the client port failed")
                return None

        return grpc.dynamic_ssl_server_credentials(
            initial, fetch, require_client_authentication=self.files.verify_clients)


def client_files(cfg: Config) -> TLSFiles | None:
    """The client side's files, if any ``--listen-client-urls`` is ``https://``."""
    if not any(cfg.client_url_is_tls(u) for u in cfg.listen_client_urls):
        return None
    return TLSFiles(cfg.cert_file, cfg.key_file, cfg.trusted_ca_file, cfg.client_cert_auth)


def peer_files(cfg: Config) -> TLSFiles | None:
    """The peer side's files, if ``--listen-peer-urls`` is ``https://``."""
    if not cfg.peer_tls:
        return None
    return TLSFiles(cfg.peer_cert_file, cfg.peer_key_file, cfg.peer_trusted_ca_file,
                    cfg.peer_client_cert_auth, "peer-")
