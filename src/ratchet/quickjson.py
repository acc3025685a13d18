"""`json.loads` and `json.dumps` as the `json` package does them, without loading it.

`import json` loads `re` (and with it `enum`, `functools` and `collections`), which takes longer
than a quick read command (`ratchet.cli.quick`) takes to answer. The work itself is done by
`json`'s C accelerator, `_json`, in both: `json.loads` scans with `_json.make_scanner` and
`json.dumps` (without `indent`) encodes with `_json.make_encoder`. This module calls them with
what `json.JSONDecoder` and `json.JSONEncoder` hand them, so its text and values are `json`'s
(tests/unit/test_quickjson.py holds them equal on a corpus). An error is `json`'s own
`JSONDecodeError` (a `ValueError`), with `json`'s message: only then does `json` load
(tests/integration/test_quick_reads.py holds the errors equal in a process without `json`).
"""

from __future__ import annotations

import _json

TYPE_CHECKING = False  # `typing` takes longer to load than a quick read takes to answer
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

_WHITESPACE = " \t\n\r"
"""What `json.decoder.WHITESPACE` skips around a document."""
_CONSTANTS = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}


class _Decoding:
    """What `_json.make_scanner` reads off a `json.JSONDecoder()` (all its defaults)."""

    def __init__(self) -> None:
        self.strict = True
        self.object_hook = None
        self.object_pairs_hook = None
        self.parse_float = float
        self.parse_int = int
        self.parse_constant = _CONSTANTS.__getitem__
        self.memo: dict[str, str] = {}


_decoding: Any = _Decoding()  # typeshed has the scanner take a scanner: it takes any such object
_scan = _json.make_scanner(_decoding)


def loads(text: str | bytes | bytearray) -> Any:
    """`json.loads(text)`."""
    if not isinstance(text, str):
        import json  # bytes: `json` detects their encoding

        return json.loads(text)
    if text.startswith("\ufeff"):
        _fail("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
    start = len(text) - len(text.lstrip(_WHITESPACE))
    try:
        value, end = _scan(text, start)
    except StopIteration as stop:
        _fail("Expecting value", text, stop.value)
    except SystemError:
        # Python 3.11's scanner raises its other errors (a name not quoted, text cut short)
        # as `json.decoder.JSONDecodeError`, which it looks for in `sys.modules` and does not
        # import: before `json` is loaded it finds none and fails without an error, which
        # Python reports as a SystemError. `json` reads the text again and raises its own.
        import json

        return json.loads(text)
    rest = text[end:]
    end += len(rest) - len(rest.lstrip(_WHITESPACE))
    if end != len(text):
        _fail("Extra data", text, end)
    return value


def _fail(message: str, text: str, position: int) -> None:
    from json import JSONDecodeError

    raise JSONDecodeError(message, text, position)


def dumps(
    value: Any,
    *,
    ensure_ascii: bool = True,
    separators: tuple[str, str] | None = None,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """`json.dumps(value, ensure_ascii=..., separators=..., default=...)`, its other
    arguments at their defaults (circular references checked, NaN and infinities allowed)."""
    item_separator, key_separator = separators or (", ", ": ")
    string = _json.encode_basestring_ascii if ensure_ascii else _json.encode_basestring
    if isinstance(value, str):
        return str(string(value))
    encode = _json.make_encoder(
        {},  # markers: circular references are checked
        default or _unserializable,
        string,
        None,  # indent
        key_separator,
        item_separator,
        False,  # sort_keys
        False,  # skipkeys
        True,  # allow_nan
    )
    return "".join(encode(value, 0))


def _unserializable(value: Any) -> Any:
    """`json.JSONEncoder.default`: refuses what JSON has no type for."""
    raise TypeError(f"Object of type {value.__class__.__name__} is not JSON serializable")
