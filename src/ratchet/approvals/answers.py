"""Structured answers: a request that asks a person for a value, not only yes or no.

`ask_person(..., answer=Model)` keeps the model's JSON schema in the request (the class itself
cannot be stored, and the page, the Slack handler or the decide function may run where it was
never imported). Everything here works from that schema, for the subset pydantic writes for a
flat model: text, whole numbers and numbers (with bounds), booleans, and choices (`Literal`,
`Enum`), each possibly optional. Any other field is given as JSON and checked for its type
only. Every channel (the page's form, once typed, the CLI's `--answer`, the runs API, the
Python client) goes through `checked_verdict`, once per decision, on the desk's path, so
an answer is refused the same way everywhere, naming the field.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from ratchet.errors import AnswerInvalid, ApprovalClosed, JsonOverLimit
from ratchet.state import AnyWait, ApprovalRequest, EventWait, RunState, TimerWait
from ratchet.untrusted import loads
from ratchet.waits import Verdict

MAX_ANSWER_SCHEMA_BYTES = 8 * 1024
"""An answer's schema is kept in the waiting run's head and shown on every page: bounded."""
MAX_ANSWER_BYTES = 4 * 1024
"""A given answer, as JSON: it becomes the asking step's result."""
MAX_ANSWER_FIELDS = 32
MAX_ANSWER_TEXT_CHARS = 64 * 1024
"""An answer given as JSON text, whitespace and escapes included, before it is parsed."""
FORM_PREFIX = "answer."
"""The page's form names each field `answer.<name>`, apart from `decision` and `comment`."""

FieldKind = Literal["string", "integer", "number", "boolean", "choice", "json"]
_SIMPLE_KINDS: dict[str, FieldKind] = {
    "string": "string",
    "integer": "integer",
    "number": "number",
    "boolean": "boolean",
}
_NULL = {"type": "null"}


@dataclass(frozen=True)
class AnswerField:
    """One field of an answer, as the page shows it and the checks read it."""

    name: str
    kind: FieldKind
    title: str
    required: bool
    schema: Mapping[str, Any]
    """The field's own schema, references resolved."""
    nullable: bool = False
    description: str = ""
    has_default: bool = False
    default: Any = None
    choices: tuple[Any, ...] = ()

    @property
    def hint(self) -> str:
        """`a whole number from 1 to 500`, `one of "damaged", "late"`, ..."""
        s = self.schema
        if self.kind == "choice":
            return "one of " + ", ".join(json.dumps(c, ensure_ascii=False) for c in self.choices)
        if self.kind in ("integer", "number"):
            noun = "a whole number" if self.kind == "integer" else "a number"
            low, high = s.get("minimum"), s.get("maximum")
            if low is not None and high is not None:
                return f"{noun} from {_number(low)} to {_number(high)}"
            # An exclusive bound is said as `_check_bounds` refuses a value past it.
            bounds = [
                f"{words} {_number(s[key])}"
                for key, words in (
                    ("minimum", "at least"),
                    ("exclusiveMinimum", "more than"),
                    ("maximum", "at most"),
                    ("exclusiveMaximum", "less than"),
                )
                if key in s
            ]
            return ", ".join([noun, *bounds])
        return {"string": "text", "boolean": "true or false"}.get(self.kind, "JSON")

    @property
    def example(self) -> str:
        """The field's value in an example answer: `N` for a number, the first choice, ..."""
        if self.kind == "choice" and self.choices:
            return json.dumps(self.choices[0], ensure_ascii=False)
        return {"integer": "N", "number": "N", "string": '"TEXT"', "boolean": "true"}.get(
            self.kind, "JSON"
        )


def _number(value: Any) -> Any:
    """A bound as a person writes it: 10000, not the schema's 10000.0."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def answer_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON schema `ask_person` keeps for `model`: refused (`ValueError`, `TypeError`) if
    it is not a pydantic model of named fields, or over `MAX_ANSWER_SCHEMA_BYTES`."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"answer must be a pydantic model class, not {model!r}")
    schema = model.model_json_schema()
    size = len(json.dumps(schema, ensure_ascii=False).encode("utf-8"))
    if size > MAX_ANSWER_SCHEMA_BYTES:
        raise ValueError(
            f"the answer model {model.__name__}'s schema is {size:,} bytes, over the "
            f"{MAX_ANSWER_SCHEMA_BYTES:,}-byte limit: ask for fewer or simpler fields"
        )
    answer_fields(schema)
    return schema


def answer_fields(schema: Mapping[str, Any]) -> list[AnswerField]:
    """The fields of an answer schema, in the model's order. `ValueError` if the schema is
    not an object of named fields."""
    properties = schema.get("properties")
    if schema.get("type") != "object" or not isinstance(properties, dict) or not properties:
        raise ValueError("an answer must be a model with at least one field")
    if len(properties) > MAX_ANSWER_FIELDS:
        raise ValueError(f"an answer may have at most {MAX_ANSWER_FIELDS} fields")
    required = set(schema.get("required") or [])
    definitions = schema.get("$defs") or {}
    return [
        _field(str(name), raw, name in required, definitions) for name, raw in properties.items()
    ]


def _field(name: str, raw: Any, required: bool, definitions: Mapping[str, Any]) -> AnswerField:
    own: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    title = str(own.get("title") or name.replace("_", " ").capitalize())
    nullable = False
    options = own.get("anyOf")
    if isinstance(options, list) and _NULL in options:
        rest = [o for o in options if o != _NULL]
        if len(rest) == 1 and isinstance(rest[0], Mapping):
            nullable = True
            own = {
                **_resolved(rest[0], definitions),
                **{k: v for k, v in own.items() if k != "anyOf"},
            }
    resolved = _resolved(own, definitions)
    kind: FieldKind
    choices: tuple[Any, ...] = ()
    if isinstance(resolved.get("enum"), list):
        kind, choices = "choice", tuple(resolved["enum"])
    elif "const" in resolved:
        kind, choices = "choice", (resolved["const"],)
    else:
        kind = _SIMPLE_KINDS.get(str(resolved.get("type")), "json")
    return AnswerField(
        name=name,
        kind=kind,
        title=title,
        required=required,
        schema=resolved,
        nullable=nullable,
        description=str(resolved.get("description") or ""),
        has_default="default" in resolved,
        default=resolved.get("default"),
        choices=choices,
    )


def _resolved(schema: Mapping[str, Any], definitions: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` with a local `$ref` replaced by its definition (its own keys win)."""
    ref = schema.get("$ref")
    if not isinstance(ref, str) or not ref.startswith("#/$defs/"):
        return dict(schema)
    target = definitions.get(ref.removeprefix("#/$defs/"))
    base = dict(target) if isinstance(target, Mapping) else {}
    return {**base, **{k: v for k, v in schema.items() if k != "$ref"}}


# --- checking ----------------------------------------------------------------------------------


def check_answer(schema: Mapping[str, Any], answer: Any) -> dict[str, Any]:
    """The answer, checked against the schema, with the defaults of fields it left out.
    Raises `AnswerInvalid` naming the first field at fault."""
    try:
        fields = answer_fields(schema)
    except ValueError as error:
        raise AnswerInvalid(f"this request's answer schema cannot be used: {error}") from None
    if not isinstance(answer, Mapping):
        names = ", ".join(f.name for f in fields)
        raise AnswerInvalid(f"the answer must be a JSON object with the fields {names}")
    known = {f.name for f in fields}
    unknown = sorted(str(k) for k in answer if k not in known)
    if unknown:
        reason = f"not a field of this answer (it has: {', '.join(sorted(known))})"
        raise AnswerInvalid(f"{unknown[0]}: {reason}", field=unknown[0], reason=reason)
    checked: dict[str, Any] = {}
    for field in fields:
        if field.name not in answer:
            if field.required:
                raise _missing(field)
            if field.has_default:
                checked[field.name] = field.default
            continue
        value = answer[field.name]
        if value is None and field.nullable:
            checked[field.name] = None
            continue
        checked[field.name] = _checked_value(field, value)
    size = len(json.dumps(checked, ensure_ascii=False).encode("utf-8"))
    if size > MAX_ANSWER_BYTES:
        raise AnswerInvalid(
            f"the answer is {size:,} bytes, over the {MAX_ANSWER_BYTES:,}-byte limit"
        )
    return checked


def _checked_value(field: AnswerField, value: Any) -> Any:
    def refuse(reason: str, given: str = "") -> AnswerInvalid:
        """`reason` quotes nothing given; `given` (`, not 600`) only the message says."""
        return AnswerInvalid(f"{field.name}: {reason}{given}", field=field.name, reason=reason)

    s = field.schema
    if field.kind == "choice":
        # `True == 1` in Python: a choice matches by type as well as by value.
        if not any(type(value) is type(c) and value == c for c in field.choices):
            raise refuse(f"must be {field.hint}", f", not {json.dumps(value, ensure_ascii=False)}")
        return value
    if field.kind == "boolean":
        if not isinstance(value, bool):
            raise refuse("must be true or false")
        return value
    if field.kind in ("integer", "number"):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise refuse(f"must be {field.hint}")
        if not math.isfinite(value):
            raise refuse("must be a finite number")
        if field.kind == "integer":
            if isinstance(value, float) and not value.is_integer():
                raise refuse("must be a whole number", f", not {value}")
            value = int(value)
        _check_bounds(field, value, refuse)
        return value
    if field.kind == "string":
        if not isinstance(value, str):
            raise refuse("must be text")
        if "minLength" in s and len(value) < s["minLength"]:
            raise refuse(f"must be at least {s['minLength']} characters")
        if "maxLength" in s and len(value) > s["maxLength"]:
            raise refuse(f"must be at most {s['maxLength']} characters")
        pattern = s.get("pattern")
        if isinstance(pattern, str) and re.search(pattern, value) is None:
            raise refuse(f"must match the pattern {pattern}")
        return value
    wanted = {"array": list, "object": dict}.get(str(s.get("type")))
    if wanted is not None and not isinstance(value, wanted):
        raise refuse(f"must be a JSON {s.get('type')}")
    return value


def _check_bounds(
    field: AnswerField, value: float, refuse: Callable[[str, str], AnswerInvalid]
) -> None:
    s, given = field.schema, f", not {value}"
    if "minimum" in s and value < s["minimum"]:
        raise refuse(f"must be at least {_number(s['minimum'])}", given)
    if "maximum" in s and value > s["maximum"]:
        raise refuse(f"must be at most {_number(s['maximum'])}", given)
    if "exclusiveMinimum" in s and value <= s["exclusiveMinimum"]:
        raise refuse(f"must be more than {_number(s['exclusiveMinimum'])}", given)
    if "exclusiveMaximum" in s and value >= s["exclusiveMaximum"]:
        raise refuse(f"must be less than {_number(s['exclusiveMaximum'])}", given)


def _missing(field: AnswerField) -> AnswerInvalid:
    reason = f"required ({field.hint})"
    return AnswerInvalid(f"{field.name}: {reason}", field=field.name, reason=reason)


def checked_verdict(request: AnyWait, verdict: Verdict) -> Verdict:
    """`verdict`, fit for `request`: an approval of a request that asks for an answer must
    carry one its schema accepts (completed with defaults); a request that asks for none
    takes none. A rejection carries no answer. Raises `AnswerInvalid`; nothing is written.
    A run that waits for an event or a time takes no person's decision: `ApprovalClosed`."""
    if not isinstance(request, ApprovalRequest):
        what = {EventWait: "an event", TimerWait: "a time"}.get(type(request), "child runs")
        raise ApprovalClosed(f"the run waits for {what}, not for a person's decision")
    schema = request.answer_schema
    if not verdict.approved:
        return verdict if verdict.answer is None else verdict.model_copy(update={"answer": None})
    if schema is None:
        if verdict.answer is not None:
            raise AnswerInvalid("this request asks for a yes or no, not an answer")
        return verdict
    if verdict.answer is None:
        fields = answer_fields(schema)
        wanted = "; ".join(f"{f.name}: {f.hint}" for f in fields)
        said = f"this request needs an answer to approve ({wanted})"
        example = ", ".join(
            f"{json.dumps(f.name)}: {f.example}" for f in fields if f.required
        ) or ", ".join(f"{json.dumps(f.name)}: {f.example}" for f in fields)
        raise AnswerInvalid(said, cli=f"{said}: give it as --answer '{{{example}}}'")
    return verdict.model_copy(update={"answer": check_answer(schema, verdict.answer)})


def checked_for_run(run: RunState | None, verdict: Verdict) -> tuple[Verdict, int | None]:
    """`checked_verdict` for whatever the run waits for, and the step it waits at (None if
    it does not wait: the decision is then refused downstream)."""
    if run is None or run.waiting is None:
        return verdict, None
    return checked_verdict(run.waiting.request, verdict), run.step


def answer_from_form(
    schema: Mapping[str, Any], form: Mapping[str, Sequence[str]]
) -> dict[str, Any]:
    """The answer the page's form carries (`answer.<field>` values, all text), typed by the
    schema; the decision checks it (`checked_verdict`), as it checks every channel's. Raises
    `AnswerInvalid` naming the first field that cannot be typed or is missing."""
    answer: dict[str, Any] = {}
    for field in answer_fields(schema):
        values = list(form.get(FORM_PREFIX + field.name, []))
        if field.kind == "boolean":
            # An unticked checkbox sends nothing.
            answer[field.name] = bool(values) and values[-1] in ("true", "on")
            continue
        if len(values) > 1:
            raise AnswerInvalid(
                f"{field.name}: give one value", field=field.name, reason="give one value"
            )
        given = values[0] if values else ""
        text = given.strip()
        # An empty box leaves the field out, unless it is required text (then "" is given).
        if not values or (not text and (field.kind != "string" or not field.required)):
            if field.required:
                raise _missing(field)
            continue
        answer[field.name] = _typed(field, given if field.kind == "string" else text)
    return answer


def _typed(field: AnswerField, text: str) -> Any:
    try:
        if field.kind == "integer":
            return int(text)
        if field.kind == "number":
            return float(text)
        if field.kind in ("choice", "json"):
            return loads(text, field=field.name, max_chars=MAX_ANSWER_TEXT_CHARS)
    except JsonOverLimit as over:
        raise AnswerInvalid(
            f"{field.name}: {over.reason}", field=field.name, reason=over.reason
        ) from None
    except ValueError:
        reason = f"must be {'valid JSON' if field.kind == 'json' else field.hint}"
        raise AnswerInvalid(
            f"{field.name}: {reason}, not {text[:40]!r}", field=field.name, reason=reason
        ) from None
    return text


def parse_answer_json(text: str) -> dict[str, Any]:
    """An answer given as JSON text (the CLI's `--answer`): an object, or `AnswerInvalid`
    (`JsonOverLimit` for text too long or nested too deep, before it is parsed)."""
    try:
        answer = loads(text, field="--answer", max_chars=MAX_ANSWER_TEXT_CHARS)
    except JsonOverLimit:
        raise
    except ValueError as error:
        raise AnswerInvalid(f"--answer is not JSON: {error}") from None
    if not isinstance(answer, dict):
        raise AnswerInvalid("--answer must be a JSON object, e.g. '{\"amount\": 120}'")
    return answer
