"""The certificate maker: what it issues verifies against its CA, carries the hosts, and
is accepted by the TLS stacks accord uses."""

from __future__ import annotations

import datetime
import ipaddress
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from accord.node.certs import CertificateAuthority, make_cluster_pki


def test_issued_certificate_is_signed_by_its_ca_and_names_its_hosts() -> None:
    ca = CertificateAuthority.create("test CA")
    leaf = ca.issue("n1", hosts=("127.0.0.1", "node-1.example")).certificate
    leaf.verify_directly_issued_by(ca.cert)
    assert leaf.subject.get_attributes_for_oid(x509.NameOID.COMMON_NAME)[0].value == "n1"
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("127.0.0.1")]
    assert san.get_values_for_type(x509.DNSName) == ["node-1.example"]
    usages = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}


def test_a_certificate_of_another_ca_does_not_verify() -> None:
    ours, theirs = CertificateAuthority.create("ours"), CertificateAuthority.create("theirs")
    with pytest.raises((ValueError, TypeError)):
        theirs.issue("intruder").certificate.verify_directly_issued_by(ours.cert)


def test_client_only_certificate_and_explicit_validity() -> None:
    ca = CertificateAuthority.create()
    start = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    end = datetime.datetime(2020, 1, 2, tzinfo=datetime.UTC)
    leaf = ca.issue("alice", hosts=(), server=False, not_before=start, not_after=end).certificate
    assert leaf.not_valid_after_utc == end and leaf.not_valid_before_utc == start
    assert list(leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.CLIENT_AUTH]
    with pytest.raises(x509.ExtensionNotFound):
        leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    with pytest.raises(ValueError, match="server, a client or both"):
        ca.issue("nobody", server=False, client=False)


def test_cluster_pki_writes_every_file_with_private_keys_closed(tmp_path: Path) -> None:
    ca, files = make_cluster_pki(tmp_path, ["n1", "n2"], client_name="root")
    assert set(files) == {"n1", "n2", "root"}
    assert (tmp_path / "ca.crt").read_bytes() == ca.cert_pem
    for f in files.values():
        assert f.ca == tmp_path / "ca.crt"
        x509.load_pem_x509_certificate(f.cert.read_bytes()).verify_directly_issued_by(ca.cert)
        assert stat.S_IMODE(f.key.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "ca.key").stat().st_mode) == 0o600
    assert not list(tmp_path.glob("*.tmp"))
