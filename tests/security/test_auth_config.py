"""The auth flags: etcd's ``--auth-token`` syntax, ``--auth-token-ttl``, ``--bcrypt-cost``;
bad values are refused with a message naming the flag, and the token providers behave."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from accord.node.config import ConfigError, load_config
from accord.services.auth.tokens import (
    JWTTokens,
    SimpleTokens,
    check_password,
    hash_password,
    parse_duration,
    parse_token_spec,
)


@pytest.mark.parametrize(("flags", "why"), [
    (["--auth-token", "opaque"], "auth-token: .*'simple' or 'jwt"),
    (["--auth-token", "jwt,sign-method=RS256,color=blue"], "bad --auth-token jwt option"),
    (["--auth-token", "jwt,pub-key=/nonexistent.pub,sign-method=RS256"], "auth-token: "),
    (["--auth-token", "jwt,priv-key=k"], "needs sign-method"),
    (["--auth-token", "jwt,sign-method=RS256,ttl=5 minutes"], "bad duration"),
    (["--auth-token-ttl", "0"], "auth-token-ttl 0 s: must be > 0"),
    (["--bcrypt-cost", "3"], "bcrypt-cost 3: must be 4..31"),
])
def test_bad_auth_flags_are_refused(flags: list[str], why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        load_config(["--name", "n1", *flags], environ={})


def test_jwt_flags_with_real_keys(tmp_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    priv = tmp_path / "k.pem"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    cfg = load_config(["--name", "n1", "--auth-token",
                       f"jwt,priv-key={priv},sign-method=ES256,ttl=1m30s"], environ={})
    jwt = parse_token_spec(cfg.auth_token).jwt()  # the public key is derived from priv-key
    assert jwt.ttl_s == 90
    info = jwt.info(jwt.issue("alice", 7))
    assert info is not None and (info.user, info.revision) == ("alice", 7)
    verifier = JWTTokens("ES256", priv_key=None, pub_key=key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    assert not verifier.can_sign and verifier.info(jwt.issue("bob", 1)) is not None
    other = JWTTokens("HS256", priv_key=b"another-secret", pub_key=None)
    assert other.info(jwt.issue("bob", 1)) is None


def test_durations_and_passwords() -> None:
    assert parse_duration("300s") == 300 and parse_duration("1h") == 3600
    assert parse_duration("250ms") == 0.25
    h = hash_password("pw", 4)
    assert check_password("pw", h) and not check_password("pW", h)
    assert not check_password("", b"")  # a no-password user never authenticates


def test_simple_tokens_live_ttl_after_last_use() -> None:
    now = [0.0]
    tokens = SimpleTokens(ttl_s=10, clock=lambda: now[0])
    tokens.assign("a.1", "alice")
    tokens.assign("b.2", "bob", age_s=11)  # issued long ago (a replayed entry): dead
    now[0] = 9.0
    assert tokens.user_of("a.1") == "alice" and tokens.user_of("b.2") is None
    now[0] = 18.0  # 9 s after its last use
    assert tokens.user_of("a.1") == "alice"
    now[0] = 28.5
    assert tokens.user_of("a.1") is None
    tokens.assign("c.3", "carol")
    tokens.invalidate_user("carol")
    assert tokens.user_of("c.3") is None
