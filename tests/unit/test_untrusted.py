"""Text from outside, bounded and escaped where it arrives (`ratchet.untrusted`, issue 22):
JSON is refused before it is parsed when it nests too deep or runs too long, naming the field;
what goes to a terminal has every control character escaped."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from ratchet.approvals.answers import answer_from_form, answer_schema
from ratchet.errors import AnswerInvalid, JsonTooDeep, JsonTooLarge
from ratchet.untrusted import (
    MAX_JSON_DEPTH,
    check_depth,
    check_text,
    for_terminal,
    json_for_terminal,
    loads,
)
from ratchet.waits import Verdict

HOSTILE = "\x1b[2J\x1b]0;pwned\x07 \u202eevil\u202c \x9b31m \x7f"
ACTING = ("\x1b", "\x07", "\u202e", "\u202c", "\x9b", "\x7f")


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# --- JSON ----------------------------------------------------------------------------------------


def test_nesting_up_to_the_bound_parses_and_one_level_more_is_refused_naming_the_field():
    deepest = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH

    assert loads(deepest, field="--input") == json.loads(deepest)
    with pytest.raises(JsonTooDeep) as refused:
        loads("[" + deepest + "]", field="--input")

    assert str(refused.value) == f"--input is nested more than {MAX_JSON_DEPTH} levels deep"


def test_sixty_thousand_levels_are_refused_before_json_recurses():
    with pytest.raises(JsonTooDeep):
        loads('{"batches": ' + "[" * 60_000 + "]" * 60_000 + "}", field="--input")


ESCAPED_QUOTE_BOMB = '{"a": "\\"", "b": ' + "[" * 20_000 + "]" * 20_000 + "}"
"""`{"a": "\\"", "b": [[[...]]]}`: a string holding an escaped quote, then a value 20,000 levels
deep. The escaped quote does not end the string: a scan that took it for the end would read
the rest as strings and let the deep value through to `json`."""


def test_an_escaped_quote_does_not_end_a_string_for_the_depth_scan():
    with pytest.raises(JsonTooDeep) as refused:
        loads(ESCAPED_QUOTE_BOMB, field="")

    assert refused.value.field == "b"
    assert str(refused.value) == f"b is nested more than {MAX_JSON_DEPTH} levels deep"


def test_brackets_inside_strings_are_not_nesting():
    text = json.dumps({"text": "[{" * 1000 + '\\"[' * 100, "more": ["]]]}}}"]})

    assert loads(text, field="x") == json.loads(text)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"goal": "g", "input": {"a": ' + "[" * 100 + "]" * 100 + "}}", "input"),
        ('{"goal": "[[[[", "notify": ' + "{" * 100, "notify"),
        ("[" * 100, "(body)"),
        ('{"\\u001b": ' + "[" * 100, "(body)"),
    ],
)
def test_a_body_names_the_top_level_field_that_holds_the_deep_value(body: str, field: str):
    with pytest.raises(JsonTooDeep) as refused:
        check_text(body, field="")

    assert refused.value.field == field


def test_text_over_its_bound_is_refused_before_it_is_scanned():
    with pytest.raises(JsonTooLarge) as refused:
        check_text("[1]" * 100, field="--answer", max_chars=299)

    assert str(refused.value) == "--answer is over 299 characters of JSON"


def test_a_python_value_is_walked_without_recursion():
    check_depth({"a": _nested(MAX_JSON_DEPTH - 1)}, field="input")

    with pytest.raises(JsonTooDeep):
        check_depth({"a": _nested(MAX_JSON_DEPTH)}, field="input")
    with pytest.raises(JsonTooDeep):
        check_depth(_nested(60_000), field="input")


def test_an_answer_nested_too_deep_is_refused_by_the_verdict_naming_it():
    with pytest.raises(ValidationError) as refused:
        Verdict(approved=True, by="dana", answer={"amount": _nested(60_000)})

    (problem,) = refused.value.errors()
    assert problem["loc"] == ("answer",)
    assert "nested more than 64 levels deep" in problem["msg"]


class Tagged(BaseModel):
    tags: list[str]


def test_a_json_field_of_the_page_form_nested_too_deep_is_refused_naming_it():
    form = {"answer.tags": ["[" * 5_000 + "]" * 5_000]}

    with pytest.raises(AnswerInvalid) as refused:
        answer_from_form(answer_schema(Tagged), form)

    assert str(refused.value) == "tags: nested more than 64 levels deep"


# --- terminals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain, with é and 漢字", "plain, with é and 漢字"),
        ("\x1b[2J", "\\x1b[2J"),
        ("bell\x07", "bell\\x07"),
        ("a\tb\nc\rd", "a\\x09b\\x0ac\\x0dd"),
        ("\x7f\x85\x9b", "\\x7f\\x85\\x9b"),
        (
            "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
            "".join(f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))),
        ),
    ],
)
def test_for_terminal_escapes_what_a_terminal_acts_on(text, shown):
    assert for_terminal(text) == shown


def test_laid_out_text_keeps_its_tabs_and_newlines():
    assert for_terminal("a\tb\nc\rd\x1b", lines=True) == "a\tb\nc\\x0dd\\x1b"


def test_json_for_terminal_is_the_same_json_value():
    value = {"text": HOSTILE + " é"}
    dumped = json.dumps(value, ensure_ascii=False)

    safe = json_for_terminal(dumped)

    assert json.loads(safe) == value
    assert not any(acting in safe for acting in ACTING)
    assert "é" in safe
