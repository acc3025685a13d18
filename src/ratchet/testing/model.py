"""The model a check runs an agent with: its scripted policy, or the decisions of a recorded run
replayed step by step, so a check never calls a paid model. Every call is logged to a file, so
a decision asked twice is seen even when the process that asked it was killed.

A run names it as its own model (`module:attr`), `CHECK_MODEL`; which agent, recording and log
it serves are in the environment (`RATCHET_CHECK_MODEL`), set by the process that runs the
schedule and inherited by the process it spawns to be killed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, JsonValue, ValidationError

from ratchet.agents import load_agent
from ratchet.client import Client
from ratchet.errors import InvalidInput, ModelOutputInvalid
from ratchet.ports import ModelRequest
from ratchet.state import Decision, Done, RunStatus, ToolCall
from ratchet.tools import Policy

CHECK_MODEL = "ratchet.testing.model:from_environment"
MODEL_ENV = "RATCHET_CHECK_MODEL"
CHECKED_RUN = "checked"
"""The run a check starts (`runner.RUN_ID`); the runs it starts are children, each decided by
its own agent's policy."""


class Decided(BaseModel):
    """One step's decision in a recording: a tool call, or done with a summary."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    step: int
    tool: str | None = None
    arguments: dict[str, JsonValue] | None = None
    done: str | None = None

    def decision(self) -> Decision:
        if self.tool is not None:
            return ToolCall(name=self.tool, arguments=dict(self.arguments or {}))
        return Done(summary=self.done or "")


class Recording(BaseModel):
    """A run's decisions, replayed by a check in place of its model (`ratchet check
    --record FILE` writes one; `--from-run RUN --store URL` reads one from a stored run)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    agent: str
    params: dict[str, JsonValue] = {}
    """The run's input: a check replays the decisions on the input they were taken on."""
    decisions: list[Decided]

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json(indent=2) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, path: Path) -> Recording:
        try:
            return cls.model_validate_json(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValidationError) as error:
            reason = " ".join(str(error).split())[:300]
            raise InvalidInput(
                f"{path} is not a recording of a run's decisions: {reason}"
            ) from None


def recording_of(client: Client, run_id: str) -> Recording:
    """The decisions run `run_id` took, from its step records: a tool call per step, then done
    (with the run's summary) at the step after its last one. `InvalidInput` for a run that is
    not done, or whose arguments were kept as a blob (only a preview is listed)."""
    run = client.get(run_id)
    if run.status is not RunStatus.DONE:
        raise InvalidInput(
            f"run {run_id!r} is {run.status.value}: record a check from a run that is done"
        )
    decisions: list[Decided] = []
    for checkpoint in client.history(run_id):
        if checkpoint.event != "step" or checkpoint.tool is None:
            continue
        arguments = checkpoint.arguments or {}
        if "_preview" in arguments or any(k.startswith("…") for k in arguments):
            raise InvalidInput(
                f"run {run_id!r}: step {checkpoint.step}'s arguments were kept as a blob; "
                "they cannot be replayed"
            )
        decisions.append(Decided(step=checkpoint.step, tool=checkpoint.tool, arguments=arguments))
    decisions.append(Decided(step=run.step + 1, done=run.summary or ""))
    params = client.head(run_id).options.params
    return Recording(run_id=run_id, agent=run.agent, params=params, decisions=decisions)


class CheckModelSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    agent: str
    recording: Path | None = None
    log: Path
    store: str | None = None
    """The scratch store, where the agent of a child run (which inherits its parent's model)
    is read."""

    def environment(self) -> dict[str, str]:
        return {MODEL_ENV: self.model_dump_json()}


class CheckModel:
    """Decides as the agent's policy, or as the recording, and logs each call (its run and
    step) to a file, appended before it answers."""

    def __init__(
        self,
        log: Path,
        *,
        policy: Policy | None = None,
        replay: Sequence[Decided] = (),
        run_id: str | None = None,
        store: str | None = None,
    ) -> None:
        self._log = log
        self._policy = policy
        self._replay = {d.step: d for d in replay}
        self._run_id = run_id
        self._store = store

    def decide(self, request: ModelRequest) -> Decision:
        view = request.view
        with self._log.open("a", encoding="utf-8") as log:
            log.write(json.dumps({"run_id": view.run_id, "step": view.step}) + "\n")
        if self._run_id is not None and view.run_id != self._run_id:
            return self._child_policy(view.run_id)(view)
        if self._policy is not None:
            return self._policy(view)
        found = self._replay.get(view.step)
        if found is None:
            raise ModelOutputInvalid(f"the recording has no decision for step {view.step}")
        return found.decision()

    def _child_policy(self, run_id: str) -> Policy:
        """The scripted policy of a child run's own agent (the recording holds the checked
        run's decisions only)."""
        from ratchet.runtime.local import LocalRuntime, LocalSettings

        runtime = LocalRuntime.open(LocalSettings(store=self._store), create=False)
        try:
            head = runtime.store.load_head(run_id)
        finally:
            runtime.close()
        agent = load_agent(head.agent) if head is not None else None
        if agent is None or agent.policy is None:
            raise ModelOutputInvalid(f"child run {run_id!r}'s agent has no scripted policy")
        return agent.policy


def from_environment() -> CheckModel:
    """The check's model, as `RATCHET_CHECK_MODEL` describes it (`CHECK_MODEL` names this)."""
    try:
        settings = CheckModelSettings.model_validate_json(os.environ[MODEL_ENV])
    except (KeyError, ValidationError):
        raise InvalidInput(f"{CHECK_MODEL} runs only under ratchet check ({MODEL_ENV})") from None
    if settings.recording is not None:
        recording = Recording.read(settings.recording)
        return CheckModel(
            settings.log, replay=recording.decisions, run_id=CHECKED_RUN, store=settings.store
        )
    agent = load_agent(settings.agent)
    if agent.policy is None:
        raise InvalidInput(f"agent {settings.agent!r} has no scripted policy and no recording")
    return CheckModel(settings.log, policy=agent.policy, run_id=CHECKED_RUN, store=settings.store)


def model_calls(log: Path) -> dict[str, Any]:
    """How often each step of each run asked the model: `{run_id: {step: calls}}`."""
    counted: dict[str, dict[int, int]] = {}
    if not log.exists():
        return counted
    for line in log.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        call = json.loads(line)
        steps = counted.setdefault(call["run_id"], {})
        steps[call["step"]] = steps.get(call["step"], 0) + 1
    return counted
