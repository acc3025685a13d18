"""What every `RunData` backend checks before it writes or reads: the limits of the port."""

from __future__ import annotations

from typing import Any

from ratchet.errors import InvalidInput
from ratchet.ports import MAX_DATA_KEY_CHARS, MAX_DATA_VALUE_BYTES

MAX_DATA_KEY_BYTES = 1024
"""A key's UTF-8 bytes at most: what a DynamoDB sort key holds. Checked on every backend, so a
key one runtime keeps is never refused by the other (512 four-byte characters would not fit)."""


def checked_key(key: Any) -> str:
    """`key` if it can name a value of a run's data; `InvalidInput` otherwise."""
    if not isinstance(key, str) or not 1 <= len(key) <= MAX_DATA_KEY_CHARS:
        raise InvalidInput(
            f"a run data key is text of 1 to {MAX_DATA_KEY_CHARS} characters, not {_shown(key)}"
        )
    if _utf8_size(key, "key") > MAX_DATA_KEY_BYTES:
        raise InvalidInput(f"a run data key is at most {MAX_DATA_KEY_BYTES} bytes of UTF-8")
    return key


def checked_prefix(prefix: Any) -> str:
    """`prefix` if keys can start with it (the empty prefix lists every key)."""
    if prefix == "":
        return ""
    return checked_key(prefix)


def checked_value(value: Any) -> str:
    """`value` if a run's data can keep it; `InvalidInput` otherwise."""
    if not isinstance(value, str):
        raise InvalidInput(
            f"a run data value is text (json.dumps anything else), not {type(value).__name__}"
        )
    size = _utf8_size(value, "value")
    if size > MAX_DATA_VALUE_BYTES:
        raise InvalidInput(
            f"a run data value is at most {MAX_DATA_VALUE_BYTES:,} bytes of UTF-8, not {size:,}"
        )
    return value


def _utf8_size(text: str, what: str) -> int:
    try:
        return len(text.encode("utf-8"))
    except UnicodeEncodeError:
        # Lone surrogates: neither SQLite nor DynamoDB can keep them.
        raise InvalidInput(f"a run data {what} is not valid Unicode text") from None


def _shown(key: Any) -> str:
    if isinstance(key, str):
        return f"{len(key)} characters"
    return type(key).__name__
