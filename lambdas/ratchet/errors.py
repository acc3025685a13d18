"""One exception hierarchy for Ratchet.

The AWS state machine matches these class names in its Retry and Catch clauses, so a rename
here is a change to the deployed contract.
"""

from __future__ import annotations


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


class StoreUnavailable(RatchetError):
    """The store could not be opened or read (missing file, not a database, bad URL)."""


class StoreBusy(RatchetError):
    """The store turned a request away for now (throttling, a transaction conflict, a
    transient service error) after the SDK's own retries. Retrying the step is safe: nothing
    partial was written, and an attempt already counted stands."""


class IdempotencyConflict(RatchetError):
    """The same idempotency key was used with different arguments: never applied silently."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"idempotency key {key!r} was already used with different arguments; refusing to "
            "apply it again"
        )
        self.key = key


class AgentNotFound(RatchetError):
    """An --agent or --scenario reference did not resolve to an Agent."""


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


class StepAttemptFailed(RatchetError):
    """One attempt at a step failed in an expected way; the step may be retried.

    The engine has already recorded the error and counted the attempt when this is raised.
    """


class ModelUnavailable(StepAttemptFailed):
    """The model API failed (rate limit, server error, timeout, connection)."""


class ModelOutputInvalid(StepAttemptFailed):
    """The model answered with neither a valid tool call nor DONE."""


class ToolFailed(StepAttemptFailed):
    """A tool raised while handling a call."""


class InjectedFault(RuntimeError):
    """Raised by RATCHET_FAULT=raise:... to simulate a crash at an exact point.

    Deliberately not a RatchetError: it stands for an unexpected crash, which the engine must
    survive without having been told about it.
    """
