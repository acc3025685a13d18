"""The small interfaces the engine talks to. Adapters implement them; the engine never sees how.

Every `CheckpointStore` and `IdempotencyLedger` backend runs the same conformance suite
(`tests/conformance`), so the contracts documented here are tested, not just described.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, Literal, NamedTuple, Protocol

from pydantic import BaseModel, ConfigDict, Field

from ratchet.errors import InvalidInput
from ratchet.state import (
    BlobRef,
    Decision,
    Message,
    RunState,
    StartRuns,
    StoredCheckpoint,
    ToolDigest,
    ToolOutput,
    Usage,
)
from ratchet.waits import Approval, ApprovalNotice, ApprovalStatus, SentEvent, Verdict

MAX_ITEM_BYTES = 350 * 1024
"""No record Ratchet writes may exceed this (DynamoDB's item limit is 400 KB)."""


@dataclass(frozen=True)
class Commit:
    """One atomic write: the new head and its checkpoint record, if the head is still at
    `expected_version`. `completes` names a ledger key to mark completed in the same write."""

    head: RunState
    checkpoint: StoredCheckpoint
    expected_version: int
    completes: LedgerCompletion | None = None
    consumes: Consumption | None = None


@dataclass(frozen=True)
class Consumption:
    """An event of the run's mailbox that the commit consumes, in the same write: the commit
    lands only if the event is still pending, and marks it consumed by `step`."""

    event_id: str
    step: int


@dataclass(frozen=True)
class LedgerCompletion:
    key: str
    result: str


@dataclass(frozen=True)
class CommitReceipt:
    bytes_written: int
    milliseconds: float


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    status: str
    step: int
    version: int
    updated_at: datetime
    damage: str | None = None
    """Why the run cannot be read, if the store can tell from its row (text that is not
    UTF-8, a head that is not JSON, a status that is not a run status): listed as damaged."""
    agent: str | None = None
    """The run's agent; None where the store's row does not say (a damaged row, or a DynamoDB
    head last written before heads kept it)."""
    concurrency_key: str | None = None
    """The run's `concurrency_key`, where the store's listing reads its static part (a full
    listing); None for none, and in a page of the DynamoDB runs index, which does not keep it."""


@dataclass(frozen=True)
class RunCursor:
    """Where a page of runs ended: the next page lists the runs changed before this one (by
    `updated_at`, then `run_id`, both descending)."""

    updated_at: datetime
    run_id: str


class CheckpointStore(Protocol):
    """Durable, versioned checkpoints: one head per run plus an immutable record per commit.

    Contract:
    - `create_run` writes the head and its `created` checkpoint; it returns False and changes
      nothing if the run id exists.
    - `load_head` is strongly consistent: it sees every committed write.
    - `begin_attempt` and `commit` succeed only if the head is still at the version the caller
      read; otherwise they raise `StaleVersion` and change nothing. The head's version after a
      successful write is `expected_version + 1`.
    - `commit` writes the head, the checkpoint record and the ledger completion in one
      transaction, and refuses any record over `MAX_ITEM_BYTES` before writing. With
      `consumes`, the same transaction marks that mailbox event consumed, and lands only if
      it was pending (`StaleVersion` otherwise, nothing written).
    - Checkpoints are never rewritten; every one can be read back until retention removes it.
    """

    def create_run(self, state: RunState, checkpoint: StoredCheckpoint) -> bool: ...

    def load_head(self, run_id: str) -> RunState | None: ...

    def begin_attempt(self, run_id: str, expected_version: int) -> int:
        """Count one more attempt at the run's next step; returns the new version."""
        ...

    def release_attempt(self, run_id: str, expected_version: int) -> int:
        """Take back one counted attempt that never went on to its step's work (it found an
        at-most-once call of the step that may still be running); returns the new version."""
        ...

    def commit(self, commit: Commit) -> CommitReceipt: ...

    def list_checkpoints(self, run_id: str, *, after: int = 0) -> list[StoredCheckpoint]:
        """The run's checkpoint records, oldest first; with `after`, only those of a later
        version (what a follower has not read yet: one range read, however long the run)."""
        ...

    def last_checkpoints(self, run_id: str, *, limit: int) -> list[StoredCheckpoint]:
        """The run's last `limit` checkpoint records, oldest first: one range read from the
        newest back, which reads `limit` records however long the run (a page of its latest
        steps; `list_checkpoints` has them all)."""
        ...

    def list_runs(self) -> list[RunSummary]: ...

    def list_page(
        self, *, status: str | None = None, limit: int, after: RunCursor | None = None
    ) -> list[RunSummary]:
        """At most `limit` runs, most recently changed first (ties by run id, descending),
        only those in `status` if given, only those before `after` if given; each with its
        agent. What it reads never grows with the step records the store holds: SQLite reads
        the runs table (a row per run), DynamoDB a page of an index of heads (about `limit`
        items, however many runs the table holds)."""
        ...


class LedgerStatus(StrEnum):
    IN_PROGRESS = "in_progress"
    CALLED = "called"
    """An at-most-once tool's call started under the key (`start_call`) and recorded no
    outcome yet: whether it ran is not known until the step commits."""
    COMPLETED = "completed"


class CallStart(BaseModel):
    """What the ledger keeps of an at-most-once call when it starts (`start_call`), so that a
    later attempt that finds it started with no outcome can tell whether it may still run."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    """When the call started, by the starting engine's clock."""
    seconds: float = Field(gt=0)
    """How long the call may run: the step's time limit (or, with none, the step function's
    timeout), after which the engine that made it has given it up."""
    by: str
    """The worker that started it."""

    @property
    def deadline(self) -> datetime:
        return self.at + timedelta(seconds=self.seconds)


class LedgerEntry(BaseModel):
    """The idempotency record of one step: its decision, recorded before anything is done."""

    model_config = ConfigDict(frozen=True)

    key: str
    run_id: str
    step: int
    args_hash: str
    decision: dict[str, Any] | None
    """The decision while the step is in flight; None once the key is completed. The step's
    commit writes the same decision in the step's record, which history and the window read,
    so the ledger drops its own copy in that write: the arguments are kept once. (A key an
    older Ratchet completed may still carry it.)"""
    status: LedgerStatus = LedgerStatus.IN_PROGRESS
    result: str | None = None
    expires_at: datetime | None = None
    call: CallStart | None = None
    """While the key is `called`: when its at-most-once call started, how long it may run, and
    who started it (None for a key an older Ratchet marked called)."""


class IdempotencyLedger(Protocol):
    """One record per idempotency key, in its own table.

    Contract:
    - `begin` inserts the entry if the key is new and returns it. If the key exists with the
      same `args_hash` it returns the stored entry unchanged (so a retry reuses the recorded
      decision); with another hash it raises `IdempotencyConflict`.
    - `complete` marks the key completed with its result (idempotent for the same result) and
      drops its decision (`decision` reads None after): the step's record holds it. The
      checkpoint store's `commit` does the same for `Commit.completes`, in its transaction.
      A completed key keeps its `args_hash` and status, so a late `begin` of the same key
      gets the completed entry back (the same hash) or `IdempotencyConflict` (another).
    - `start_call` marks an in-progress key `called` with its `CallStart`, atomically: True
      for the one caller that moved it, False (the start it recorded unchanged) if it was
      `called` already (an earlier attempt started the call) or is completed; `KeyError` if
      there is no such key. `get` reads the start back in `call` until the key completes.
    """

    def begin(self, entry: LedgerEntry) -> LedgerEntry: ...

    def get(self, key: str) -> LedgerEntry | None: ...

    def complete(self, key: str, result: str) -> None: ...

    def start_call(self, key: str, call: CallStart) -> bool:
        """Record, before an at-most-once tool is called, that its call starts (see the
        contract above)."""
        ...


class HeldCall(Protocol):
    def release(self) -> None:
        """Let go (at once, or, once the call ends, from the thread that made it); a second
        release does nothing."""
        ...


class CallLocks(Protocol):
    """The at-most-once calls under way on this host, as the local runtime sees them (a lock
    per key beside the store; none on AWS, where a sandbox's end ends its calls).

    A call's lock is taken before its start is recorded and let go when the call has ended,
    however it ends (returned, raised, or given up at the step deadline and ended later); the
    end of its process lets it go too, SIGKILL included, while a frozen process (SIGSTOP, a
    paused VM) keeps it. So a retried step that finds a call started and its lock held knows
    the call may still run, whoever's worker made it.
    """

    def hold(self, key: str) -> HeldCall | None:
        """Take the key's lock for a call about to start; None if another call holds it."""
        ...

    def held(self, key: str) -> bool:
        """Whether a call under way on this host holds the key's lock."""
        ...


@dataclass(frozen=True)
class StoredHead:
    """A run's head as stored: its columns, its JSON and its static part (None for a head an
    older Ratchet stored whole)."""

    run_id: str
    version: int
    attempts: int
    status: str
    updated_at: datetime
    head: str
    static: str | None
    damage: str | None = None
    """What of the row cannot be read as stored (text that is not UTF-8, a status that is not
    a run status), if anything: the run is then unreadable, and left as it is."""


@dataclass(frozen=True)
class StoredRecord:
    version: int
    step: int
    event: str
    damage: str | None = None
    """Why the record's event cannot be read as stored (text that is not UTF-8), if it cannot."""


@dataclass(frozen=True)
class Trimmed:
    records: int
    ledger_entries: int


@dataclass(frozen=True)
class StoredBlob:
    """A stored blob as `ratchet gc` weighs it: its address, its size as stored and when a
    write last put it (a blob put again is in use anew)."""

    address: str
    size: int
    touched_at: datetime


class HousekeepingStore(Protocol):
    """The rows `ratchet.housekeeping` (`ratchet migrate`, `ratchet gc`) reads and the few
    writes it makes, each conditional on the head's version as read (or a blob's last use):
    a store's rows as stored, before any parsing, so that a damaged run is reported rather
    than fatal. Implemented for SQLite (`ratchet.adapters.sqlite.housekeeping`, whose blobs
    are files) and Postgres (`ratchet.adapters.postgres.housekeeping`, whose blobs are rows)."""

    def heads(self) -> list[StoredHead]:
        """Every run's stored head."""
        ...

    def records(self, run_id: str) -> list[StoredRecord]:
        """The run's checkpoint records, oldest first."""
        ...

    def rewrite_head(self, head: StoredHead, text: str, static: str | None) -> bool:
        """Replace the head's JSON (and add its static part if given) if the head is still at
        `head.version`; False, with nothing written, if it moved."""
        ...

    def trim_run(self, head: StoredHead, keep_from_step: int, *, dry_run: bool) -> Trimmed | None:
        """Delete (or, with `dry_run`, count) the run's records other than its first one and
        its ledger entries, of steps before `keep_from_step`, if the head is still at
        `head.version`; None if it moved."""
        ...

    def blob_references(self, trims: Mapping[str, int]) -> set[str]:
        """The sha256 of every blob a head, record, ledger entry, approval or mailbox event
        references, leaving out the records `trim_run` deletes for `trims` (run id: keep-from
        step)."""
        ...

    def blobs(self, touched_before: datetime) -> list[StoredBlob]:
        """The stored blobs last put before `touched_before`."""
        ...

    def count_blobs(self) -> int:
        """How many blobs the store holds."""
        ...

    def delete_blob(self, blob: StoredBlob) -> bool:
        """Delete the blob if no write has put it since it was read (`blob.touched_at`);
        False, with nothing deleted, if one has."""
        ...

    def locked(self) -> AbstractContextManager[object]:
        """Hold what keeps commits from adding a reference to an old blob while gc reads the
        references and deletes: SQLite's write lock; on Postgres, where commits take no
        store-wide lock, a blob a commit references was put just before it, so is young."""
        ...


MIN_LEASE_SECONDS = 0.1
MAX_LEASE_SECONDS = 3600.0
"""An hour: any lease the heartbeat renews every third of it; a dead worker's runs wait this
long at most before another worker takes them."""


def check_lease_seconds(seconds: float, *, name: str = "lease seconds") -> float:
    """`seconds` if it is a lease length a worker can honour; `InvalidInput` otherwise."""
    if not math.isfinite(seconds) or not MIN_LEASE_SECONDS <= seconds <= MAX_LEASE_SECONDS:
        raise InvalidInput(
            f"{name} must be a number from {MIN_LEASE_SECONDS:g} to {MAX_LEASE_SECONDS:g}, "
            f"not {seconds!r}"
        )
    return seconds


@dataclass(frozen=True)
class Beat:
    """What one heartbeat found: whether this worker still holds its id and its run's lease."""

    registered: bool
    holds_lease: bool


class Leases(Protocol):
    """Which local worker works on which run, and which worker ids are live: expiring leases
    and registrations that a worker's heartbeat renews (SQLite: `ratchet.adapters.sqlite.leases`).

    Contract:
    - A lease is a scheduling hint, not the safety net: the checkpoint's version check rejects
      a worker whose lease lapsed mid-step. Leases keep two live workers off the same run and
      let a dead worker's runs be taken once its lease lapses.
    - `claim` finds and takes a running run nobody else holds (or `run_id`) in one atomic
      step, so two workers never both take it; `release` and a renewal in `beat` touch only
      the caller's own lease.
    - `register_worker` refuses (`InvalidInput`) a worker id whose other live registration has
      not lapsed; `beat` renews the registration only under the caller's `token`.
    - Every length is checked by `check_lease_seconds`.
    """

    def on_own_connection(self) -> Leases:
        """The same leases for the calling thread (the heartbeat's); close it after."""
        ...

    def close(self) -> None: ...

    def claim(
        self,
        owner: str,
        seconds: float,
        *,
        run_id: str | None = None,
        skip: Collection[str] = (),
        limit_of: Callable[[str], ConcurrencyBound | None] | None = None,
    ) -> str | None:
        """Lease the running run (or `run_id`) of highest effective priority
        (`ratchet.state.effective_priority`, the time waited counted from its last write; of
        two alike, the longest idle) that nobody holds, leaving out the runs in `skip`, and
        those whose agent already has its bound of runs under a live lease, or whose key its
        agent's bound per key (`limit_of` maps a stored agent reference to its bound; None: no
        bound). The runs counted against a bound are those of every reference with the same
        `ConcurrencyBound.agent`. None if there is none. The find and the take are atomic: no
        two claims share a run or a slot."""
        ...

    def release(self, run_id: str, owner: str) -> None: ...

    def held_by_others(
        self, owner: str, run_id: str | None = None, *, skip: Collection[str] = ()
    ) -> list[tuple[str, str, float]]:
        """Running runs that another worker's unexpired lease keeps from `owner`, as (run id,
        holder, expires_at)."""
        ...

    def running_runs(self, run_id: str | None = None, *, skip: Collection[str] = ()) -> int:
        """Runs a worker could still advance (leased or not), leaving out those in `skip`."""
        ...

    def register_worker(self, worker_id: str, token: str, seconds: float) -> None: ...

    def unregister_worker(self, worker_id: str, token: str) -> None: ...

    def beat(self, worker_id: str, token: str, seconds: float, run_id: str | None) -> Beat:
        """One heartbeat, in one write: renew the registration and, if it works on `run_id`,
        its lease on that run."""
        ...


class ToolSpec(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    input_schema: dict[str, Any]


class StepView(BaseModel):
    """The bounded view of a run that a model decides from.

    `messages` and `tool_results` hold only the window (the agent's last `memory_window`
    steps, 5 by default); older steps are folded into `digest`. A policy that needs what
    the whole run has done asks `calls(tool)` or `done(tool)`, which count both."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    goal: str
    step: int
    """The step being decided."""
    messages: list[Message] = Field(default_factory=list)
    tool_results: list[ToolOutput] = Field(default_factory=list)
    digest: dict[str, ToolDigest] = Field(default_factory=dict)
    last_result: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    previous_failure: str | None = None
    """Why the previous attempt at this step failed (the error recorded on the run); None on
    a step's first attempt, and after an attempt that died without saying why."""
    pinned: list[str] = Field(default_factory=list)
    """Facts the agent pinned with `remember`: shown in every prompt."""
    summary: str | None = None
    """The model-written summary of the steps before `messages` (`model_summary`)."""
    summarised_through: int = 0
    """The last step `summary` covers."""
    task: Literal["step", "summarise"] = "step"
    """`summarise`: the model is asked to fold the oldest steps of `messages` (those up to
    `summarise_through`) into `summary` and answer `Done(summary=<the new summary>)`."""
    summarise_through: int = 0

    def calls(self, tool: str) -> int:
        """How many steps of the run so far called `tool`: those in the window and those
        folded out of it."""
        folded = self.digest.get(tool)
        return (folded.calls if folded else 0) + sum(m.tool == tool for m in self.messages)

    def done(self, tool: str) -> bool:
        """Whether any step of the run so far called `tool`."""
        return self.calls(tool) > 0


class ModelRequest(BaseModel):
    """One step's question to a model. `prompt` is the step prompt (the user turn, byte for
    byte: send it as it is); `tools` the agent's tools, of which the model must call exactly
    one or reply DONE; `view` the same state as structured data (what a scripted policy
    reads). The rest are the agent's settings for its model."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    tools: list[ToolSpec]
    view: StepView
    instructions: str = ""
    """The agent's standing instructions: the system prompt."""
    max_tokens: int = 1024
    temperature: float | None = None
    retry_seconds: float = 60.0
    """How long the adapter may spend retrying transient provider errors (429, 529, 5xx,
    timeouts) inside this one attempt before it gives up (`ModelUnavailable`)."""


class ModelReply(BaseModel):
    """A model's decision and what it cost. An adapter may return a bare `Decision` (a
    scripted policy does): then nothing is known of its usage."""

    model_config = ConfigDict(frozen=True)

    decision: Decision
    usage: Usage | None = None


class Model(Protocol):
    """Decides one step: Claude on the Anthropic API or Bedrock, an agent's scripted policy,
    or your own (a run names it `module:attr`; see docs/models.md for a worked example).

    Contract:
    - `decide` returns the step's `Decision`: a `ToolCall` naming one of `request.tools`
      with its arguments as a JSON object (the engine validates them against the tool's
      model), or `Done(summary=...)`. Return it in a `ModelReply` with the call's `Usage`
      (`calls=1`) so the step record, the run's totals and its estimated cost include it.
    - The engine calls it with no lock held and no state of its own: everything the model
      may know is in the request. Keep no memory between calls; a retried step must be
      decided from its request alone.
    - Failures are typed: `ModelUnavailable` when the provider cannot answer (transient by
      default; pass `transient=False` when retrying cannot help, e.g. a rejected key),
      `ModelOutputInvalid` when it answers with neither one known tool call nor DONE. Any
      other exception counts as a failed attempt too (`ModelFailed`).
    - Retry transient provider errors (rate limits, overload, timeouts) inside `decide`,
      with backoff and the provider's `retry-after`, for at most `request.retry_seconds`
      from the first call; then raise `ModelUnavailable`. Only then does the engine count a
      failed attempt (the third fails the run), so every try that does count is recorded.
    """

    def decide(self, request: ModelRequest) -> Decision | ModelReply: ...


class BlobStore(Protocol):
    """Large tool outputs, stored by content hash so the state only holds a reference."""

    def put(self, data: bytes) -> BlobRef: ...

    def get(self, ref: BlobRef) -> bytes: ...


class ApprovalBook(Protocol):
    """Where approvals are kept (SQLite locally; the run's partition of the checkpoints table
    on AWS, beside the parked execution's task token).

    Contract:
    - `open` stores a new pending approval. Locally it is idempotent per run and step: if a
      pending one exists for that step, that one is returned and nothing is written.
    - `settle` moves an approval from `pending` to a decided status, once: if it is no longer
      pending it raises `ApprovalDecided` and changes nothing. An expired one raises
      `ApprovalExpired`. Conditional on the stored status, so two deciders cannot both win.
    - `reopen` moves a settled approval back to `pending` when its answer could not be
      delivered for now; `close` marks every pending approval of a run's step with `status`
      (the run was decided some other way, or the request timed out).
    """

    def open(self, approval: Approval, *, task_token: str | None = None) -> Approval: ...

    def get(self, run_id: str, approval_id: str) -> Approval | None: ...

    def of_run(self, run_id: str) -> list[Approval]: ...

    def settle(
        self, approval: Approval, verdict: Verdict, *, channel: str, at: datetime
    ) -> Approval: ...

    def reopen(self, approval: Approval) -> None: ...

    def close(self, run_id: str, step: int, status: ApprovalStatus, *, at: datetime) -> None: ...


class Resumer(Protocol):
    """Delivers a settled decision to the waiting run, given its head as the desk read it:
    locally the engine records it, conditional on that head's version (read again only if
    it moved); on AWS the parked execution is answered with its task token, and the run
    records it later (`RecordDecision`). Returns the run as it now stands. Raises
    `ApprovalClosed` when the run can no longer take it (not waiting; the task timed out or
    was closed)."""

    def resume(self, approval: Approval, verdict: Verdict, run: RunState) -> RunState: ...


class Mailbox(Protocol):
    """The events sent to runs (SQLite locally; the run's partition of the checkpoints table
    on AWS), each accepted once and consumed at most once.

    Contract (`tests/conformance/test_mailbox_contract.py`):
    - `post` stores the event if its `(run_id, event_id)` is new and returns it with True; if
      it exists, it returns the stored one with False and changes nothing (a sender's retry).
      `reserved` are the names the run needs (those its agent declares, the one it waits
      for): each has a room of its own, and every other name shares one. A room holding
      `MAX_MAILBOX_EVENTS` pending events refuses one more of its names (`MailboxFull`), so a
      flood of other names never refuses a reserved one.
    - `get` reads one back; `of_run` lists a run's events in the order they arrived;
      `next_for(run_id, name)` is the first pending event of that name, or None.
    - consuming is the checkpoint store's `commit` (`Commit.consumes`), so an event is taken
      by a step's wait in the same write that records it; `refuse` marks a pending event
      that the wait it reached cannot take (its payload fails the schema), with the reason.
    - every read sees every write that returned before it, from any process.
    """

    def post(
        self, event: SentEvent, *, reserved: Collection[str] = ()
    ) -> tuple[SentEvent, bool]: ...

    def get(self, run_id: str, event_id: str) -> SentEvent | None: ...

    def of_run(self, run_id: str) -> list[SentEvent]: ...

    def next_for(self, run_id: str, name: str) -> SentEvent | None: ...

    def refuse(self, run_id: str, event_id: str, reason: str) -> None: ...


WakeHow = Literal["event", "children", "woken", "decided"]
"""What settled a wait whose parked execution a waker then wakes: an event (or a webhook
delivery), the ends of child runs, a sleep cut short, a person's decision."""


@dataclass(frozen=True)
class OpenWait:
    """One run's open wait, as the local book of open waits lists it."""

    run_id: str
    step: int
    kind: str
    """`person`, `event` or `timer`."""
    name: str | None = None
    due_at: datetime | None = None
    """When it settles by itself (a timer's time, an event wait's timeout), if it does."""


class WaitBook(Protocol):
    """The local runtime's book of open waits, kept by the checkpoint store in the commits
    that park and settle runs (on AWS, Step Functions keeps the waits: a `Wait` state, a
    parked task's timeout). A worker reads it to settle what is due."""

    def due(self, now: datetime) -> list[OpenWait]: ...

    def answered(self) -> list[OpenWait]: ...

    def children(self) -> list[OpenWait]: ...

    def next_due(self) -> datetime | None: ...


HOOK_ID_PATTERN = r"^[a-f0-9]{32}$"
"""A webhook's id: 128 bits of an HMAC under the deployment's hook key (`ratchet.waiting.hooks`)."""


class Hook(BaseModel):
    """A signed webhook URL for one event name of one run: `POST /hooks/<hook_id>`. The id
    opens nothing by itself (every delivery is signed with the hook's secret, derived from
    the id and never stored), so the record holds no secret."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hook_id: str = Field(pattern=HOOK_ID_PATTERN)
    run_id: str
    name: str
    created_at: datetime


class HookBook(Protocol):
    """Where hooks are kept (a table of the SQLite store locally; an item of its own partition
    in the checkpoints table on AWS), looked up by the id a delivery's URL carries.

    Contract (`tests/conformance/test_hook_book_contract.py`):
    - `add` stores the hook if its id is new and returns it with True; if the id exists it
      returns the stored one with False and changes nothing (the id is derived from the run
      and the name, so adding a hook twice finds the first).
    - `get` reads one back by id, or None; it never writes.
    """

    def add(self, hook: Hook) -> tuple[Hook, bool]: ...

    def get(self, hook_id: str) -> Hook | None: ...


@dataclass(frozen=True)
class OpenedHook:
    hook: Hook
    url: str
    secret: str


class HookOpener(Protocol):
    """Opens a run's webhooks: what a client gets from its runtime (`Runtime.hooks`), which
    builds one (`ratchet.runtime.hooks.Hooks`). Here, below both, so that the client names
    nothing of the runtime it acts through."""

    def open(self, run_id: str, name: str) -> OpenedHook:
        """The hook of `name` on the run (made if it is new), its URL and its secret; the
        refusals are `Hooks.open`'s."""
        ...


class Notifier(Protocol):
    """Tells people that a run waits for them (email, Slack, a local outbox). A notifier
    sends to the recipients of its own channel in the notice and ignores the rest."""

    def send(self, notice: ApprovalNotice) -> None: ...


MAX_DATA_KEY_CHARS = 512
"""The longest key of a run's data (a DynamoDB sort key holds 1 KB; the prefix needs room)."""
MAX_DATA_VALUE_BYTES = 64 * 1024
"""The largest value of a run's data, in UTF-8 bytes: far under DynamoDB's 400 KB item."""


class RunData(Protocol):
    """A run's own durable key-value data, kept by the runtime's store: what an agent's tools
    keep instead of files (locally in the SQLite store, on AWS in the stack's app table). One
    instance serves one run; no run sees another's keys.

    Contract (`tests/conformance/test_run_data_contract.py`):
    - keys are 1-`MAX_DATA_KEY_CHARS` characters and at most 1,024 UTF-8 bytes (a DynamoDB
      sort key), values text of at most
      `MAX_DATA_VALUE_BYTES` UTF-8 bytes; anything else is `InvalidInput`, nothing written.
    - `put_once(key, value)` writes the value only if the key has none: True if it wrote, False
      (nothing changed) if the key existed, whatever its value. It is the idempotent write a
      side-effecting tool makes under its step's key, so a retried step writes nothing twice.
    - `put(key, value)` writes or overwrites; `get(key)` reads it back (None if absent);
      `delete(key)` removes it if present.
    - `items(prefix)` lists (key, value) whose key starts with `prefix`, ordered by key.
    - every read sees every write that returned before it, from any process.
    """

    def get(self, key: str) -> str | None: ...

    def put(self, key: str, value: str) -> None: ...

    def put_once(self, key: str, value: str) -> bool: ...

    def delete(self, key: str) -> None: ...

    def items(self, prefix: str = "") -> list[tuple[str, str]]: ...


class ConcurrencyBound(NamedTuple):
    """How many runs of an agent may work a step at once (`ratchet.limits`), and whose slots
    they take: the agent's name (`Agent.name`), which every reference to the agent loads, so
    its runs share one bound however they name it. `limit` bounds all its runs (None: no
    bound), `per_key` those of each `concurrency_key` (None: no bound)."""

    agent: str
    limit: int | None
    per_key: int | None = None

    def key_slots(self, key: str) -> str:
        """The name of the slots of the agent's runs of `key` (a key has no '#')."""
        return f"{self.agent}#key#{key}"


class Slots(Protocol):
    """At most `limit` holders of a name's slots at a time (on AWS, the steps of a bounded
    agent's runs, under its `ConcurrencyBound.agent`, and those of each of its keys, under
    `ConcurrencyBound.key_slots`). A slot lapses `seconds` after it was taken, so a holder that
    died frees it on its own.

    Contract (`tests/conformance/test_slots_contract.py`):
    - a take refused marks its holder as waiting, with its `priority`, from its first refused
      take; the mark lapses a while after its last (a waiter that stopped asking: its run was
      cancelled, its execution died) and is cleared by its take that succeeds;
    - a take succeeds only while the live holders, and the waiters that rank above the taker
      (`ratchet.state.effective_priority`: higher priority, grown by the time waited; of two
      alike, the one waiting longer), leave a slot free: so the freed slot goes to the
      highest, and a run of low priority, its priority growing, is never passed over for good.
    """

    def take(
        self, name: str, limit: int, holder: str, seconds: float, *, priority: int = 0
    ) -> bool:
        """Take one of `name`'s slots for `holder`, atomically against every other taker:
        True if taken (or `holder` already held one, now renewed), False if all `limit` are
        held by others whose time has not lapsed, or are owed to waiters ranked above it."""
        ...

    def release(self, name: str, holder: str) -> None:
        """Give back `holder`'s slot of `name`, if it holds one (never another's)."""
        ...


class RateLimit(Protocol):
    """At most `per_minute` requests under a name in each minute of the clock (a fixed
    window: up to twice that may fall within one minute that straddles two), counted across
    every process that shares the store."""

    def take(self, name: str, per_minute: int) -> float:
        """Count one request against this minute's: 0.0 if it is within `per_minute` (and it
        is counted), else the seconds until the next minute begins (and nothing is)."""
        ...


class DailySpend(Protocol):
    """What an agent's runs spent on model calls each day (UTC), in millionths of a US dollar,
    shared by every run and every process of a store or deployment: one counter per agent and
    day, moved only by conditional writes. A call is reserved before it is made (`reserve`,
    only while the day's total stays within its limit) and settled once its usage is known
    (`settle`), so the counter never passes the limit (plus what a person raised the day by,
    `raise_budget`), whoever reserves at once."""

    def reserve(self, agent: str, day: str, amount: int, limit: int) -> bool:
        """Add `amount` to the agent's spend on `day` (`YYYY-MM-DD`) if the total stays at
        most `limit` plus the day's raises, and say so; else change nothing and return
        False."""
        ...

    def raise_budget(self, agent: str, day: str, amount: int) -> int:
        """Let the agent spend `amount` more on `day` than its limit; the day's raises in all."""
        ...

    def raised(self, agent: str, day: str) -> int:
        """What the agent's limit on `day` was raised by, in all (0: never)."""
        ...

    def settle(self, agent: str, day: str, reserved: int, used: int) -> None:
        """Replace a reservation of `reserved` on `day` by what was `used` (at most as much):
        the day's spend moves by `used - reserved`."""
        ...

    def spent(self, agent: str, day: str) -> int:
        """The agent's spend on `day`, reservations not yet settled included (0: none)."""
        ...


class ChildRuns(Protocol):
    """Runs that runs start (`start_runs`), for the engine: started before the step that
    starts them commits, and told of their end so their parent's wait settles
    (`ratchet.children`)."""

    def start(self, parent: RunState, step: int, request: StartRuns) -> list[str]:
        """Create (and on AWS start) each run `request` names, under the ids derived from
        the parent's step (`child_run_id`), in their order: a child that exists already is
        left as it is, so a retried step starts none twice. Every spec is checked before any
        run is created; a spec no run can be started from is `ChildRunsRefused`. The
        parent's head is read before each child is created: once it shows the step cut off
        by a cancel (`RunState.cut_off_at`), no more are, and `StaleVersion` ends the step
        (its commit would be refused). Returns the children's ids."""
        ...

    def cancelled(self, run: RunState, *, by: str) -> None:
        """Told of a run the engine just cancelled, as it stood when cancelled (`run`):
        cancel the child runs it started that have not ended, as `by` (the runtime's cancel,
        so their requests close, their executions stop, and theirs are cancelled in turn).
        Those are the children its wait waits for, if it waited for children, and those the
        step under way had created when the cancel cut it off (no record names them: they
        are found by their derived ids). Raises what it could not do."""
        ...

    def after(self, head: RunState) -> None:
        """Told of a run's head after the engine moved it (or found it ended): a child that
        ended settles its parent's wait if that was the last (or, with `wait="first"`, the
        first) it waited for; a parent that just parked on its children settles at once if
        they have ended already. Never raises for what it could not do: a parent left
        waiting is settled by the next child, or by the runtime's sweep."""
        ...
