"""Child runs: the runs a run's tool starts (`start_runs`), and how their end reaches it.

A step that starts children starts them before it commits: every spec is checked first (as
`ratchet start` checks a request), then each child is created (and on AWS its execution
started) under an id derived from the step's idempotency key, `<run>.step-<n>.<i>`, in order,
so the children of a step that exist at any moment are its first few. A worker killed after
that and before the commit retries the step, whose decision is reused; the same ids find the
children there, and nothing is started twice.

A cancel of the parent can land while the step is under way, and then the step never commits
and no record names its children. They end with their parent all the same, by three reads:
- the cancel (`cancelled`) looks up the step's ids from `.0` on, up to the first that does
  not exist, and cancels each child it finds, as it cancels the children a wait names;
- the step reads its parent's head before it creates each child, and stops, creating no more,
  once it shows the step cut off (`RunState.cut_off_at`);
- a child's first step reads its parent's head before any work, and ends the child cancelled
  if the step that started it was cut off (`Engine.advance`).
Each side reads after its own write, so whatever the order: a child created before the
cancel's look-up is found by it; a child can be created after it only if the step's read came
before the cancel, which happens once per attempt, and that child's first step, which begins
after its creation and so after the cancel, finds the cancel and does nothing.

The step then parks its run on a `ChildrenWait` (with `wait="all"` or `"first"`): waiting, no
process held, on AWS an `AwaitEvent` task holding a token. The wait settles when its children
have ended (every one, or the first), through the engine's one conditional write, as any other
wait; what settles it is a `WaitSettled` of `how="children"` whose text says how each ended,
and which records each child's outcome (`ChildOutcome`).

Who settles it, so that no ending is missed:
- a child, right after the commit that ends it (done, failed, stopped at its cap, cancelled):
  the engine tells this desk (`after`), which reads the parent and its children's heads;
- the parent, right after the commit that parks it: children that ended before it parked are
  found then;
- a sweep, for a child whose process died between its last commit and telling its parent:
  locally each worker checks the open children waits every `CHILDREN_SWEEP_SECONDS`; on AWS the
  parent's park is renewed weekly, and every renewal checks again, and a child's step retried
  after a crash finds its run ended and tells again.

The reads are strongly consistent and each side reads after its own write, so of a child
ending and its parent parking at the same moment one always sees both.

On AWS the settling is followed by the parked parent's wake (its task token answered). The
desk marks the wake owed before it settles (`Nudge.owe`), so a desk that dies between the two
leaves the mark for the sweep (`ratchet.waiting.wakes`); and a child's step retried after that
crash finds its parent settled but still parked, and answers it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ratchet.errors import (
    ChildRunsRefused,
    NotCancellable,
    NotWaiting,
    RatchetError,
    StaleVersion,
)
from ratchet.faults import NO_FAULTS, FaultPlan, FaultPoint
from ratchet.ports import CheckpointStore, OpenWait
from ratchet.runs import RunRequest, RunRequestInvalid, request_problems
from ratchet.state import (
    CHILD_RESULT_CHARS,
    FINISHED,
    MAX_CHILD_DEPTH,
    MAX_CHILDREN,
    ChildOutcome,
    ChildrenWait,
    RunState,
    RunStatus,
    StartRuns,
    WaitSettled,
    child_run_id,
    parent_cancelled,
)
from ratchet.waiting.desk import Nudge, Settles

CHILDREN_SWEEP_SECONDS = 5.0
"""How often, locally, a worker checks the open children waits for children that ended
without telling their parent (their process died in between)."""
CHILDREN_TEXT_CHARS = 4000
"""The settled step's result, which the model reads, is at most this long; every child's
outcome is in the step's record (`WaitSettled.children`) whatever its length."""
LINE_CHARS = 300


@dataclass
class ChildRunDesk:
    """Starts child runs and settles their parents' waits (`ratchet.ports.ChildRuns`)."""

    store: CheckpointStore
    engine: Settles
    new_run: Callable[[RunRequest], RunState]
    """The runtime's start check (`ratchet.runs.new_run` with its agents and key)."""
    create: Callable[[RunState], None]
    """Create a checked run unless its id exists (and on AWS start its execution, a no-op
    for one that runs already)."""
    cancel: Callable[[str, str, str], object]
    """Cancel a run (its id, by whom, why) as the runtime's `cancel` does: its open requests
    closed, on AWS its execution stopped, and its own children, through its engine, told
    here (`cancelled`). `NotCancellable` if it has ended."""
    nudge: Nudge | None = None
    """On AWS, what answers the parked parent's task token once its wait is settled."""
    logger: logging.Logger | Any = None
    faults: FaultPlan = NO_FAULTS

    # --- starting --------------------------------------------------------------------------

    def start(self, parent: RunState, step: int, request: StartRuns) -> list[str]:
        if parent.depth >= MAX_CHILD_DEPTH:
            raise ChildRunsRefused(
                f"start_runs: run {parent.run_id!r} is {parent.depth} runs deep, and runs nest "
                f"at most {MAX_CHILD_DEPTH} deep"
            )
        children = [
            self._checked(parent, step, i, spec_request)
            for i, spec_request in enumerate(self._requests(parent, step, request))
        ]
        for child in children:
            self._unless_cut_off(parent, step)
            self.create(child)
        return [child.run_id for child in children]

    def _unless_cut_off(self, parent: RunState, step: int) -> None:
        """Go on creating the step's children unless a cancel of the parent cut the step
        off: then the commit would be refused, and the step ends here as it would there."""
        head = self.store.load_head(parent.run_id)
        if head is not None and head.cut_off_at(step):
            raise StaleVersion(parent.run_id, parent.version)

    @staticmethod
    def _requests(parent: RunState, step: int, request: StartRuns) -> Iterable[dict[str, Any]]:
        for i, spec in enumerate(request.runs):
            fields: dict[str, Any] = {
                "run_id": child_run_id(parent.run_id, step, i),
                "agent": spec.agent,
                "input": spec.input,
                "goal": spec.goal,
                "model": spec.model or parent.options.model,
                "max_steps": spec.max_steps,
            }
            if not parent.options.notify.is_empty:
                # A child that asks a person asks whom its parent would.
                fields["notify"] = parent.options.notify.model_dump()
            yield {k: v for k, v in fields.items() if v is not None}

    def _checked(self, parent: RunState, step: int, index: int, fields: dict[str, Any]) -> RunState:
        try:
            state = self.new_run(RunRequest.model_validate(fields))
        except ValidationError as error:
            where, what = request_problems(error)[0]
            raise ChildRunsRefused(f"start_runs: run {index}: {where}: {what}") from None
        except RunRequestInvalid as refused:
            raise ChildRunsRefused(f"start_runs: run {index}: {refused}") from None
        return state.model_copy(
            update={"parent": parent.run_id, "parent_step": step, "depth": parent.depth + 1}
        )

    # --- cancelling ------------------------------------------------------------------------

    def cancelled(self, run: RunState, *, by: str) -> None:
        reason = parent_cancelled(run.run_id)
        for child in self._started(run):
            if child.is_finished:
                continue
            try:
                self.cancel(child.run_id, by, reason)
            except NotCancellable:
                continue  # ended meanwhile

    def _started(self, run: RunState) -> Iterator[RunState]:
        """The heads of the children a cancel of `run` (as it stood) ends: those its wait
        names, or those the step under way had created (a wait="none" step's too: it never
        committed, so no later step of the run goes on with them)."""
        wait = _children_wait(run)
        if wait is not None:
            for child_id in wait.children:
                head = self.store.load_head(child_id)
                if head is not None:
                    yield head
            return
        if run.status is not RunStatus.RUNNING:
            return
        step = run.next_step
        # The step creates its children in order, so those that exist are its first few: the
        # first id that does not exist (or is another run's) is past the last.
        for index in range(MAX_CHILDREN):
            head = self.store.load_head(child_run_id(run.run_id, step, index))
            if head is None or head.parent != run.run_id or head.parent_step != step:
                return
            yield head

    # --- settling --------------------------------------------------------------------------

    def after(self, head: RunState) -> None:
        if head.is_finished and head.parent is not None:
            if self.settle(head.parent) is None and head.parent_step is not None:
                self._rewake(head.parent, head.parent_step)
        elif _children_wait(head) is not None:
            self.settle(head.run_id)

    def _rewake(self, parent_id: str, step: int) -> None:
        """If the parent's wait at `step` was settled and its parked execution was never
        answered (its waker died in between), answer it now."""
        if self.nudge is None:
            return
        parent = self.store.load_head(parent_id)
        if parent is None or parent.status is not RunStatus.RUNNING or parent.step != step:
            # Still waiting there (for other children), or moved on since (its execution
            # took a step, so it was woken), or ended (a cancel stops its execution).
            return
        try:
            self.nudge.resume(parent_id, step)
        except RatchetError:
            self._warn("settled parent not woken", parent_id)

    def settle(self, parent_id: str) -> RunState | None:
        """Settle the run's children wait if its children have ended (all, or the first):
        the new head, or None when nothing was settled here (it waits for no children,
        some it waits for still run, or another writer settled it first)."""
        for _ in range(3):
            parent = self.store.load_head(parent_id)
            wait = _children_wait(parent) if parent is not None else None
            if parent is None or wait is None:
                return None
            heads = self._heads(wait)
            if heads is None:
                return None
            settled = children_ended(wait, parent.step, heads)
            if self.nudge is not None:
                self.nudge.owe(parent_id, parent.step, "children")
            try:
                head = self.engine.decide_waiting(parent, settled, step=parent.step)
            except (NotWaiting, StaleVersion):
                continue  # moved meanwhile (a cancel, another child's settling): look again
            self.faults.hit(FaultPoint.AFTER_WAIT_SETTLED, parent.step)
            if self.nudge is not None:
                try:
                    self.nudge(head, settled)
                except RatchetError:
                    # Settled and durable, the wake owed: a child's retried step or the
                    # sweep answers the parked execution.
                    self._warn("parked parent not woken", head.run_id)
            return head
        return None

    def settle_open(self, waits: Iterable[OpenWait]) -> list[str]:
        """The sweep: settle each open children wait whose children have ended."""
        resumed: list[str] = []
        for open_wait in waits:
            if open_wait.kind != "children":
                continue
            try:
                if self.settle(open_wait.run_id) is not None:
                    resumed.append(open_wait.run_id)
            except RatchetError:
                self._warn("children wait not checked", open_wait.run_id)
        return resumed

    def _heads(self, wait: ChildrenWait) -> list[RunState | None] | None:
        """The children's heads, or None as soon as one shows the wait cannot settle yet
        (with `all`, the first still running: the rest are not read)."""
        heads: list[RunState | None] = []
        ended = False
        for child_id in wait.children:
            child = self.store.load_head(child_id)
            done = child is not None and child.status in FINISHED
            if wait.wait == "all" and not done:
                return None
            ended = ended or done
            heads.append(child)
        return heads if ended else None

    def _warn(self, message: str, run_id: str) -> None:
        if self.logger is not None:
            self.logger.warning(message, extra={"run_id": run_id}, exc_info=True)


def _children_wait(head: RunState | None) -> ChildrenWait | None:
    if head is None or head.status is not RunStatus.WAITING or head.waiting is None:
        return None
    request = head.waiting.request
    return request if isinstance(request, ChildrenWait) else None


def children_ended(wait: ChildrenWait, step: int, heads: list[RunState | None]) -> WaitSettled:
    """The settlement of the wait at `step`, from its children's heads (in its order): the
    step's result, in words, and each child's outcome."""
    outcomes = [
        _outcome(child_id, head) for child_id, head in zip(wait.children, heads, strict=True)
    ]
    ended = [o for o in outcomes if o.status in FINISHED]
    counts: dict[str, int] = {}
    for outcome in ended:
        counts[outcome.status.value] = counts.get(outcome.status.value, 0) + 1
    tally = ", ".join(f"{n} {status}" for status, n in counts.items())
    runs = "run" if len(outcomes) == 1 else "runs"
    if wait.wait == "all":
        head_line = f"All {len(outcomes)} child {runs} ended: {tally}."
    else:
        head_line = (
            f"The first of {len(outcomes)} child {runs} to end ended: {tally}; "
            f"{len(outcomes) - len(ended)} still running."
        )
    lines = [head_line]
    used = len(head_line)
    for shown, outcome in enumerate(outcomes):
        line = _line(outcome)
        if used + len(line) + 1 > CHILDREN_TEXT_CHARS:
            lines.append(f"… and {len(outcomes) - shown} more (the step's record has each).")
            break
        lines.append(line)
        used += len(line) + 1
    return WaitSettled(step=step, how="children", text="\n".join(lines), children=outcomes)


def _outcome(child_id: str, head: RunState | None) -> ChildOutcome:
    if head is None:  # not created: cannot happen once the step committed, read as running
        return ChildOutcome(run_id=child_id, agent="", status=RunStatus.RUNNING)
    return ChildOutcome(
        run_id=child_id,
        agent=head.agent,
        status=head.status,
        steps=head.step,
        summary=_cut(head.summary),
        error=_cut(head.error),
    )


def _line(outcome: ChildOutcome) -> str:
    said = outcome.error if outcome.status is RunStatus.FAILED else outcome.summary
    line = f"- {outcome.run_id} ({outcome.agent}) {outcome.status.value}"
    if outcome.status in FINISHED:
        line += f" after {outcome.steps} step{'s' if outcome.steps != 1 else ''}"
    if said:
        line += ": " + " ".join(said.split())
    return line if len(line) <= LINE_CHARS else line[: LINE_CHARS - 1] + "…"


def _cut(text: str | None) -> str | None:
    if text is None or len(text) <= CHILD_RESULT_CHARS:
        return text
    return text[: CHILD_RESULT_CHARS - 1] + "…"
