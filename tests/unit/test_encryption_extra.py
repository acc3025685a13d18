"""The payload codec's AES-GCM comes from the `encryption` extra: a process that sets
`RATCHET_PAYLOAD_KEY` without the `cryptography` package is told, in one line, which extra to
install, before a value is sealed or opened."""

from __future__ import annotations

import importlib.util

import pytest

from ratchet.adapters import payload_keys
from ratchet.errors import InvalidInput


@pytest.mark.parametrize("setting", ["local", "file:/tmp/keys", "kms:alias/ratchet"])
def test_the_codec_without_its_package_names_the_extra(tmp_path, monkeypatch, setting):
    found = importlib.util.find_spec

    def without_cryptography(name: str, *args: object) -> object:
        return None if name == "cryptography" else found(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", without_cryptography)

    with pytest.raises(InvalidInput) as refused:
        payload_keys.payload_codec(setting, beside=tmp_path / "ratchet", kms=lambda: None)

    assert str(refused.value) == (
        "RATCHET_PAYLOAD_KEY needs the encryption extra: pip install 'ratchet-agents[encryption]'"
    )
    assert not (tmp_path / "ratchet.payload-keys").exists()


def test_the_codec_with_its_package_is_made(tmp_path):
    codec = payload_keys.payload_codec("local", beside=tmp_path / "ratchet")

    assert codec is not None
    assert codec.open(codec.seal(b"x", context=b"c"), context=b"c") == b"x"
