"""Loading a node's TLS files: every bad file is a clear error naming the flag and the
file, and changed files are re-read (rotation without restart)."""

from __future__ import annotations

import datetime
import logging
import ssl
from pathlib import Path

import pytest

from accord.node.certs import CertFiles, CertificateAuthority, make_cluster_pki, write_pem
from accord.node.tls import ReloadingTLS, TLSFileError, TLSFiles, load_files


@pytest.fixture
def pki(tmp_path: Path) -> tuple[CertificateAuthority, dict[str, CertFiles]]:
    return make_cluster_pki(tmp_path, ["n1"])


def _files(f: CertFiles, *, prefix: str = "", auth: bool = False, ca: bool = True) -> TLSFiles:
    return TLSFiles(str(f.cert), str(f.key), str(f.ca) if ca else "", auth, prefix)


def test_good_files_load(pki: tuple[CertificateAuthority, dict[str, CertFiles]]) -> None:
    loaded = load_files(_files(pki[1]["n1"]))
    assert loaded.subject == "CN=n1"
    assert loaded.ca_pem == pki[0].cert_pem


def test_missing_file_names_the_flag_and_the_file(
        pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path) -> None:
    f = pki[1]["n1"]
    missing = tmp_path / "nope.crt"
    with pytest.raises(TLSFileError, match=rf"--peer-cert-file {missing}: no such file"):
        load_files(TLSFiles(str(missing), str(f.key), prefix="peer-"))
    with pytest.raises(TLSFileError, match=rf"--trusted-ca-file {missing}: no such file"):
        load_files(TLSFiles(str(f.cert), str(f.key), str(missing)))
    with pytest.raises(TLSFileError, match=rf"--key-file {tmp_path}: is a directory"):
        load_files(TLSFiles(str(f.cert), str(tmp_path)))


def test_not_pem_and_encrypted_keys_are_refused(
        pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path) -> None:
    f = pki[1]["n1"]
    junk = write_pem(tmp_path / "junk.pem", b"hello\n")
    with pytest.raises(TLSFileError, match=rf"--cert-file {junk}: no PEM certificate"):
        load_files(TLSFiles(str(junk), str(f.key)))
    with pytest.raises(TLSFileError, match=rf"--key-file {junk}: not a PEM private key"):
        load_files(TLSFiles(str(f.cert), str(junk)))
    with pytest.raises(TLSFileError, match=rf"--trusted-ca-file {junk}: no PEM certificate"):
        load_files(TLSFiles(str(f.cert), str(f.key), str(junk)))
    from cryptography.hazmat.primitives import serialization
    key = serialization.load_pem_private_key(f.key.read_bytes(), None)
    locked = write_pem(tmp_path / "locked.key", key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(TLSFileError, match="the key is encrypted"):
        load_files(TLSFiles(str(f.cert), str(locked)))


def test_key_of_another_certificate_is_refused(
        pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path) -> None:
    f, other = pki[1]["n1"], pki[1]["client"]
    with pytest.raises(TLSFileError, match=rf"--key-file {other.key} does not match the "
                                           rf"certificate in --cert-file {f.cert}"):
        load_files(TLSFiles(str(f.cert), str(other.key)))


def test_expired_and_not_yet_valid_certificates_are_refused(
        pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path) -> None:
    ca = pki[0]
    now = datetime.datetime.now(datetime.UTC)
    old = ca.issue("old", not_before=now - datetime.timedelta(days=30),
                   not_after=now - datetime.timedelta(days=1)).write(tmp_path, "old")
    with pytest.raises(TLSFileError, match=rf"--cert-file {old.cert}: the certificate expired on"):
        ReloadingTLS(TLSFiles(str(old.cert), str(old.key)))
    later = ca.issue("later", not_before=now + datetime.timedelta(days=1)).write(tmp_path, "later")
    with pytest.raises(TLSFileError, match="the certificate is not valid before"):
        load_files(TLSFiles(str(later.cert), str(later.key)))


def test_client_verification_follows_etcd() -> None:
    # etcd requires client certificates with --client-cert-auth or a trusted CA file.
    assert not TLSFiles("c", "k").verify_clients
    assert TLSFiles("c", "k", client_cert_auth=True).verify_clients
    assert TLSFiles("c", "k", trusted_ca_file="ca").verify_clients


def test_contexts_verify_as_configured(pki: tuple[CertificateAuthority, dict[str, CertFiles]]) -> None:
    tls = ReloadingTLS(_files(pki[1]["n1"]))
    assert tls.server_context().verify_mode == ssl.CERT_REQUIRED
    assert tls.client_context().check_hostname
    assert tls.server_context().minimum_version == ssl.TLSVersion.TLSv1_2
    open_ = ReloadingTLS(_files(pki[1]["n1"], ca=False))
    assert open_.server_context().verify_mode == ssl.CERT_NONE


def test_rotated_files_are_picked_up_and_a_half_rotation_is_not(
        pki: tuple[CertificateAuthority, dict[str, CertFiles]], tmp_path: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    ca, files = pki
    f = files["n1"]
    tls = ReloadingTLS(_files(f))
    first = tls.server_context()
    assert tls.server_context() is first and tls.generation == 1  # unchanged: no re-read
    new = ca.issue("n1-rotated")
    write_pem(f.cert, new.cert_pem)  # the certificate first: it does not match the old key
    with caplog.at_level(logging.WARNING, logger="accord.node.tls"):
        assert tls.server_context() is first
        assert tls.server_context() is first  # the same broken state is not retried or re-logged
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "does not match the certificate" in warnings[0]
    write_pem(f.key, new.key_pem, private=True)
    rotated = tls.server_context()
    assert rotated is not first and tls.generation == 2
    assert tls.loaded.subject == "CN=n1-rotated"
    assert tls.client_context() is not None and tls.generation == 2
