"""Optional shared-key authenticated encryption of membership packets (AES-GCM).

A sealed packet is ``b"\\xe5" + nonce (12 bytes) + ciphertext + tag (16 bytes)``: 29
bytes of overhead. The first key of the keyring seals; every key is tried to open, so a
cluster can rotate keys by adding the new key everywhere, then making it first, then
removing the old one. Anything that fails authentication is rejected with
``AuthError``; the caller drops it and counts it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["SEAL_OVERHEAD", "AuthError", "Keyring"]

_MARKER = b"\xe5"
_NONCE = 12
_TAG = 16
SEAL_OVERHEAD = len(_MARKER) + _NONCE + _TAG
_AAD = b"accord-membership-v1"


class AuthError(ValueError):
    """A packet that is not sealed with any key of the keyring."""


class Keyring:
    """AES-GCM with a primary key for sealing and any of the keys for opening."""

    __slots__ = ("_ciphers",)

    def __init__(self, keys: Sequence[bytes]) -> None:
        if not keys:
            raise ValueError("a keyring needs at least one key")
        for key in keys:
            if len(key) not in (16, 24, 32):
                raise ValueError(f"AES keys must be 16, 24 or 32 bytes, got {len(key)}")
        self._ciphers = [AESGCM(bytes(k)) for k in keys]

    def seal(self, plaintext: bytes) -> bytes:
        """Encrypt and authenticate ``plaintext`` with the primary key."""
        nonce = os.urandom(_NONCE)
        return _MARKER + nonce + self._ciphers[0].encrypt(nonce, plaintext, _AAD)

    def open(self, sealed: bytes) -> bytes:
        """Authenticate and decrypt; ``AuthError`` if no key opens it."""
        if len(sealed) < SEAL_OVERHEAD or sealed[:1] != _MARKER:
            raise AuthError("packet is not sealed")
        nonce = sealed[1 : 1 + _NONCE]
        body = sealed[1 + _NONCE :]
        for cipher in self._ciphers:
            try:
                return cipher.decrypt(nonce, body, _AAD)
            except InvalidTag:
                continue
        raise AuthError("packet failed authentication with every key")
