"""What the read commands say (`ratchet status`, `history`, `list`), from a run's documents.

A document is what a store holds as JSON: a run's head (its static part merged in), one of its
checkpoint records (`ratchet.summary.checkpoint_fields` makes its row), a line of the runs
table; or the same thing dumped from the models (`RunState.model_dump(mode="json")`, ...). The
functions here are pure and load neither pydantic, typer nor rich, so that a read command
answers straight from a SQLite file (`ratchet.cli.quick`) in little more than the time Python takes
to start, while the full CLI (any store, DynamoDB included) says the same bytes through the same
functions. Stores leave a head's fields at their defaults out: every read of one here names the
default.
"""

from __future__ import annotations

import os
import sys

from ratchet import quickjson as json  # `json`'s text, without loading `re`
from ratchet.pricing import estimate, price_source
from ratchet.summary import (
    UNRECORDED_VERSIONS,
    argument_summary,
    budget_of,
    budget_text,
    interleaved,
    iso,
    only_counted,
    shorten,
    usage_totals,
    version_gaps,
    version_span,
    wait_kind,
)
from ratchet.untrusted import for_terminal, json_for_terminal

TYPE_CHECKING = False  # `typing` takes longer to load than a quick read takes to answer
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping, Sequence
    from datetime import UTC, datetime
    from typing import Any
else:  # the C type that `datetime.datetime` is, without the module's pure-Python half
    from _datetime import UTC, datetime

GOAL_CHARS = 200
"""`ratchet status` shows the goal cut to this many characters (`--json` has all of it)."""
FINISHED = frozenset({"done", "failed", "stopped", "cancelled"})
"""`ratchet.state.FINISHED`, by value (a unit test holds them equal)."""


# --- status -----------------------------------------------------------------------------------


def status_payload(head: Mapping[str, Any]) -> dict[str, Any]:
    """`ratchet status --json`: where the run stands, its usage and estimated cost."""
    options = head["options"]
    status = head.get("status", "running")
    step = head.get("step", 0)
    waiting = head.get("waiting")
    wait = wait_of(waiting) if waiting else None
    request = waiting["request"] if waiting else None
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
        "waiting": wait["prompt"] if wait else None,
        "waiting_details": _details(request, wait["kind"]) if request and wait else None,
        "wait": wait,
        "usage": usage,
        "cost_usd": estimate(options["model"], usage),
        "updated_at": iso(head["updated_at"]),
        "failed_step": step + 1 if status == "failed" else None,
        "not_before": iso(head["not_before"]) if head.get("not_before") else None,
        "parent": head.get("parent"),
        "concurrency_key": head.get("concurrency_key"),
        "priority": head.get("priority", 0),
        "budget": budget_of(head.get("budget")),
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
        "parent": f"{payload['parent']} (it started this run; ratchet status {payload['parent']})"
        if payload.get("parent")
        else None,
        "usage": usage_text(usage) if usage["calls"] else None,
        # The default priority says nothing: shown only when the run was started with one.
        "priority": payload.get("priority") or None,
        "cost_usd": f"{cost:.4f} (estimated, {price_source(payload['model'])})"
        if cost is not None
        else None,
        "budget": budget_text(payload["budget"]) if payload.get("budget") else None,
    }
    wait = payload.get("wait")
    if wait is not None and wait["kind"] != "person":
        shown["waiting"] = wait_hint(payload["run_id"], wait)
    shown["wait"] = None  # said in words on the `waiting` line
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


def _details(request: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    """A person's request shows its details as it always has (`{}` for none); an event
    wait only the details it has, and a timer none."""
    details = dict(request.get("details") or {})
    return details if kind == "person" or details else None


def usage_text(usage: Mapping[str, Any]) -> str:
    return (
        f"{usage['input_tokens']:,} in, {usage['output_tokens']:,} out, "
        f"{usage['cache_read_tokens']:,} cache read, {usage['cache_write_tokens']:,} cache "
        f"write over {usage['calls']:,} {'call' if usage['calls'] == 1 else 'calls'} "
        f"({usage['cached_share']:.0%} of input cached)"
    )


# --- verify -----------------------------------------------------------------------------------


def verify_text(payload: Mapping[str, Any]) -> str:
    """`ratchet verify`: a line per invariant the agent's check returned, names right-aligned
    as `status` has them. A yes/no is `yes` or `no`, a count has its thousands separated, an
    empty list is `none`, and a list puts one item a line under its name (an object, or
    anything else that is not text or a number, as compact JSON)."""
    width = max(map(len, payload), default=0)
    lines = []
    for name, value in payload.items():
        shown = _verified(value)
        lines.append(f"{name:>{width}}  {shown[0]}")
        lines += [f"{'':>{width}}  {more}" for more in shown[1:]]
    return "".join(for_terminal(line, lines=True) + "\n" for line in lines)


def _verified(value: Any) -> list[str]:
    if isinstance(value, bool):
        return ["yes" if value else "no"]
    if isinstance(value, int | float):
        return [f"{value:,}"]
    if isinstance(value, str):
        return [value]
    if isinstance(value, list | tuple):
        return [_verified_item(item) for item in value] or ["none"]
    if value is None:
        return ["none"]
    return [_verified_item(value)]


def _verified_item(item: Any) -> str:
    if isinstance(item, str | bool | int | float):
        return _verified(item)[0]
    return json.dumps(item, ensure_ascii=False, separators=(", ", ": "), default=str)


# --- waits ------------------------------------------------------------------------------------


def wait_of(waiting: Mapping[str, Any]) -> dict[str, Any]:
    """What a waiting run waits for, from its head's `waiting`: the kind, the step, since
    when, the event's name, when it settles by itself (a timer's time, an event's timeout;
    None for a person, whose request's expiry its approval keeps), and the prompt in words
    (`EventWait.prompt`, `TimerWait.prompt`)."""
    request = waiting["request"]
    kind = wait_kind(request)
    due = {"event": request.get("expires_at"), "timer": request.get("until")}.get(kind)
    name = request["name"] if kind == "event" else None
    children = list(request["children"]) if kind == "children" else None
    if kind == "event":
        prompt = f"Waiting for the event {name!r}" + (f" until {when(due)}" if due else "")
    elif kind == "timer" and request.get("day_budget_of") and due:
        prompt = day_budget_prompt(request["day_budget_of"], request.get("day_budget_usd"), due)
    elif kind == "timer":
        prompt = f"Sleeping until {when(due)}" if due else "Sleeping"
    elif children is not None:
        prompt = children_prompt(len(children), request.get("wait", "all"))
    else:
        prompt = request["prompt"]
    wait = {
        "kind": kind,
        "step": waiting["step"],
        "since": iso(waiting["since"]),
        "name": name,
        "until": iso(due) if due else None,
        "prompt": prompt,
    }
    if kind == "timer" and request.get("day_budget_of"):
        wait["day_budget_of"] = request["day_budget_of"]
    if children is not None:
        wait["children"] = children
    return wait


def children_prompt(count: int, wait: str) -> str:
    """`ChildrenWait.prompt`, from the wait's count and mode (a unit test holds them equal)."""
    runs = "run" if count == 1 else "runs"
    if wait == "first":
        return f"Waiting for the first of {count} child {runs} to end"
    return f"Waiting for {count} child {runs} to end"


def day_budget_prompt(agent: str, usd: float | None, until: str | datetime) -> str:
    """`TimerWait.prompt` of a run waiting for its agent's daily budget (a unit test holds
    them equal)."""
    at = datetime.fromisoformat(until) if isinstance(until, str) else until
    budget = "" if usd is None else f" of ${usd:,.2f}" if usd >= 0.1 else f" of ${usd:.4f}"
    return (
        f"agent {agent}'s daily budget{budget} is spent; "
        f"resumes at {at.astimezone(UTC):%Y-%m-%dT%H:%MZ} or when raised"
    )


def when(moment: str | datetime) -> str:
    """A time as a person reads it: `2026-12-02 10:00:00 UTC`."""
    at = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


def wait_hint(run_id: str, wait: Mapping[str, Any]) -> str:
    """What an event or a timer wait is, and the command that settles it:
    `for the event 'ci-finished' (until ...; send it: ratchet send r1 ci-finished --data JSON)`,
    `sleeping until ... (wake it: ratchet wake r1)`. (Run ids and event names hold no
    character a shell reads.)"""
    until = wait.get("until")
    if wait["kind"] == "timer" and wait.get("day_budget_of"):
        return f"{wait['prompt']} (ratchet budget raise {wait['day_budget_of']} --usd N)"
    if wait["kind"] == "timer":
        sleeping = f"sleeping until {when(until)}" if until else "sleeping"
        return f"{sleeping} (wake it: ratchet wake {run_id})"
    if wait["kind"] == "children":
        listed = ", ".join(wait["children"][:5]) + (", ..." if len(wait["children"]) > 5 else "")
        return f"{wait['prompt'][0].lower()}{wait['prompt'][1:]}: {listed}"
    name = wait["name"]
    expiry = f"until {when(until)}" if until else "no timeout"
    return f"for the event {name!r} ({expiry}; send it: ratchet send {run_id} {name} --data JSON)"


def wait_announcement(run_id: str, wait: Mapping[str, Any]) -> str:
    """What `ratchet worker` and `ratchet run` say when a run parks on an event or a time."""
    if wait["kind"] == "timer":
        return f"{run_id} is {wait_hint(run_id, wait)}; a worker resumes it then"
    if wait["kind"] == "children":
        return f"{run_id} is {wait_hint(run_id, wait)}"
    return f"{run_id} waits {wait_hint(run_id, wait)}"


# --- history ----------------------------------------------------------------------------------


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
    by_version = {r["version"]: r for r in rows}
    gaps = version_gaps(versions, head_version, first=first)
    lines: list[list[str]] = []
    for item in interleaved(versions, gaps):
        if isinstance(item, str):
            first_missing, last_missing = next(g for g in gaps if version_span(*g) == item)
            after = by_version.get(last_missing + 1)
            missing = last_missing - first_missing + 1
            if after is not None and only_counted(
                after["event"], after.get("attempt"), after["status"], missing
            ):
                continue  # an attempt counted, then committed: every step has one
            lines.append([item, "", "", "attempt counted (no record)", "", "", "", "", ""])
        else:
            lines.append(_history_line(rows[item]))
    if width is not None:
        _fit(lines, width)
    said = table(HISTORY_COLUMNS, lines)
    if gaps:
        said += f"Versions without a row: {UNRECORDED_VERSIONS}.\n"
    return said


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
    if run.get("concurrency_key"):
        row["concurrency_key"] = run["concurrency_key"]
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
