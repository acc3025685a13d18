"""What the read commands say (`ratchet status`, `history`, `list`), from a run's documents.

A document is what a store holds as JSON: a run's head (its static part merged in), one of its
checkpoint records, a line of the runs table; or the same thing dumped from the models
(`RunState.model_dump(mode="json")`, ...). The functions here are pure and load neither
pydantic, typer nor rich, so that a read command answers straight from a SQLite file
(`ratchet.quick`) in little more than the time Python takes to start, while the full CLI (any
store, DynamoDB included) says the same bytes through the same functions. Stores leave a
head's fields at their defaults out: every read of one here names the default.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime

from ratchet.pricing import PRICES_AS_OF, estimate
from ratchet.untrusted import for_terminal, json_for_terminal

TYPE_CHECKING = False  # `typing` takes longer to load than a quick read takes to answer
if TYPE_CHECKING:
    from typing import Any

USAGE_COUNTS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "calls")
_EVENTS_WITH_USAGE = frozenset({"step", "attempt_failed", "finished"})
ARGUMENTS_CHARS = 60
"""A call's arguments are cut to this many characters where a line shows them."""
GOAL_CHARS = 200
"""`ratchet status` shows the goal cut to this many characters (`--json` has all of it)."""
FINISHED = frozenset({"done", "failed", "stopped", "cancelled"})
"""`ratchet.state.FINISHED`, by value (a unit test holds them equal)."""


def iso(value: str | datetime) -> str:
    """A time as `datetime.isoformat` writes it (`+00:00`, where pydantic's JSON says `Z`)."""
    return (datetime.fromisoformat(value) if isinstance(value, str) else value).isoformat()


def usage_totals(usage: Mapping[str, Any] | None) -> dict[str, Any]:
    """Token counts (absent ones 0) and the share of the input read from the prompt cache."""
    counts = {name: int((usage or {}).get(name, 0)) for name in USAGE_COUNTS}
    prompt = counts["input_tokens"] + counts["cache_read_tokens"] + counts["cache_write_tokens"]
    share = counts["cache_read_tokens"] / prompt if prompt else 0.0
    return {**counts, "cached_share": round(share, 4)}


# --- status -----------------------------------------------------------------------------------


def status_payload(head: Mapping[str, Any]) -> dict[str, Any]:
    """`ratchet status --json`: where the run stands, its usage and estimated cost."""
    options = head["options"]
    status = head.get("status", "running")
    step = head.get("step", 0)
    request = head["waiting"]["request"] if head.get("waiting") else None
    usage = usage_totals(head.get("usage"))
    return {
        "run_id": head["run_id"],
        "status": status,
        "step": step,
        "version": head.get("version", 1),
        "attempts": head.get("attempts", 0),
        "summary": head.get("summary"),
        "error": head.get("error"),
        "agent": head["agent"],
        "goal": head["goal"],
        "model": options["model"],
        "max_steps": options["max_steps"],
        "input": options.get("params") or None,
        "waiting": request["prompt"] if request else None,
        "waiting_details": dict(request.get("details") or {}) if request else None,
        "usage": usage,
        "cost_usd": estimate(options["model"], usage),
        "updated_at": iso(head["updated_at"]),
        "failed_step": step + 1 if status == "failed" else None,
        "not_before": iso(head["not_before"]) if head.get("not_before") else None,
    }


def status_text(payload: Mapping[str, Any]) -> str:
    """`ratchet status`: a line per field that has a value, names right-aligned. A failed run
    names the step that failed; a stopped run's summary is the reason it stopped; a finished
    run makes no more attempts, so shows none."""
    status = payload["status"]
    stopped = status == "stopped"
    usage = payload["usage"]
    cost = payload["cost_usd"]
    shown = {
        **payload,
        "status": f"failed at step {payload['failed_step']}" if status == "failed" else status,
        "attempts": None if status in FINISHED else payload["attempts"],
        "summary": None if stopped else payload["summary"],
        "goal": shorten(payload["goal"], GOAL_CHARS),
        "reason": payload["summary"] if stopped else None,
        "failed_step": None,
        "usage": usage_text(usage) if usage["calls"] else None,
        "cost_usd": f"{cost:.4f} (estimated, list prices of {PRICES_AS_OF})"
        if cost is not None
        else None,
    }
    lines = {name: value for name, value in shown.items() if value is not None}
    width = max(map(len, lines))
    return "".join(
        f"{name:>{width}}  {for_terminal(_shown(value), lines=True)}\n"
        for name, value in lines.items()
    )


def _shown(value: Any) -> str:
    """A value on a line of `ratchet status`: text as it is, a dict (the input, a question's
    details) as compact JSON."""
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)
    return str(value)


def usage_text(usage: Mapping[str, Any]) -> str:
    return (
        f"{usage['input_tokens']:,} in, {usage['output_tokens']:,} out, "
        f"{usage['cache_read_tokens']:,} cache read, {usage['cache_write_tokens']:,} cache "
        f"write over {usage['calls']:,} calls ({usage['cached_share']:.0%} of input cached)"
    )


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
        said = "step committed" + ("; asked a person" if event.get("wait") is not None else "")
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
    return {"explanation": "created"}


def history_row(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """A row of `ratchet history --json`, from a checkpoint's fields (`checkpoint_fields`, or
    a `Checkpoint` dumped as JSON), its time as `isoformat` writes it."""
    return {
        **{name: checkpoint[name] for name in _ROW_FIELDS},
        "time": iso(checkpoint["time"]),
    }


_ROW_FIELDS = (
    "version",
    "step",
    "status",
    "event",
    "worker",
    "bytes",
    "time",
    "usage",
    "explanation",
    "tool",
    "arguments",
    "result",
    "by",
    "comment",
    "error",
    "duration_ms",
    "attempt",
)


def history_payload(
    run_id: str,
    rows: Sequence[Mapping[str, Any]],
    head_version: int,
    *,
    first: int | None = None,
) -> dict[str, Any]:
    """`ratchet history --json`: the rows (those from version `first` on, with `--after` or
    `--last`), and the versions among them no row records, explained."""
    gaps = version_gaps([r["version"] for r in rows], head_version, first=first)
    return {
        "run_id": run_id,
        "checkpoints": list(rows),
        "unrecorded_versions": [
            {"from": first, "to": last, "explanation": UNRECORDED_VERSIONS} for first, last in gaps
        ],
    }


HISTORY_COLUMNS = (
    "version",
    "step",
    "status",
    "what happened",
    "tool call -> result",
    "worker",
    "bytes",
    "time (UTC)",
    "tokens in/out (cached)",
)


def history_text(
    rows: Sequence[Mapping[str, Any]],
    head_version: int,
    *,
    first: int | None = None,
    width: int | None = None,
) -> str:
    """`ratchet history`: a table, a row per checkpoint (from version `first` on), and a row
    per run of versions no checkpoint records (explained under the table). Given the
    terminal's `width`, the two columns of words are cut to fit it."""
    versions = [r["version"] for r in rows]
    lines: list[list[str]] = []
    for item in interleaved(versions, version_gaps(versions, head_version, first=first)):
        if isinstance(item, str):
            lines.append([item, "", "", "attempt counted (no record)", "", "", "", "", ""])
        else:
            lines.append(_history_line(rows[item]))
    if width is not None:
        _fit(lines, width)
    said = table(HISTORY_COLUMNS, lines)
    if any(line[3] == "attempt counted (no record)" for line in lines):
        said += f"Versions without a row: {UNRECORDED_VERSIONS}.\n"
    return said


def interleaved(versions: Sequence[int], gaps: Iterable[tuple[int, int]]) -> Iterator[int | str]:
    """The rows of a history in order, by their index in `versions` (ascending), each run of
    versions without a row as its span (`"3"`, `"3..5"`) just before the first row past it."""
    pending = sorted(gaps)
    for index, version in enumerate(versions):
        while pending and pending[0][0] < version:
            yield _span(*pending.pop(0))
        yield index
    for gap in pending:
        yield _span(*gap)


def _span(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}..{last}"


_WORDS = (3, 4)
"""The columns of `HISTORY_COLUMNS` that give way on a narrow terminal."""


def _fit(lines: list[list[str]], width: int) -> None:
    """Cut the columns of words so that each line fits `width` (each keeps 16 characters)."""
    widths = [
        max([len(h), *(len(line[i]) for line in lines)]) for i, h in enumerate(HISTORY_COLUMNS)
    ]
    fixed = sum(w for i, w in enumerate(widths) if i not in _WORDS) + 2 * (len(widths) - 1)
    room = width - fixed
    wanted = sum(widths[i] for i in _WORDS)
    if room >= wanted:
        return
    first = max(16, room * widths[_WORDS[0]] // wanted)
    limits = {_WORDS[0]: first, _WORDS[1]: max(16, room - first)}
    for line in lines:
        for column, limit in limits.items():
            line[column] = shorten(line[column], limit)


def _history_line(row: Mapping[str, Any]) -> list[str]:
    usage = row["usage"]
    tokens = (
        f"{usage['input_tokens'] + usage['cache_read_tokens'] + usage['cache_write_tokens']:,}"
        f"/{usage['output_tokens']:,} ({usage['cached_share']:.0%})"
        if usage
        else ""
    )
    call = (
        f"{row['tool']}({argument_summary(row['arguments'], 40)}) -> {row['result'] or ''}"
        if row["tool"]
        else ""
    )
    return [
        str(row["version"]),
        str(row["step"]),
        row["status"],
        shorten(row["explanation"], 100),
        shorten(call, 90),
        row["worker"],
        str(row["bytes"]),
        row["time"][11:19],
        tokens,
    ]


def history_window(
    rows: Sequence[Mapping[str, Any]], *, after: int, last: int | None
) -> tuple[list[Mapping[str, Any]], int | None]:
    """The rows `--last N` keeps of those after version `after`, and the first version they
    cover, for the versions without a row among them (None: from the first row, which is
    not version 1 when the earliest records are past their retention)."""
    if last is not None and len(rows) > last:
        kept = list(rows[-last:])
        return kept, kept[0]["version"]
    return list(rows), after + 1 if after else None


# --- list -------------------------------------------------------------------------------------


def listed(run: Mapping[str, Any]) -> dict[str, Any]:
    """A row of `ratchet list --json`; a damaged run's row also says why (`damage`)."""
    row = {
        "run_id": run["run_id"],
        "status": run["status"],
        "step": run["step"],
        "version": run["version"],
        "updated_at": iso(run["updated_at"]),
    }
    if run.get("damage"):
        row["damage"] = run["damage"]
    return row


def newest_first(runs: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Runs most recently updated first (ties keep their order)."""
    return sorted(runs, key=lambda r: datetime.fromisoformat(r["updated_at"]), reverse=True)


def list_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The runs as a table, then a line per damaged run saying why it cannot be read."""
    columns = ("run_id", "status", "step", "version", "updated_at")
    text = table(
        ("run", "status", "step", "version", "updated"),
        [[str(row[column]) for column in columns] for row in rows],
    )
    for row in rows:
        if row.get("damage"):
            text += for_terminal(f"{row['run_id']}: damaged, left as it is: {row['damage']}") + "\n"
    return text


# --- printing ---------------------------------------------------------------------------------


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


UNRECORDED_VERSIONS = (
    "attempts counted (or given back) at the next step: a write to the head alone, with no "
    "checkpoint record"
)


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Columns aligned with two spaces between them, a header and a rule: plain text that
    reads on a terminal and greps in a pipe. Each cell is one line, any control character
    in it escaped (`for_terminal`)."""
    rows = [[for_terminal(cell) for cell in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    lines = [headers, ["-" * w for w in widths], *rows]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        + "\n"
        for line in lines
    )


def terminal_width() -> int | None:
    """The width of the terminal standard output is, or None when it is not one."""
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns if sys.stdout.isatty() else None
    except (OSError, ValueError):
        return None


def json_text(payload: Any) -> str:
    """A payload as `--json` prints it: one JSON object on one line, with nothing in it a
    terminal acts on (`json_for_terminal`)."""
    return json_for_terminal(json.dumps(payload, default=str, ensure_ascii=False)) + "\n"
