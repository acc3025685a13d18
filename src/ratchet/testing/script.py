"""How a check answers what a run waits for: a declared script, never a person at a keyboard.

Approvals are approved unless a rule says otherwise (matched on the request's prompt); events
are sent from a fixture (each name's payloads in order, one per wait for it); a wait with
nothing left to send times out when it has a timeout (the fake clock moves past it); sleeps
are skipped on the fake clock; child runs are worked in process, their waits answered alike.

As JSON (`ratchet check --script FILE`)::

    {"approvals": [{"prompt": "Merge", "approve": true, "comment": "ok"}],
     "events": {"ci-finished": [{"conclusion": "success"}]}}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from ratchet.errors import InvalidInput


class ApprovalRule(BaseModel):
    """How to answer the requests whose prompt contains `prompt` (all of them, if empty)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt: str = ""
    approve: bool = True
    comment: str = Field(default="", max_length=2000)
    answer: dict[str, JsonValue] | None = None
    """The structured answer, for a request that asks for one (`ask_person(answer=...)`)."""


class WaitScript(BaseModel):
    """The answers a checked run's waits get (see the module's docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    approvals: list[ApprovalRule] = Field(default_factory=list)
    """The first rule whose `prompt` the request's prompt contains decides; none: approved."""
    events: dict[str, list[JsonValue]] = Field(default_factory=dict)
    """Each event name's payloads, sent in order: the n-th wait for a name gets the n-th."""
    by: str = Field(default="ratchet-check", min_length=1, max_length=200)
    """Who the decisions are recorded as made by."""

    def approval_for(self, prompt: str) -> ApprovalRule:
        for rule in self.approvals:
            if rule.prompt in prompt:
                return rule
        return ApprovalRule()

    def event(self, name: str, index: int) -> tuple[bool, JsonValue]:
        """Whether the script sends the `index`-th (from 0) event called `name`, and its
        payload."""
        payloads = self.events.get(name, [])
        if index < len(payloads):
            return True, payloads[index]
        return False, None

    @classmethod
    def given(cls, script: WaitScript | Mapping[str, Any] | None) -> WaitScript:
        """`script` as it is, or read from its JSON form (a dict); None: approve everything."""
        if isinstance(script, WaitScript):
            return script
        return cls.model_validate(dict(script or {}))

    @classmethod
    def of(
        cls,
        approvals: Sequence[ApprovalRule | Mapping[str, Any]] = (),
        events: Mapping[str, Sequence[JsonValue]] | None = None,
    ) -> WaitScript:
        return cls.model_validate(
            {
                "approvals": [
                    a.model_dump() if isinstance(a, ApprovalRule) else dict(a) for a in approvals
                ],
                "events": {name: list(p) for name, p in (events or {}).items()},
            }
        )

    @classmethod
    def read(cls, path: Path) -> WaitScript:
        """The script in the JSON file `path`; `InvalidInput` names what is wrong."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidInput(f"--script {path}: cannot read it: {error}") from None
        try:
            return cls.model_validate_json(text)
        except ValidationError as error:
            problem = error.errors(include_url=False, include_input=False)[0]
            where = ".".join(str(p) for p in problem["loc"]) or "(the file)"
            raise InvalidInput(f"--script {path}: {where}: {problem['msg']}") from None


APPROVE_ALL = WaitScript()
