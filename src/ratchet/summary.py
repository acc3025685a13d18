"""A run's documents in words and numbers, for every reader of a run: the Python client's
`Checkpoint` and `UsageTotals`, the `ratchet` command's read commands and the runs dashboard.

A document is what a store holds as JSON (a checkpoint record, its event), or the same thing
dumped from the models. The functions here are pure and load neither pydantic, typer nor rich:
the quick read commands (`ratchet.cli.quick`) answer through them straight from a SQLite file.
"""

from __future__ import annotations

from ratchet import quickjson as json  # `json`'s text, without loading `re`

TYPE_CHECKING = False  # `typing` takes longer to load than a quick read takes to answer
if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sequence
    from datetime import datetime
    from typing import Any
else:  # the C type that `datetime.datetime` is, without the module's pure-Python half
    from _datetime import datetime

USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "calls")
_EVENTS_WITH_USAGE = frozenset({"step", "attempt_failed", "finished"})
ARGUMENTS_CHARS = 60
"""A call's arguments are cut to this many characters where a line shows them."""
UNRECORDED_VERSIONS = (
    "attempts counted (or given back) at the next step: a write to the head alone, with no "
    "checkpoint record"
)


def iso(value: str | datetime) -> str:
    """A time as `datetime.isoformat` writes it (`+00:00`, where pydantic's JSON says `Z`)."""
    return (datetime.fromisoformat(value) if isinstance(value, str) else value).isoformat()


def usage_totals(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Token counts (absent ones 0) and the share of the input read from the prompt cache."""
    counts = {name: int((usage or {}).get(name, 0)) for name in USAGE_COUNTS}
    prompt = counts["input_tokens"] + counts["cache_read_tokens"] + counts["cache_write_tokens"]
    share = counts["cache_read_tokens"] / prompt if prompt else 0.0
    return {**counts, "cached_share": round(share, 4)}


# --- history ----------------------------------------------------------------------------------


def checkpoint_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """A `history` row (the fields of `ratchet.client.Checkpoint`) from a checkpoint record:
    `version`, `step`, `status`, `worker`, `bytes`, `time` and the `event` document."""
    event = record["event"]
    usage = event.get("usage") if event["kind"] in _EVENTS_WITH_USAGE else None
    return {
        "version": record["version"],
        "step": record["step"],
        "status": record["status"],
        "event": event["kind"],
        "worker": record["worker"],
        "bytes": record["bytes"],
        "time": iso(record["time"]),
        "usage": usage_totals(usage) if usage is not None else None,
        "explanation": "",
        "tool": None,
        "arguments": None,
        "result": None,
        "by": None,
        "comment": None,
        "error": None,
        "duration_ms": None,
        "attempt": None,
        **described(event),
    }


def described(event: Mapping[str, Any]) -> dict[str, Any]:
    """What one event says of itself: what ran, who decided, what failed, and the write in
    words ("step committed", "person decided by dana: approved: ok", ...)."""
    kind = event["kind"]
    if kind == "step":
        started = event.get("started") or []
        said = "step committed" + _waits_for(event.get("wait"))
        if started and not event.get("wait"):
            said += f"; started {len(started)} child run{'s' if len(started) != 1 else ''}"
        call = event["call"]
        return {
            "tool": call["name"],
            "arguments": dict(call.get("arguments") or {}),
            "result": event["output"]["text"],
            "duration_ms": event["duration_ms"],
            "attempt": event["attempt"],
            "explanation": said,
        }
    if kind == "decided":
        said = f"person decided by {event['by']}: {'approved' if event['approved'] else 'rejected'}"
        comment = event.get("comment", "")
        return {
            "by": event["by"],
            "comment": comment,
            "explanation": f"{said}: {comment}" if comment else said,
        }
    if kind == "settled":
        how = event["how"]
        name = event.get("name")
        sent = f" ({event['event_id']})" if event.get("event_id") else ""
        said = {
            "event": f"event {name!r} arrived{sent}",
            "timeout": f"no {name!r} event in time",
            "due": "woke: the time came",
            "woken": f"woken early by {event.get('by')}"
            if str(event.get("text", "")).startswith("Woken early")
            else f"woken by {event.get('by')} after its time had come",
            "children": _children_ended(event.get("children") or []),
        }.get(how, f"wait settled: {how}")
        return {"by": event.get("by"), "result": event["text"], "explanation": said}
    if kind == "attempt_failed":
        error = event["error"]
        said = f"attempt {event['attempt']} at step {event['step']} failed: {error}"
        return {"error": error, "attempt": event["attempt"], "explanation": said}
    if kind == "finished":
        said = f"finished: {event['status']}"
        why = event.get("error") or event.get("summary")
        return {"error": event.get("error"), "explanation": f"{said}: {why}" if why else said}
    if kind == "retried":
        return {"by": event["by"], "explanation": f"retried by {event['by']}"}
    if kind == "reserved":
        held = f"{_dollars(event.get('usd', 0.0))}, {event.get('tokens', 0):,} tokens"
        said = f"reserved up to {held} of the budget for step {event['step']}"
        return {"attempt": event["attempt"], "explanation": said}
    if kind == "budget_asked":
        prompt = event["request"]["prompt"]
        return {"explanation": f"asked a person to raise the budget: {prompt}"}
    return {"explanation": "created"}


def wait_kind(request: Mapping[str, Any]) -> str:
    """`person`, `event`, `timer` or `children`: `ratchet.state.wait_kind` for a wait as
    JSON, dumped (with its `kind`) or stored (a head leaves the fields at their defaults out,
    `kind` among them; a record from before there were other waits has none): each kind has
    a field the others lack. A unit test holds the two equal."""
    kind = request.get("kind")
    if kind in ("event", "timer", "children"):
        return str(kind)
    if "name" in request:
        return "event"
    if "until" in request or "seconds" in request:
        return "timer"
    if "children" in request:
        return "children"
    return "person"


def _children_ended(children: list[Mapping[str, Any]]) -> str:
    """`child runs ended: 2 done, 1 failed` (and those still running, for a `first` wait)."""
    counts: dict[str, int] = {}
    for child in children:
        counts[child["status"]] = counts.get(child["status"], 0) + 1
    return "child runs ended: " + ", ".join(f"{n} {status}" for status, n in counts.items())


def _waits_for(wait: Mapping[str, Any] | None) -> str:
    """What the step's record says it waits for, from its stored JSON (a record written
    before other waits existed holds an approval request with no `kind`)."""
    if wait is None:
        return ""
    if wait.get("kind") == "event" or "name" in wait:
        return f"; waits for the event {wait['name']!r}"
    if wait.get("kind") == "timer" or "until" in wait or "seconds" in wait:
        until = wait.get("until")
        return f"; sleeps until {until}" if until else "; sleeps"
    if wait.get("kind") == "children" or "children" in wait:
        count = len(wait["children"])
        which = "the first of" if wait.get("wait") == "first" else "all"
        return f"; waits for {which} {count} child run{'s' if count != 1 else ''}"
    return "; asked a person"


def version_gaps(
    versions: list[int], head_version: int, *, first: int | None = None
) -> list[tuple[int, int]]:
    """The version ranges no checkpoint records, as (first, last): each was an attempt
    counted at the next step (or a counted attempt given back) before its work started,
    a write to the head alone. `versions` is the history's, oldest first, from version
    `first` (default: its first) on."""
    gaps = []
    expected = first if first is not None else versions[0] if versions else 1
    for version in [*versions, head_version + 1]:
        if version > expected:
            gaps.append((expected, version - 1))
        expected = max(expected, version + 1)
    return gaps


def interleaved(versions: Sequence[int], gaps: Iterable[tuple[int, int]]) -> Iterator[int | str]:
    """The rows of a history in order, by their index in `versions` (ascending), each run of
    versions without a row as its span (`"3"`, `"3..5"`) just before the first row past it."""
    pending = sorted(gaps)
    for index, version in enumerate(versions):
        while pending and pending[0][0] < version:
            yield version_span(*pending.pop(0))
        yield index
    for gap in pending:
        yield version_span(*gap)


def only_counted(event: str | None, attempt: int | None, status: str | None, versions: int) -> bool:
    """Whether `versions` with no record, just before a record of `event` (None: none after
    them), did nothing but count the attempt that record committed on the first try (a step,
    or the run's end): every step writes one, and a row for each would bury the attempts that
    failed or were abandoned, which a history shows."""
    if versions != 1:
        return False
    if event == "step":
        return attempt == 1
    return event == "finished" and status != "failed"


def version_span(first: int, last: int) -> str:
    """A run of versions without a row, as `interleaved` yields it: `"3"`, `"3..5"`."""
    return f"{first}" if first == last else f"{first}..{last}"


# --- in a line --------------------------------------------------------------------------------


def shorten(text: str, limit: int) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: max(limit - 1, 0)] + "…"


def argument_summary(arguments: Mapping[str, Any] | None, limit: int = ARGUMENTS_CHARS) -> str:
    """`batch=2, table="orders"`: each value as compact JSON, the whole cut to `limit`."""
    if not arguments:
        return ""
    pairs = (
        f"{name}={json.dumps(value, ensure_ascii=False, default=str, separators=(',', ':'))}"
        for name, value in arguments.items()
    )
    return shorten(", ".join(pairs), limit)


def budget_of(stored: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A run's budget as `--json` says it, every field named (a head leaves those at their
    default out); None for a run without one."""
    if stored is None:
        return None
    return {
        "usd": stored.get("usd"),
        "tokens": stored.get("tokens"),
        "spent_usd": stored.get("spent_usd", 0.0),
        "spent_tokens": stored.get("spent_tokens", 0),
        "reserved_usd": stored.get("reserved_usd", 0.0),
        "reserved_tokens": stored.get("reserved_tokens", 0),
        "refused": stored.get("refused"),
    }


def budget_text(budget: Mapping[str, Any]) -> str:
    """`$0.0412 spent of $0.0500, $0.0090 held by the step under way`; in tokens for a
    budget in tokens."""
    parts = []
    if budget["usd"] is not None:
        said = f"{_dollars(budget['spent_usd'])} spent of {_dollars(budget['usd'])}"
        if budget["reserved_usd"]:
            said += f", {_dollars(budget['reserved_usd'])} held by the step under way"
        parts.append(said)
    if budget["tokens"] is not None:
        said = f"{budget['spent_tokens']:,} of {budget['tokens']:,} tokens spent"
        if budget["reserved_tokens"]:
            said += f", {budget['reserved_tokens']:,} held by the step under way"
        parts.append(said)
    return "; ".join(parts)


def _dollars(amount: float) -> str:
    """`ratchet.engine.spending.dollars`, without loading the engine."""
    if amount and abs(amount) < 0.1:
        return f"${amount:.4f}"
    return f"${amount:,.2f}"
