"""The contract every payload codec must honour (`ratchet.sealing.PayloadCodec`).

One suite, parametrised over the keys (`keys` below): a keyring file beside a store
(`RATCHET_PAYLOAD_KEY=local`, rotated by putting a new key first) and KMS envelopes on moto
(`kms:...`, rotated by naming another KMS key). Each backend can seal with its first key,
rotate to a second that still opens what the first sealed, and lose the first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from ratchet.adapters.payload_keys import KeyringCodec, KmsCodec, new_keyring_line, payload_codec
from ratchet.errors import PayloadKeyMissing, PayloadTampered
from ratchet.sealing import MAGIC, PayloadCodec, header_of

SECRET = b"card 4111 1111 1111 1111, for Ada Lovelace"
CONTEXT = b"ratchet:event:run-1"


@dataclass
class Keys:
    first: Callable[[], PayloadCodec]
    """A codec with the first key: what a run was started with."""
    rotated: Callable[[], PayloadCodec]
    """A codec that seals with a second key and still holds the first."""
    without_first: Callable[[], PayloadCodec]
    """A codec that has the second key only (the first removed, disabled or not allowed)."""


def _keyring(tmp_path: Path) -> Keys:
    store = tmp_path / "ratchet.db"
    ring = Path(f"{store}.payload-keys")
    newer = new_keyring_line()

    def rotated() -> PayloadCodec:
        ring.write_text(f"{newer}\n{ring.read_text()}")
        return KeyringCodec(ring, create=False)

    def without_first() -> PayloadCodec:
        ring.write_text(f"{newer}\n")
        return KeyringCodec(ring, create=False)

    def first() -> PayloadCodec:
        codec = payload_codec("local", beside=store)
        assert codec is not None
        return codec

    return Keys(first, rotated, without_first)


def _kms() -> Iterator[Keys]:
    with mock_aws():
        client = boto3.client("kms", region_name="eu-west-1")
        first_key = client.create_key(Description="ratchet payloads, 2026")["KeyMetadata"]
        client.create_alias(AliasName="alias/ratchet-payloads", TargetKeyId=first_key["KeyId"])
        second_key = client.create_key(Description="ratchet payloads, 2027")["KeyMetadata"]

        def without_first() -> PayloadCodec:
            # A reader whose KMS has no first key: in another region, where the first key's
            # ARN names nothing (moto decrypts with a disabled key, so disabling it is no test).
            elsewhere = boto3.client("kms", region_name="us-east-1")
            return KmsCodec(elsewhere, elsewhere.create_key()["KeyMetadata"]["Arn"])

        yield Keys(
            lambda: KmsCodec(client, "alias/ratchet-payloads"),
            lambda: KmsCodec(client, second_key["Arn"]),
            without_first,
        )


@pytest.fixture(params=["keyring", "kms"])
def keys(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Keys]:
    if request.param == "keyring":
        yield _keyring(tmp_path)
    else:
        yield from _kms()


def test_a_sealed_value_opens_to_what_was_sealed_and_shows_none_of_it(keys):
    codec = keys.first()

    sealed = codec.seal(SECRET, context=CONTEXT)

    assert codec.open(sealed, context=CONTEXT) == SECRET
    assert sealed.startswith(MAGIC)
    assert b"4111" not in sealed
    assert b"Lovelace" not in sealed
    # Sealed twice, two values: a nonce of its own each, so equal payloads do not look equal.
    assert codec.seal(SECRET, context=CONTEXT) != sealed


def test_a_sealed_value_names_its_key_in_clear(keys):
    codec = keys.first()

    key_id, _, _ = header_of(codec.seal(SECRET, context=CONTEXT))

    assert key_id == codec.key_id


def test_every_changed_byte_is_refused(keys):
    codec = keys.first()
    sealed = codec.seal(SECRET, context=CONTEXT)
    key_id, wrapped, header = header_of(sealed)

    # Every byte after the key id: the wrapped key (KMS's), the nonce, the ciphertext, the tag.
    for at in range(len(MAGIC) + 1 + len(key_id), len(sealed)):
        tampered = bytearray(sealed)
        tampered[at] ^= 0x01
        in_wrapped_key = header - len(wrapped) <= at < header
        # A changed data key is KMS's to refuse: as a bad ciphertext (InvalidCiphertext), or
        # as one of a key this reader may not use (moto, for a byte of its key id).
        refused = (PayloadTampered, PayloadKeyMissing) if in_wrapped_key else PayloadTampered
        with pytest.raises(refused):
            codec.open(bytes(tampered), context=CONTEXT)


def test_a_value_moved_to_another_context_is_refused(keys):
    codec = keys.first()
    sealed = codec.seal(SECRET, context=b"ratchet:event:run-1")

    with pytest.raises(PayloadTampered):
        codec.open(sealed, context=b"ratchet:event:run-2")


def test_a_value_cut_short_is_refused(keys):
    codec = keys.first()
    sealed = codec.seal(SECRET, context=CONTEXT)

    for length in (0, 3, len(MAGIC) + 2, len(sealed) - 1):
        with pytest.raises(PayloadTampered):
            codec.open(sealed[:length], context=CONTEXT)


def test_after_a_rotation_new_values_use_the_new_key_and_old_ones_still_open(keys):
    before = keys.first()
    old = before.seal(SECRET, context=CONTEXT)

    after = keys.rotated()
    new = after.seal(b"after the rotation", context=CONTEXT)

    assert after.key_id != before.key_id
    assert header_of(new)[0] == after.key_id
    assert after.open(old, context=CONTEXT) == SECRET
    assert after.open(new, context=CONTEXT) == b"after the rotation"


def test_a_value_whose_key_is_gone_is_one_error_naming_that_key(keys):
    first = keys.first()
    old = first.seal(SECRET, context=CONTEXT)
    old_key = header_of(old)[0]

    later = keys.without_first()

    with pytest.raises(PayloadKeyMissing) as refused:
        later.open(old, context=CONTEXT)
    assert refused.value.key_id == old_key
    assert old_key in str(refused.value)
    assert "\n" not in str(refused.value)


def test_an_address_is_a_keyed_hash_of_the_content(keys):
    codec = keys.first()

    address = codec.address(SECRET)

    assert address == codec.address(SECRET)
    assert len(address) == 64
    assert int(address, 16) >= 0
    assert address != hashlib.sha256(SECRET).hexdigest()
    assert address != codec.address(SECRET + b".")


def test_a_rotated_key_addresses_the_same_content_elsewhere(keys):
    before = keys.first().address(SECRET)

    assert keys.rotated().address(SECRET) != before


# --- where the backends differ on purpose -------------------------------------------------------


def test_a_keyring_is_made_owner_only_beside_the_store(tmp_path: Path):
    store = tmp_path / "ratchet.db"

    codec = payload_codec("local", beside=store)

    ring = Path(f"{store}.payload-keys")
    assert codec is not None
    assert ring.stat().st_mode & 0o777 == 0o600
    assert payload_codec("local", beside=store).key_id == codec.key_id  # type: ignore[union-attr]


def test_a_kms_data_key_is_asked_for_once_per_period_not_per_value(monkeypatch):
    with mock_aws():
        client = boto3.client("kms", region_name="eu-west-1")
        key = client.create_key()["KeyMetadata"]["Arn"]
        calls: list[str] = []
        generate = client.generate_data_key

        def counted(**kwargs: Any) -> Any:
            calls.append("GenerateDataKey")
            return generate(**kwargs)

        monkeypatch.setattr(client, "generate_data_key", counted)
        now = [0.0]
        codec = KmsCodec(client, key, clock=lambda: now[0])

        first = [codec.seal(SECRET, context=CONTEXT) for _ in range(50)]
        now[0] = 299.0
        codec.seal(SECRET, context=CONTEXT)
        assert calls == ["GenerateDataKey"]
        now[0] = 300.0
        later = codec.seal(SECRET, context=CONTEXT)

        assert calls == ["GenerateDataKey", "GenerateDataKey"]
        assert header_of(later)[1] != header_of(first[0])[1]  # another data key, wrapped
        assert all(codec.open(v, context=CONTEXT) == SECRET for v in (*first, later))
