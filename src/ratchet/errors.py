"""One exception hierarchy for Ratchet.

The AWS state machine matches these class names in its Retry and Catch clauses, so a rename
here is a change to the deployed contract.
"""

from __future__ import annotations

import errno

TYPE_CHECKING = False  # `typing` is not loaded: the quick read commands import this module
if TYPE_CHECKING:
    from datetime import datetime

    from ratchet.state import Usage


class RatchetError(Exception):
    """Base class of every error Ratchet raises on purpose."""


class InvalidInput(RatchetError):
    """A caller passed something malformed: a bad run id, an oversized goal, a bad option."""


class RunNotFound(RatchetError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"no run with id {run_id!r} in this store")
        self.run_id = run_id


class RunAlreadyExists(RatchetError):
    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} already exists")
        self.run_id = run_id


class NotWaiting(RatchetError):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is {status}, not waiting for a decision")
        self.run_id = run_id
        self.status = status


class NotRetryable(InvalidInput):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is {status}: only a failed run can be retried")
        self.run_id = run_id
        self.status = status


class NotCancellable(InvalidInput):
    def __init__(self, run_id: str, status: str) -> None:
        super().__init__(f"run {run_id!r} is already {status}: there is nothing to cancel")
        self.run_id = run_id
        self.status = status


class NotResumable(InvalidInput):
    """`resume` found nothing for it to do: the run has ended, or an execution works it."""

    def __init__(self, run_id: str, why: str) -> None:
        super().__init__(f"run {run_id!r} {why}")
        self.run_id = run_id


class StaleVersion(RatchetError):
    """Another worker advanced the run since we read it: our write was rejected, nothing changed."""

    def __init__(self, run_id: str, expected_version: int) -> None:
        super().__init__(
            f"run {run_id!r} is no longer at version {expected_version}: another worker "
            "advanced it, this write was rejected"
        )
        self.run_id = run_id
        self.expected_version = expected_version


class CheckpointTooLarge(RatchetError):
    """A record would exceed the store's item limit. Raised before the write, never retried."""

    def __init__(self, what: str, size: int, limit: int) -> None:
        super().__init__(
            f"{what} is {size:,} bytes, over the {limit:,}-byte limit; store large tool "
            "outputs as blobs and keep the working state bounded"
        )
        self.size = size
        self.limit = limit


class UnsupportedSchema(RatchetError):
    """A stored state was written by a newer Ratchet than this one."""


class RunUnreadable(RatchetError):
    """A run's stored head cannot be parsed (tampered or corrupted): no step can be taken and
    nothing can be written to it, since every write is a fold of the head that was read."""

    def __init__(self, run_id: str, cause: str) -> None:
        super().__init__(f"run {run_id!r} cannot be read: {cause}")
        self.run_id = run_id


class BlobCorrupt(RatchetError, ValueError):
    """A blob's bytes do not match the SHA-256 that names it: never used, never retried."""

    def __init__(self, sha256: str, where: str) -> None:
        super().__init__(
            f"blob {sha256} is corrupt in {where}: its bytes do not match their SHA-256"
        )
        self.sha256 = sha256


class BlobTampered(BlobCorrupt):
    """A sealed blob fails its authentication: as a corrupt one, never used, never retried."""

    def __init__(self, address: str, where: str, key_id: str) -> None:
        RatchetError.__init__(
            self,
            f"blob {address} is corrupt in {where}: it fails its authentication under key "
            f"{key_id!r}",
        )
        self.sha256 = address


class BlobMissing(BlobCorrupt):
    """A blob a run references is not in the blob store (removed by hand, or lost). The same
    rule as a corrupt one: what was stored is gone, so no retry can bring it back, and the run
    fails at once rather than after three strikes."""

    def __init__(self, sha256: str, where: str) -> None:
        RatchetError.__init__(self, f"blob {sha256} is missing from {where}")
        self.sha256 = sha256


class PayloadKeyMissing(RatchetError):
    """A stored payload is sealed with a key this process does not have (`RATCHET_PAYLOAD_KEY`
    unset, a keyring without that key, a KMS key it may not use): nothing of it is shown, and
    nothing is retried, since no retry brings the key back."""

    def __init__(self, key_id: str, why: str) -> None:
        super().__init__(f"a stored payload is sealed with key {key_id!r}: {why}")
        self.key_id = key_id


class PayloadTampered(RatchetError):
    """A sealed payload fails its authentication (AES-GCM's tag): its bytes, or where it was
    put, are not what was sealed. Never opened, never retried."""

    def __init__(self, key_id: str, what: str) -> None:
        super().__init__(
            f"{what} sealed with key {key_id!r} fails its authentication: it was damaged or "
            "tampered with, or moved from where it was stored"
        )
        self.key_id = key_id


class StoreUnavailable(RatchetError):
    """The store could not be opened or read (missing file, not a database, bad URL)."""


class StoreMissing(StoreUnavailable):
    """There is no store at the path (nothing has started a run there)."""


class StoreDamaged(StoreUnavailable):
    """A row or page of the store cannot be read: text that is not UTF-8, a damaged page. Where
    the damaged row belongs to one run, the adapter says `RunUnreadable` for that run instead,
    and the other runs go on. `detail` says what is damaged, without the store's path."""

    def __init__(self, message: str, *, detail: str) -> None:
        super().__init__(message)
        self.detail = detail


class StackUnreachable(InvalidInput):
    """A deployed stack cannot be asked anything: no AWS credentials, credentials AWS refuses,
    no region, an endpoint that does not answer. `ratchet doctor` stops at once (bad input)."""


class StackPartUnreadable(RatchetError):
    """One part of a deployed stack could not be read (a permission the caller lacks, an
    answer not understood): `ratchet doctor` reports that check as failed and goes on."""


class StoreBusy(RatchetError):
    """The store turned a request away for now (throttling, a transaction conflict, a
    transient service error) after the SDK's own retries. Retrying the step is safe: nothing
    partial was written, and an attempt already counted stands."""


class StoreUnreachable(StoreBusy):
    """The store's database cannot be reached at all (it stopped, restarted, or the network
    to it is down), as distinct from one request turned away: an outage, which a worker waits
    out without counting it against the step it was taking. `attempt_version` is the head's
    version after the engine counted the step's attempt, when the outage cut that attempt
    short: the attempt is owed back once the store answers again."""

    attempt_version: int | None = None


class EventsNotPut(RatchetError):
    """EventBridge turned away some of a batch of a run's status change events: the stream's
    batch is read again (those put already come twice, each with its id)."""


class IdempotencyConflict(RatchetError):
    """The same idempotency key was used with different arguments: never applied silently."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used with different arguments; refusing to "
            "apply it again"
        )
        self.key = key


class JsonOverLimit(InvalidInput, ValueError):
    """JSON from outside (a flag, a request body, a form field) longer or nested deeper than
    Ratchet takes, refused before it is parsed: Python's `json` and pydantic recurse, so deep
    nesting would end in a RecursionError. `field` is where it came from (`--input`,
    `input`); `reason` says what is wrong without quoting it."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field} is {reason}")
        self.field = field
        self.reason = reason


class JsonTooDeep(JsonOverLimit):
    """Nested deeper than `ratchet.untrusted.MAX_JSON_DEPTH` levels."""


class JsonTooLarge(JsonOverLimit):
    """Longer than the boundary takes."""


class ImportInterrupted(RatchetError):
    """A user's module raised KeyboardInterrupt while it was imported (their code, or a
    Ctrl-C): the command ends as an interrupted one does (exit 130), saying where."""


class AgentNotFound(RatchetError):
    """An --agent or --scenario reference did not resolve to an Agent."""


class AgentUnloadable(AgentNotFound):
    """A run's agent cannot be loaded in this process (a worker started in another folder, a
    bundle without the agent's module): the process's fault, not the run's. Its step is not
    taken and no attempt is counted; the run waits for a process that can load the agent."""

    def __init__(self, run_id: str, agent: str, why: str) -> None:
        self.run_id = run_id
        self.agent = agent
        super().__init__(
            f"cannot load agent {agent!r} here, so run {run_id} is left as it is: {why}"
        )


class ScheduleInvalid(InvalidInput):
    """A schedule refused before anything was written: `str()` is `<field>: <why>`, which
    may quote what was given (the CLI's line); `field` is the one at fault."""

    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


class ScheduleExists(ScheduleInvalid):
    """The store has a schedule of that name."""


class ScheduleNotFound(ScheduleInvalid):
    """The store has no schedule of that name."""


class SchedulesNotKept(InvalidInput):
    """This runtime keeps no schedules: on AWS they are declared in the project's
    `[tool.ratchet] schedules` and deployed with the stack as EventBridge Scheduler's."""


class Superseded(RatchetError):
    """Another execution already parks this run for a person: this one stops, changing
    nothing. The state machine catches this name."""

    def __init__(self, run_id: str) -> None:
        super().__init__(f"run {run_id!r} is already waiting under another execution")
        self.run_id = run_id


class ApprovalError(RatchetError):
    """A decision that cannot be taken; `http_status` is what a page or API answers."""

    http_status = 400


class LinkInvalid(ApprovalError):
    """An approval link that was forged, changed or cut short."""

    http_status = 403


class LinkOfAnotherStore(LinkInvalid):
    """An approval link signed with another store's key (its `kid` says whose): real,
    perhaps, but not this server's to decide."""


class ApprovalExpired(ApprovalError):
    http_status = 410


class ApprovalNotFound(ApprovalError):
    http_status = 404


class ApprovalDecided(ApprovalError):
    """The approval was decided already; nothing changed."""

    http_status = 409


class ApprovalClosed(ApprovalError):
    """The run cannot take this answer any more (it stopped waiting, or its parked task
    timed out or was closed); nothing changed."""

    http_status = 409


class AnswerInvalid(ApprovalError):
    """An answer the request's schema refuses (the message names the field, and may quote
    what was given), or an answer missing where the request asks for one; nothing changed.
    `field` is the answer's field at fault (None: the answer as a whole) and `reason` what is
    wrong with it, quoting nothing given, for an API to name the field apart."""

    http_status = 400

    def __init__(
        self, message: str, *, field: str | None = None, reason: str = "", cli: str | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.reason = reason or message
        self._cli = cli

    def for_cli(self) -> str:
        """The refusal as `ratchet approve` says it: how to give the answer, where it helps."""
        return self._cli or str(self)


class WaitError(RatchetError):
    """An event, a wake or a webhook delivery that cannot be taken; nothing changed.
    `http_status` is what the runs API and the hook route answer."""

    http_status = 400


class RunEnded(WaitError):
    """The run has ended: it takes no more events (they would never be read)."""

    http_status = 409


class EventNotAwaited(WaitError):
    """The run's agent names the events it waits for, and not this one."""

    http_status = 404


class MailboxFull(WaitError):
    """The run's mailbox holds as many unread events as it keeps in the room of the event's
    name (`MAX_MAILBOX_EVENTS`: per name the run needs, and for all others together)."""

    http_status = 429


class PayloadTooLarge(WaitError):
    http_status = 413


class NotSleeping(WaitError):
    """Only a run that sleeps (`sleep`, `sleep_until`) can be woken."""

    http_status = 409


class StepAttemptFailed(RatchetError):
    """One attempt at a step failed; the step may be retried (the third attempt fails the run).

    The engine has counted the attempt, durably, before the work began, and has recorded the
    error as an `attempt_failed` checkpoint when this is raised (unless the store refused that
    write too, which the engine logs). `transient` says the cause may pass by itself (a busy
    store, a full disk, a dropped connection, a rate limit): a worker should back off before
    the next attempt instead of trying again at once.

    `not_before` is when the next attempt may start, as the engine recorded it in the run's
    head with the failure (the backoff the attempt earned); None if it was not recorded.
    `usage` is what the attempt's model call used before the attempt failed (a `Usage`, kept
    in the failure's record and the run's totals); None when no call was paid for.
    """

    transient: bool = False
    not_before: datetime | None = None
    usage: Usage | None = None
    step: int | None = None
    attempt: int | None = None
    """Which step and attempt failed, once the engine counted it (None before)."""

    def __init__(self, message: str = "", *, transient: bool | None = None) -> None:
        super().__init__(message)
        if transient is not None:
            self.transient = transient


class ModelUnavailable(StepAttemptFailed):
    """The model API failed (rate limit, server error, timeout, connection)."""

    transient = True


class ModelOutputInvalid(StepAttemptFailed):
    """The model answered with neither a valid tool call nor DONE."""


class ModelFailed(StepAttemptFailed):
    """The model adapter (or an agent's scripted policy) raised an unexpected error."""


class ToolFailed(StepAttemptFailed):
    """A tool raised while handling a call, or returned something the run cannot keep."""


class RecordedDecisionInvalid(ToolFailed):
    """The decision recorded for the step no longer fits the agent: it names a tool the agent
    lacks, or arguments the tool's argument model refuses. A retry reuses the same recorded
    decision, so it would fail the same way: the run fails at once."""


class AgentSetupFailed(StepAttemptFailed):
    """The run's agent, model or resources could not be set up for the step (the agent's
    `resources` hook raised, or its module failed to load)."""


class StepTimedOut(StepAttemptFailed):
    """The step's agent code (hooks, model call, tool) did not finish within the agent's
    `step_timeout_seconds`. The engine abandoned it: whatever it returns later is discarded
    and can never be committed. Also raised for an attempt that spent its time waiting for
    such an abandoned call to end, without calling anything beside it.

    `still_running` is False only for a coroutine that was cancelled at the deadline and has
    ended: nothing of the attempt runs any more (its resources are free for the next)."""

    still_running: bool = True


class AbandonedCallRunning(RatchetError):
    """The run would be failed (its strikes are used up, or its failure is final), but a call
    of its agent that this process abandoned at a step deadline is still running: the run is
    not marked failed while that call may still act, and nothing was written. Only the end of
    the process ends the call; a worker, or the step function's next sandbox, then marks the
    run failed."""

    def __init__(self, run_id: str, step: int, waited: float) -> None:
        super().__init__(
            f"run {run_id}: a call of step {step} abandoned at its deadline is still running "
            f"{waited:g} s later, so the run is not marked failed while it may still act; "
            "ending this process ends the call, and the next worker marks the run failed"
        )
        self.run_id = run_id
        self.step = step


class CallUnderWay(RatchetError):
    """A retried step found its at-most-once call started with no outcome, and that call may
    still be running: its deadline is ahead (`because="deadline"`), or a process on this host
    holds it (`"held"`: a worker frozen in the call, say). No person is asked yet, so the step
    is not taken: the engine answers with `Outcome.QUEUED` after `seconds`, no attempt used.
    It never leaves the engine."""

    def __init__(self, key: str, seconds: float, because: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key
        self.seconds = seconds
        self.because = because


class ForkRefused(RatchetError):
    """Raise it from an agent's `fork` hook when the agent cannot give a fork data that matches
    its state (the data cannot be copied there, or predates what a copy needs). The fork is
    refused with the message as its reason, and nothing is written: `ratchet fork` exits 2,
    `POST /runs/{id}/fork` answers 409, `Client.fork` raises this."""


class PermanentError(RatchetError):
    """Raise it from a tool (or a scripted policy, or an agent hook) when retrying cannot help:
    the order does not exist, the account is closed. The run fails at once with the message,
    instead of trying the step twice more.

        @tool()
        def lookup_order(args: Order, ctx: ToolContext) -> str:
            order = shop.find(args.order_id)
            if order is None:
                raise PermanentError(f"no order {args.order_id}")
            return order.summary()

    Any other exception from a tool is a failed attempt, retried after a pause."""


class StepErrored(StepAttemptFailed):
    """Something other than the agent's code failed during the step: storing a blob, reading
    the ledger, or committing the step (an I/O error, a bug). The cause is in the message."""


class McpServerUnavailable(RatchetError):
    """An MCP server could not be reached, or broke off, while its tools were listed (a run's
    start, which is then refused with nothing written) or one was called (a failed attempt,
    retried as any other; an at-most-once call is then not made again, a person is asked)."""


class McpToolGone(PermanentError):
    """A tool pinned in the run is no longer on its MCP server: retrying cannot bring it back,
    so the run fails at once, naming the tool and the server."""


TERMINAL_ERRORS: tuple[type[Exception], ...] = (
    CheckpointTooLarge,
    IdempotencyConflict,
    UnsupportedSchema,
    RunUnreadable,
    BlobCorrupt,
    PermanentError,
    RecordedDecisionInvalid,
)
"""Errors that no retry can fix; the one place that says so.

During a step (raised by the agent's code, a blob read or the commit, or the cause of a
`StepAttemptFailed`) they fail the run at once with the cause, without a second attempt.
`UnsupportedSchema` and `RunUnreadable` are raised while loading the head, before any attempt:
nothing can be written to such a run, so the engine raises them and the caller must not retry
(a worker skips the run; the state machine fails the execution).
"""

_TRANSIENT_ERRNOS = frozenset(
    {
        errno.EAGAIN,
        errno.EBUSY,
        errno.ECONNABORTED,
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.EDQUOT,
        errno.EINTR,
        errno.EIO,
        errno.ENOBUFS,
        errno.ENOMEM,
        errno.ENOSPC,
        errno.ETIMEDOUT,
    }
)


def is_terminal(error: BaseException | None) -> bool:
    """True if `error`, or the error that caused it, is one of `TERMINAL_ERRORS`."""
    return error is not None and (
        isinstance(error, TERMINAL_ERRORS) or isinstance(error.__cause__, TERMINAL_ERRORS)
    )


def is_transient(error: BaseException | None) -> bool:
    """True if `error`, or its cause, may pass by itself: a busy store, a dropped connection,
    a momentarily full or failing disk, a model rate limit. Never for what no retry can fix
    (`TERMINAL_ERRORS`), whatever it was raised from: a `PermanentError("card declined")`
    raised from a dropped connection is permanent."""
    chain = []
    while error is not None:
        chain.append(error)
        error = error.__cause__
    if any(isinstance(link, TERMINAL_ERRORS) for link in chain):
        return False
    return any(_passes_by_itself(link) for link in chain)


def _passes_by_itself(error: BaseException) -> bool:
    if isinstance(error, StepAttemptFailed):
        return error.transient
    if isinstance(error, (StoreBusy, ConnectionError, TimeoutError)):
        return True
    return isinstance(error, OSError) and error.errno in _TRANSIENT_ERRNOS


class InjectedFault(RuntimeError):
    """Raised by RATCHET_FAULT=raise:... to simulate a crash at an exact point.

    Deliberately not a RatchetError: it stands for an unexpected crash, which the engine must
    survive without having been told about it.
    """


class WaitRequestInvalid(PermanentError, ValueError):
    """A wait a tool asked for that no retry can make valid: a sleep of -1 s or of ten
    years, a naive `sleep_until` time, an event name that is not one. The run fails at once,
    saying which, instead of trying the step twice more."""


class ChildRunsRefused(PermanentError, ValueError):
    """Child runs a tool asked for (`start_runs`) that no retry can start: an agent this
    deployment does not know, input its model refuses, a run nested too deep, a runtime that
    starts no child runs. Nothing was started; the run fails at once, saying which."""
