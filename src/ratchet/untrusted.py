"""Text from outside Ratchet, made safe where it crosses a boundary.

- JSON that arrives as text (the CLI's `--input`, `--param` and `--answer`, a request body, a
  form field, a Slack payload) is bounded in length and nesting *before* it is parsed
  (`loads`), and JSON that arrives as a Python value (`Client.start(input=...)`, an answer)
  is bounded in nesting before anything walks it recursively (`check_depth`): Python's `json`,
  pydantic and `json.dumps` all recurse, so a value 60,000 levels deep would end in a
  RecursionError instead of a refusal naming the field.
- Text that goes to a terminal (a tool's output, a goal, an error, anything a store holds) is
  escaped (`for_terminal`): a control character or a bidirectional override would otherwise
  move the cursor, clear the screen, retitle the window or reorder what a person reads.

The quick read commands (`ratchet.cli.quick`) escape what they print here too, so nothing
loads at import: the terminal half works with `str.translate`, and `json` and `re` load when
the JSON half is first used (`json` loads `re` anyway).
"""

from __future__ import annotations

TYPE_CHECKING = False  # `typing` takes longer to load than a quick read takes to answer
if TYPE_CHECKING:
    import re
    from typing import Any

MAX_JSON_DEPTH = 64
"""The deepest nesting of arrays and objects taken from outside. Inputs and answers are flat
models; 64 leaves room for any honest document and stays far below Python's recursion limit."""
MAX_JSON_CHARS = 1024 * 1024
"""The longest JSON text taken from outside unless a boundary says less (a run's input is at
most 16 KB as compact JSON, its goal 64 KB)."""

# A string (to its end when unterminated: then it is not JSON, and `json` says so) or a bracket.
# Everything else is skipped by the regex engine, so a scan costs a Python step per bracket.
_TOKENS_PATTERN = r'"(?:[^"\\]|\\.)*"?|[\[\]{}]'
_tokens: re.Pattern[str] | None = None


def _json_tokens() -> re.Pattern[str]:
    global _tokens
    if _tokens is None:
        import re

        _tokens = re.compile(_TOKENS_PATTERN, re.DOTALL)
    return _tokens


def is_utf8(text: str) -> bool:
    """Whether `text` can be written as UTF-8. Python decodes bytes that are not UTF-8 (in
    `os.environ`, `sys.argv`) as lone surrogates, which no store, log line, HTTP header or
    terminal can take (nor can UTF-8: nothing else fails to encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(
    text: str, *, field: str, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH
) -> None:
    """Refuse JSON text longer than `max_chars` (`JsonTooLarge`) or nested deeper than
    `max_depth` (`JsonTooDeep`), without parsing it: brackets are counted outside strings.
    Either names `field`; with `field=""` (a request body) the error names the top-level key
    that holds the deep value, or `(body)`."""
    from ratchet.errors import JsonTooDeep, JsonTooLarge

    if len(text) > max_chars:
        raise JsonTooLarge(field or "(body)", f"over {max_chars:,} characters of JSON")
    depth = 0
    key = ""
    for match in _json_tokens().finditer(text):
        token = match.group()
        if token[0] == '"':
            if depth == 1:
                key = token  # the last string at the top level before a bracket is its key
            continue
        if token in "[{":
            depth += 1
            if depth > max_depth:
                raise JsonTooDeep(field or _key_name(text, key), _too_deep(max_depth))
        else:
            depth -= 1


def loads(
    text: str, *, field: str, max_chars: int = MAX_JSON_CHARS, max_depth: int = MAX_JSON_DEPTH
) -> Any:
    """`json.loads(text)` once `check_text` took it. Raises `JsonTooLarge` or `JsonTooDeep`
    (both `ValueError`s, like text that is not JSON)."""
    import json

    check_text(text, field=field, max_chars=max_chars, max_depth=max_depth)
    return json.loads(text)


def check_depth(value: Any, *, field: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a value whose dicts, lists and tuples nest deeper than `max_depth`
    (`JsonTooDeep`, naming `field`), walking it without recursion."""
    from ratchet.errors import JsonTooDeep

    pending: list[tuple[Any, int]] = [(value, 0)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        if depth + 1 > max_depth:
            raise JsonTooDeep(field, _too_deep(max_depth))
        pending.extend((child, depth + 1) for child in children)


def within_depth(value: Any) -> Any:
    """`value`, for a pydantic `BeforeValidator` on a field of free-form JSON: `ValueError`
    if it nests deeper than `MAX_JSON_DEPTH` (pydantic names the field)."""
    from ratchet.errors import JsonTooDeep

    try:
        check_depth(value, field="the value")
    except JsonTooDeep as deep:
        raise ValueError(deep.reason) from None
    return value


def _too_deep(max_depth: int) -> str:
    return f"nested more than {max_depth} levels deep"


def _key_name(text: str, key: str) -> str:
    if text.lstrip()[:1] != "{" or not key:
        return "(body)"
    import json

    try:
        name = json.loads(key)
    except ValueError:
        return "(body)"
    return name if isinstance(name, str) and name.isprintable() and len(name) <= 64 else "(body)"


# --- terminals ---------------------------------------------------------------------------------

_UNSAFE = [*range(0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0), *range(0x202A, 0x202F)]
_UNSAFE += range(0x2066, 0x206A)
"""C0 controls but tab and newline, DEL, C1 controls, and the bidirectional embeddings,
overrides and isolates."""


def _escaped(code: int) -> str:
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


_ESCAPES_IN_TEXT = {code: _escaped(code) for code in _UNSAFE}
_ESCAPES_ON_A_LINE = {**_ESCAPES_IN_TEXT, 0x09: "\\x09", 0x0A: "\\x0a"}
_ESCAPES_IN_JSON = {code: f"\\u{code:04x}" for code in _UNSAFE if code >= 0x7F}


def for_terminal(text: str, *, lines: bool = False) -> str:
    """`text` with every character that would act on a terminal instead of showing written as
    an escape (`\\x1b`, `\\u202e`), so it shows, harmlessly. Tab and newline are escaped too
    unless `lines` (text laid out over lines, where they only move to the next column or
    line). Every human-facing output of the CLI passes what it prints of stored or
    tool-given text through here."""
    if text.isprintable():  # every character escaped here is one Python does not print
        return text
    return text.translate(_ESCAPES_IN_TEXT if lines else _ESCAPES_ON_A_LINE)


def json_for_terminal(text: str) -> str:
    """JSON text (from `json.dumps`, which escapes C0 already) with DEL, C1 and bidirectional
    controls escaped as `\\uXXXX`: the same JSON value, nothing a terminal acts on."""
    return text if text.isprintable() else text.translate(_ESCAPES_IN_JSON)
