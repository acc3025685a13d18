"""Payloads sealed before they are stored: the codec's port and the layout of a sealed value.

A sealed value is AES-256-GCM over the plaintext, with a header in clear that every reader can
parse without a key:

    MAGIC (4 B) | key id length (1 B) | key id | wrapped key length (2 B) | wrapped key
    | nonce (12 B) | ciphertext and tag (16 B)

The key id names the key that sealed it (`local:<16 hex>` for a key file's key, the KMS key's
ARN for an envelope), so a reader without it says which key it needs (`PayloadKeyMissing`)
instead of failing on garbage. The wrapped key is the data key encrypted by KMS (empty for a
key file's key). The header and the caller's `context` (what the value is and whose: a run's
head, a record, a blob's address) are authenticated with the ciphertext: a value changed by
one bit, or moved to another run or another blob's name, is refused (`PayloadTampered`).

`ratchet.adapters.payload_keys` holds the implementations (a keyring file, KMS envelopes);
`ratchet.stored` and the blob stores seal what a run's records carry about the world.
"""

from __future__ import annotations

import os
import struct
from typing import Protocol

from ratchet.errors import InvalidInput, PayloadTampered

MAGIC = b"RTS\x01"
"""The first bytes of a sealed value (Ratchet sealed, format 1)."""
KEY_BYTES = 32
"""AES-256."""
NONCE_BYTES = 12
"""GCM's 96-bit nonce, random per value: under one key, 2^32 values keep the chance of a
repeated nonce below 2^-32 (NIST SP 800-38D); a data key of KMS seals far fewer."""
TAG_BYTES = 16
MAX_KEY_ID_BYTES = 255
SETTING = "RATCHET_PAYLOAD_KEY"


class PayloadCodec(Protocol):
    """Seals what is stored and opens what was: authenticated encryption with the key id in
    each value. `open` raises `PayloadKeyMissing` (naming the key id) for a value sealed with a
    key it does not have, and `PayloadTampered` for one that fails its authentication."""

    @property
    def key_id(self) -> str:
        """The key new values are sealed with (the newest, after a rotation)."""
        ...

    def seal(self, plaintext: bytes, *, context: bytes) -> bytes: ...

    def open(self, sealed: bytes, *, context: bytes) -> bytes: ...

    def address(self, data: bytes) -> str:
        """A keyed hash of `data` (64 hex, HMAC-SHA256 under a key derived from the codec's):
        what a blob is stored under, so equal outputs of two runs are not seen to be equal
        by anyone without the key."""
        ...


def is_sealed(value: bytes) -> bool:
    return value.startswith(MAGIC)


def header_of(sealed: bytes) -> tuple[str, bytes, int]:
    """The key id, the wrapped key and the header's length of a sealed value; `PayloadTampered`
    for bytes that do not hold a whole header."""
    try:
        if not is_sealed(sealed):
            raise ValueError("no marker")
        at = len(MAGIC)
        kid_length = sealed[at]
        key_id = sealed[at + 1 : at + 1 + kid_length].decode("ascii")
        at += 1 + kid_length
        (wrapped_length,) = struct.unpack_from(">H", sealed, at)
        at += 2
        wrapped = sealed[at : at + wrapped_length]
        at += wrapped_length
        if len(key_id) != kid_length or len(wrapped) != wrapped_length:
            raise ValueError("cut short")
        if len(sealed) < at + NONCE_BYTES + TAG_BYTES:
            raise ValueError("cut short")
    except (ValueError, IndexError, struct.error, UnicodeDecodeError):
        raise PayloadTampered("?", "a sealed value with no whole header") from None
    return key_id, wrapped, at


def seal_with(
    key: bytes, key_id: str, plaintext: bytes, *, context: bytes, wrapped: bytes = b""
) -> bytes:
    """`plaintext` sealed under `key`, its header naming `key_id` (and holding `wrapped`)."""
    # Loaded when first sealing, not with the settings that name the codec: a read command
    # on a store with no codec never pays for it.
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    kid = key_id.encode("ascii")
    if len(kid) > MAX_KEY_ID_BYTES:
        raise InvalidInput(f"a payload key id is at most {MAX_KEY_ID_BYTES} bytes: {key_id!r}")
    header = MAGIC + bytes([len(kid)]) + kid + struct.pack(">H", len(wrapped)) + wrapped
    nonce = os.urandom(NONCE_BYTES)
    return header + nonce + AESGCM(key).encrypt(nonce, plaintext, header + context)


def open_with(key: bytes, sealed: bytes, *, context: bytes) -> bytes:
    """The plaintext of a value `seal_with` sealed under `key` with this `context`."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    key_id, _, at = header_of(sealed)
    nonce = sealed[at : at + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, sealed[at + NONCE_BYTES :], sealed[:at] + context)
    except InvalidTag:
        raise PayloadTampered(key_id, "a stored payload") from None


def check_setting(value: str) -> str:
    """`RATCHET_PAYLOAD_KEY` as given, if it is one of its forms; `ValueError` in one line."""
    kind, _, rest = value.partition(":")
    if value == "local" or (kind in {"file", "kms"} and rest.strip()):
        return value
    raise ValueError(f"{value!r} is none of 'local', 'file:PATH' or 'kms:<key ARN or alias>'")
