"""The checkpoints table's stream, read for the changes of a run's status, and EventBridge,
where each is put (`ratchet.handlers.status_events`).

A commit is one transaction writing the run's head and its record, and the table's stream
(new and old images) holds every write of an item, in order per item, for 24 hours. A change
of a run's status is a write of its head whose old image's status differs from its new one's
(or the head's first write: the run's start). Reading it there, and not from the step that
commits, is what loses none: a step whose function dies right after its commit has written
the head, and the stream holds it until the stream's reader has put its event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ratchet.adapters.dynamodb.items import translated_errors
from ratchet.adapters.dynamodb.store import HEAD_SK
from ratchet.errors import EventsNotPut
from ratchet.state import RunStatus

PUT_BATCH = 10
"""EventBridge takes at most ten entries per PutEvents."""


@dataclass(frozen=True)
class HeadChange:
    """A write of a run's head that changed its status."""

    run_id: str
    agent: str
    version: int
    step: int
    updated_at: datetime
    status: RunStatus
    previous: RunStatus | None


def head_change(record: Mapping[str, Any]) -> HeadChange | None:
    """The change of status a stream record holds, or None (another item, the same status, a
    head removed)."""
    if record.get("eventName") not in ("INSERT", "MODIFY"):
        return None
    images = record.get("dynamodb", {})
    if images.get("Keys", {}).get("sk", {}).get("S") != HEAD_SK:
        return None
    new, old = images.get("NewImage", {}), images.get("OldImage")
    status = RunStatus(new["status"]["S"])
    previous = RunStatus(old["status"]["S"]) if old and "status" in old else None
    if status is previous:
        return None
    return HeadChange(
        run_id=new["run_id"]["S"],
        # A head written before heads kept the agent says it in its state.
        agent=new["agent"]["S"] if "agent" in new else _agent_of(new),
        version=int(new["version"]["N"]),
        step=int(new["step"]["N"]),
        updated_at=datetime.fromisoformat(new["updated_at"]["S"]),
        status=status,
        previous=previous,
    )


def _agent_of(head: Mapping[str, Any]) -> str:
    for attribute in ("static", "state"):
        if attribute in head:
            agent = json.loads(head[attribute]["S"]).get("agent")
            if agent:
                return str(agent)
    return ""


class EventBridgeEvents:
    """Puts events of one source and detail type on a bus."""

    def __init__(self, events: Any, *, bus: str, source: str, detail_type: str) -> None:
        self._events = events
        self._bus = bus
        self._source = source
        self._detail_type = detail_type
        self._table = f"event bus {bus}"  # what `translated_errors` names

    @translated_errors
    def put(self, details: Sequence[str]) -> None:
        """Put an event of each detail (JSON), in order; `EventsNotPut` if EventBridge turned
        any away (the caller's batch is read again: those put already come twice)."""
        for first in range(0, len(details), PUT_BATCH):
            batch = details[first : first + PUT_BATCH]
            answer = self._events.put_events(
                Entries=[
                    {
                        "Source": self._source,
                        "DetailType": self._detail_type,
                        "Detail": detail,
                        "EventBusName": self._bus,
                    }
                    for detail in batch
                ]
            )
            if answer.get("FailedEntryCount"):
                failed = [e for e in answer.get("Entries", []) if e.get("ErrorCode")]
                code = failed[0].get("ErrorCode") if failed else "unknown"
                raise EventsNotPut(f"EventBridge turned away {len(failed)} event(s): {code}")
