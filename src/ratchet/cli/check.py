"""`ratchet check AGENT`: the crash sweep of `ratchet.testing` on a user's agent, said as a table
of steps by fault points, the differences one line each and the direct test of every key; exit
1 on any difference, 0 when every crash schedule ends as the run without one did."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ratchet.cli.context import out, say, settings
from ratchet.cli.options import JsonOption, not_empty
from ratchet.cli.runs import InputOption, ParamOption
from ratchet.errors import InvalidInput

if TYPE_CHECKING:
    from ratchet.testing import CheckReport

MAX_PROCESSES = 64
MAX_BUDGET_SECONDS = 24 * 3600
MARKS = {"raise": "raised", "kill": "killed"}


def check(
    agent: Annotated[
        str,
        typer.Argument(
            metavar="AGENT",
            callback=not_empty,
            help="The agent: module:attr (my_agents:agent), or a built-in scenario's name.",
        ),
    ],
    input_json: InputOption = None,
    param: ParamOption = None,
    effects: Annotated[
        str | None,
        typer.Option(
            "--effects",
            metavar="MODULE:FN",
            callback=not_empty,
            help="A function of no arguments that returns a JSON snapshot of the world your "
            "tools change (rows, files, calls a fake recorded), compared after every schedule.",
            show_default=False,
        ),
    ] = None,
    setup: Annotated[
        str | None,
        typer.Option(
            "--setup",
            metavar="MODULE:FN",
            callback=not_empty,
            help="A function of no arguments called before each schedule, in its own scratch "
            "working directory, to give it a fresh world.",
            show_default=False,
        ),
    ] = None,
    script: Annotated[
        Path | None,
        typer.Option(
            "--script",
            metavar="FILE",
            help='How waits are answered, a JSON file: {"approvals": [{"prompt": "Merge", '
            '"approve": false}], "events": {"ci-finished": [{...}]}}. Default: every approval '
            "approved; events the script lacks time out; sleeps skipped.",
            show_default=False,
        ),
    ] = None,
    from_run: Annotated[
        str | None,
        typer.Option(
            "--from-run",
            metavar="RUN",
            callback=not_empty,
            help="Replay the decisions of this run (done, in --store) instead of the agent's "
            "scripted policy: a model-driven agent is checked offline.",
            show_default=False,
        ),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            metavar="FILE",
            help="Replay the decisions in FILE; if there is no FILE yet, run the agent once "
            "with --model first and record them there (the only model calls a check makes).",
            show_default=False,
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="MODEL",
            callback=not_empty,
            help="The model that --record records with (claude-..., bedrock:..., module:attr).",
            show_default=False,
        ),
    ] = None,
    processes: Annotated[
        int | None,
        typer.Option(
            "--processes",
            min=1,
            max=MAX_PROCESSES,
            metavar="N",
            help="Schedules run at once, each in a process. Default: the cores there are.",
            show_default=False,
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option(
            "--budget",
            min=1,
            max=MAX_BUDGET_SECONDS,
            metavar="SECONDS",
            help="Start no schedule after this long; say how far the sweep got.",
            show_default=False,
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Crash your agent at every fault point of every step it takes, as an exception and as a
    killed process, resume it, and compare the end with a run without a crash: status,
    summary, effects, model calls. Exit 1 on any difference."""
    from ratchet.cli.writes import as_given, run_input
    from ratchet.runs import RunRequestInvalid
    from ratchet.testing import check as sweep

    given = run_input(input_json, param) or {}
    if model is not None and record is None:
        raise InvalidInput("--model is the model --record records with: add --record FILE")
    if from_run is not None and record is not None:
        raise InvalidInput("--from-run and --record are two sources of decisions: give one")
    scratch = tempfile.TemporaryDirectory(prefix="ratchet-check-")
    with scratch:
        recording = record
        if from_run is not None:
            recording = _recorded(from_run, agent, Path(scratch.name) / "recording.json")
        if recording is not None and recording.exists():
            given = {**_recorded_params(recording), **given}
        try:
            report = sweep(
                agent,
                params=given,
                effects=effects,
                setup=setup,
                script=_script(script),
                recording=recording,
                record_with=_recording_model(model) if record is not None else None,
                processes=processes,
                budget=budget,
            )
        except RunRequestInvalid as refused:
            # In the words `ratchet start` refuses the same input in, naming the flag it came in.
            raise InvalidInput(as_given(refused.for_cli(), refused.fields, param)) from None
    if as_json:
        out.print_json(data=_as_data(report))
    else:
        _say(report)
    if not report.ok:
        raise typer.Exit(1)


def _script(path: Path | None) -> Any:
    from ratchet.testing import WaitScript

    return WaitScript.read(path) if path is not None else None


def _recording_model(model: str | None) -> str:
    from ratchet.model_names import DEFAULT_CLAUDE_MODEL

    return model or DEFAULT_CLAUDE_MODEL


def _recorded(run_id: str, agent: str, path: Path) -> Path:
    """The decisions of run `run_id` in the store `--store` names, written to `path`."""
    from ratchet.cli.context import open_client
    from ratchet.store_urls import POSTGRES_SCHEMES
    from ratchet.testing.model import recording_of

    if not settings().store.startswith(("sqlite:", *POSTGRES_SCHEMES)):
        raise InvalidInput(
            "--from-run reads the run from a local store: give --store sqlite:///... "
            "(or postgresql://...)"
        )
    client = open_client(create=False, logs=False)
    try:
        recording = recording_of(client, run_id)
    finally:
        client.close()
    if recording.agent != agent:
        raise InvalidInput(f"run {run_id!r} is a run of {recording.agent!r}, not of {agent!r}")
    recording.write(path)
    return path


def _recorded_params(path: Path) -> dict[str, Any]:
    from ratchet.testing import Recording

    return dict(Recording.read(path).params)


def _as_data(report: CheckReport) -> dict[str, Any]:
    data: dict[str, Any] = report.model_dump(mode="json")
    data["ok"] = report.ok
    data["differences"] = report.differences
    return data


def _steps(count: int) -> str:
    return f"{count} step" if count == 1 else f"{count} steps"


def _say(report: CheckReport) -> None:
    from ratchet.testing.sweep import POINT_ORDER

    planned = {(v.crash.step, v.crash.point) for v in report.verdicts}
    points = [p for p in POINT_ORDER if any(point == p for _, point in planned)]
    tools = {c.step: c.tool for c in report.tools}
    steps = sorted({step for step, _ in planned})
    say(
        f"ratchet check {report.agent}: {report.ran} crash schedules (of {report.planned}) in "
        f"{report.seconds:.1f} s on {report.processes} processes; the run without a crash took "
        f"{_steps(len(report.baseline.steps))} and ended {report.baseline.status}."
    )
    headers = ["step", "tool", *[str(p) for p in points]]
    rows = []
    for step in steps:
        cells = [str(step), tools.get(step, "(done)")]
        for point in points:
            kinds = [v for v in report.verdicts if (v.crash.step, v.crash.point) == (step, point)]
            failed = [MARKS[str(v.crash.kind)] for v in kinds if not v.ok]
            cells.append("-" if not kinds else "ok" if not failed else "✗ " + "+".join(failed))
        rows.append(cells)
    widths = [max(len(r[i]) for r in [headers, *rows]) for i in range(len(headers))]
    for row in [headers, *rows]:
        say("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    for test in report.key_tests:
        said = f"ok ({test.said})" if test.ok else "✗ not idempotent under its key (below)"
        say(f"{test.tool} called twice with key {test.key}: {said}")
    if report.differences:
        say(f"{len(report.differences)} differences:")
        for line in report.differences:
            say(f"  {line}")
    # A note is the same words after every crash that causes it: said once, with where.
    noted: dict[str, list[str]] = {}
    for verdict in report.verdicts:
        for note in verdict.notes:
            where = f"{verdict.crash.point}@{verdict.crash.step}"
            if where not in noted.setdefault(note, []):
                noted[note].append(where)
    if noted:
        say("Notes (words that read otherwise after a crash, not differences):")
        for note, places in noted.items():
            say(f"  {note} (after a crash at {', '.join(places)})")
    if not report.sees_effects:
        say(
            "No --effects: compared the run's data, tool results and steps only; what the "
            "tools did outside the run (rows, files, messages) was not seen."
        )
    if report.budget_reached:
        say(
            f"--budget reached: {report.ran} of {report.planned} schedules ran; the rest were "
            "not tried."
        )
    say(
        "ok: every crash schedule ended as the run without one did."
        if report.ok
        else "FAILED: a crash there changes what your agent did (see above)."
    )
