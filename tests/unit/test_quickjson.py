"""`ratchet.quickjson` reads and writes JSON as `json` does, and the other stand-ins the quick
read path uses for modules it does not load (`re` in `ratchet.untrusted`, `fnmatch` in
`ratchet.pricing`) answer as those modules do."""

from __future__ import annotations

import fnmatch
import json
import math
import random
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from ratchet import pricing, quickjson, untrusted


class _Str(str):
    pass


class _Float(float):
    pass


CORPUS: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    10**40,
    -(10**40),
    1.5,
    -0.0,
    1e300,
    1e-300,
    0.1 + 0.2,
    float("nan"),
    float("inf"),
    float("-inf"),
    _Float(2.5),
    True + 1,
    "",
    "plain",
    "é and 日本語 and 🙂",
    'quote " backslash \\ slash /',
    "".join(map(chr, range(0x20))),
    "\x7f\x85\x9f\u2028\u2029\u202e\u2066\ufeff",
    "\ud800 lone surrogate",
    _Str("a str subclass"),
    [],
    {},
    [1, [2, [3, [4, {}]]]],
    {"a": 1, "b": [None, 1.25, "x"], "nested": {"é": {"\x1b[2J": "\u202e"}}},
    {1: "int key", 2.5: "float key", False: "bool key", None: "null key"},
    (1, 2, 3),
    {"run_id": "r1", "usage": {"calls": 3, "cached_share": 0.3333}, "cost_usd": None},
]
OPTIONS: list[dict[str, Any]] = [
    {},
    {"ensure_ascii": False},
    {"default": str, "ensure_ascii": False},
    {"ensure_ascii": False, "separators": (", ", ": "), "default": str},
    {"ensure_ascii": False, "default": str, "separators": (",", ":")},
]


@pytest.mark.parametrize("options", OPTIONS)
@pytest.mark.parametrize("value", CORPUS, ids=lambda v: type(v).__name__)
def test_dumps_writes_what_json_dumps_writes(value, options):
    assert quickjson.dumps(value, **options) == json.dumps(value, **options)


def test_dumps_calls_default_for_what_json_has_no_type_for_and_refuses_it_without():
    moment = datetime(2026, 12, 3, 1, 0, tzinfo=UTC)
    value = {"at": moment, "sets": {1}}

    assert quickjson.dumps(value, default=str) == json.dumps(value, default=str)
    with pytest.raises(TypeError) as theirs:
        json.dumps(value)
    with pytest.raises(TypeError) as ours:
        quickjson.dumps(value)
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value) == "Object of type datetime is not JSON serializable"


def test_dumps_refuses_a_circular_value_as_json_does():
    looped: list[Any] = []
    looped.append(looped)

    with pytest.raises(ValueError, match="Circular reference detected"):
        quickjson.dumps(looped)


@pytest.mark.parametrize("value", CORPUS, ids=lambda v: type(v).__name__)
def test_loads_reads_back_what_json_reads(value):
    text = json.dumps(value, default=str)

    ours, theirs = quickjson.loads(text), json.loads(text)

    assert _same(ours, theirs)


@pytest.mark.parametrize(
    "text",
    [
        ' \t\n\r{"a": [1, 2]}\r\n\t ',
        "12345678901234567890123456789",
        "1E400",
        "-0",
        "[NaN, Infinity, -Infinity]",
        '"\\u00e9\\ud83d\\ude42\\ud800"',
        '{"a": 1, "a": 2}',
    ],
)
def test_loads_reads_edge_cases_as_json_does(text):
    assert _same(quickjson.loads(text), json.loads(text))
    assert _same(quickjson.loads(text.encode()), json.loads(text.encode()))


@pytest.mark.parametrize(
    "text",
    ["", "   ", "1 2", "{", "[1,]", "nan", "'a'", '"a\nb"', "\ufeff1", "{} x", '{"a" 1}', "01"],
)
def test_loads_refuses_what_json_refuses_with_its_error_and_message(text):
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as ours:
        quickjson.loads(text)

    assert (str(ours.value), ours.value.pos) == (str(theirs.value), theirs.value.pos)


def _same(ours: Any, theirs: Any) -> bool:
    """Equal, type for type, NaN equal to NaN."""
    if type(ours) is not type(theirs):
        return False
    if isinstance(ours, float) and math.isnan(ours):
        return math.isnan(theirs)
    if isinstance(ours, list):
        return len(ours) == len(theirs) and all(map(_same, ours, theirs))
    if isinstance(ours, dict):
        return list(ours) == list(theirs) and all(_same(ours[k], theirs[k]) for k in ours)
    return bool(ours == theirs)


# --- the terminal escapes, against the regular expressions they replace --------------------------

_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069"
_ON_A_LINE = re.compile(f"[\t\n{_UNSAFE}]")
_IN_TEXT = re.compile(f"[{_UNSAFE}]")
_IN_JSON = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def _texts() -> list[str]:
    every = [chr(c) for c in [*range(0x250), *range(0x2000, 0x2070), 0x3000, 0xFEFF, 0x1F642]]
    chosen = random.Random(11)
    return ["", "plain", *every, *("".join(chosen.choices(every, k=40)) for _ in range(300))]


def test_for_terminal_escapes_what_the_regular_expressions_escaped():
    for text in _texts():
        assert untrusted.for_terminal(text) == _ON_A_LINE.sub(_escape, text), repr(text)
        assert untrusted.for_terminal(text, lines=True) == _IN_TEXT.sub(_escape, text)
        wanted = _IN_JSON.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
        assert untrusted.json_for_terminal(text) == wanted


def test_is_utf8_refuses_exactly_the_lone_surrogates():
    for text in ["", "é🙂", "a\ud800", "\udfff", "\U0010ffff", "\ud83d\ude42"]:
        assert untrusted.is_utf8(text) is (re.search("[\ud800-\udfff]", text) is None)


# --- the price table's globs, against fnmatch ------------------------------------------------

NAMES = [
    "",
    "claude-sonnet-4-5",
    "bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0",
    "claude-opus-4-1-20250805",
    "my_models:small",
    "aaa",
    "a*b",
    "line\nbreak",
]
PATTERNS = [
    *pricing.BUILT_IN,
    "",
    "*",
    "**",
    "claude-sonnet-4-5",
    "claude*",
    "*4-5",
    "a*a*a",
    "aa*aa",
    "*a*a*",
    "my_models:*",
    "*\n*",
    "claude-?onnet*",
    "claude-[so]*",
    "[!c]*",
]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_price_pattern_matches_what_fnmatch_matches(pattern):
    for name in NAMES:
        assert pricing.matches(name, pattern) is fnmatch.fnmatchcase(name, pattern), name
