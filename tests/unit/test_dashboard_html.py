"""The dashboard's HTML: what a run carries is escaped everywhere, and the charts draw 0, 1
and many steps."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from xml.etree import ElementTree

import pytest

from ratchet.adapters.sqlite.deliveries import Delivery
from ratchet.client import Checkpoint, Run, UsageTotals, Wait
from ratchet.state import RunState, RunStatus
from ratchet.web.dashboard import (
    MAX_CHART_POINTS,
    MAX_TIMELINE_ROWS,
    PendingApproval,
    Point,
    RunRow,
    Timeline,
    chart,
    prompt_page,
    run_page,
    runs_page,
    state_page,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
EVIL = "<script>alert('x')</script>"
EVIL_ID = "r1'><img src=x onerror=alert(1)>"


def _run(run_id: str = "r1", **fields: object) -> Run:
    state = RunState(run_id="r1", agent=f"agent{EVIL}", goal=f"goal{EVIL}")
    return Run.of(state).model_copy(update={"run_id": run_id, **fields})


def _step(version: int, step: int, *, result: str = "ok", worker: str = "w1") -> Checkpoint:
    return Checkpoint(
        version=version,
        step=step,
        status=RunStatus.RUNNING,
        event="step",
        worker=worker,
        bytes=400 + version,
        time=NOW,
        tool=f"tool{EVIL}",
        arguments={"sql": EVIL},
        result=result,
        explanation="step committed",
        duration_ms=float(step),
    )


def _no_markup_from_the_run(page: str) -> None:
    assert "<script" not in page
    assert "<img" not in page
    assert "onerror=alert(1)>" not in page


def test_a_malicious_run_id_result_and_decision_are_escaped_on_the_run_page():
    decided = Checkpoint(
        version=4,
        step=2,
        status=RunStatus.RUNNING,
        event="decided",
        worker="w2",
        bytes=10,
        time=NOW,
        by=f"mallory{EVIL}",
        comment=EVIL,
        explanation=f"person decided by mallory{EVIL}: approved",
    )
    timeline = Timeline(
        run=_run(EVIL_ID, status=RunStatus.WAITING, error=EVIL, summary=EVIL),
        checkpoints=[_step(1, 1, result=EVIL), _step(3, 2, worker=EVIL), decided],
        attempts={1: 1, 3: 2},
        gaps=[(2, 2)],
        approvals=[],
        pending=PendingApproval(
            step=2,
            prompt=EVIL,
            expires_at=NOW,
            link="http://127.0.0.1:8765/approvals/a?run=x&to=ada&sig=1'><b>",
        ),
    )

    page = run_page(timeline)

    _no_markup_from_the_run(page)
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    assert "/dashboard/runs/r1%27%3E%3Cimg%20src%3Dx%20onerror%3Dalert%281%29%3E/steps/1" in page
    assert "sig=1&#x27;&gt;&lt;b&gt;" in page
    assert "retried after 1 failed attempt" in page
    assert "Retried steps: 2." in page


def test_the_run_list_escapes_ids_and_agents_and_links_each_run():
    rows = [RunRow(EVIL_ID, f"agent{EVIL}", RunStatus.FAILED, 3, NOW)]

    page = runs_page(rows, status=None, older=None)

    _no_markup_from_the_run(page)
    assert "href='/dashboard/runs/r1%27%3E%3Cimg" in page
    assert "<a class='count' href='/dashboard?status=failed'>failed</a>" in page
    assert "<a class='count on' href='/dashboard'>all</a>" in page
    assert "id='older'" not in page, "the last page links to no older one"


def test_a_page_with_older_runs_links_to_the_next_page_of_its_status():
    rows = [RunRow("r1", "agent", RunStatus.RUNNING, 3, NOW)]

    page = runs_page(rows, status=RunStatus.RUNNING, older="WyIy'x")

    assert "<a id='older' href='/dashboard?status=running&amp;after=WyIy%27x'>" in page
    assert "<a class='count on' href='/dashboard?status=running'>running</a>" in page
    assert "reloads every 5 s" in page, "a running run on the page may move"


def test_the_state_and_prompt_pages_escape_what_the_run_recorded():
    state = RunState(run_id="r1", agent="a", goal=EVIL, last_result=EVIL)

    _no_markup_from_the_run(state_page(state, 0, replayable=False))
    _no_markup_from_the_run(prompt_page(EVIL_ID, 1, EVIL))
    assert "/dashboard/runs/r1/steps/3/prompt" in state_page(state, 3, replayable=True)


def _parsed(svg: str) -> ElementTree.Element:
    return ElementTree.fromstring(svg)


SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("count", [0, 1, 2, 60])
def test_a_bar_chart_has_one_bar_per_step_inside_its_axes(count):
    points = [Point(step, float(step * 7 % 13)) for step in range(1, count + 1)]

    svg = _parsed(chart("Step duration", points, x_label="step", y_label="ms", kind="bar"))

    bars = svg.findall(f"{SVG}rect")
    assert len(bars) == count
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert "step" in labels
    assert "ms" in labels
    if count == 0:
        assert "no data yet" in labels
    width, height = float(svg.get("width", 0)), float(svg.get("height", 0))
    for bar in bars:
        x, y = float(bar.get("x", -1)), float(bar.get("y", -1))
        assert x >= 0
        assert x + float(bar.get("width", 0)) <= width
        assert 0 <= y <= y + float(bar.get("height", -1)) <= height
    if count:
        tallest = max(bars, key=lambda b: float(b.get("height", 0)))
        assert float(tallest.get("height", 0)) > 0


@pytest.mark.parametrize("count", [0, 1, 40])
def test_a_line_chart_has_one_dot_per_write(count):
    points = [Point(version, 400.0 + version) for version in range(1, count + 1)]

    svg = _parsed(chart("Bytes written", points, x_label="version", y_label="bytes", kind="line"))

    assert len(svg.findall(f"{SVG}circle")) == count
    lines = svg.findall(f"{SVG}polyline")
    assert len(lines) == (1 if count else 0)
    if count:
        pairs = re.findall(r"[\d.]+,[\d.]+", lines[0].get("points", ""))
        assert len(pairs) == count


def test_a_chart_of_all_zero_values_stays_on_its_axis():
    svg = _parsed(chart("d", [Point(1, 0.0), Point(2, 0.0)], x_label="s", y_label="ms", kind="bar"))

    assert [float(b.get("height", -1)) for b in svg.findall(f"{SVG}rect")] == [0.0, 0.0]


def test_chart_titles_and_labels_are_escaped():
    svg = chart(EVIL, [Point(1, 1.0)], x_label=EVIL, y_label=EVIL, kind="line")

    assert "<script" not in svg
    _parsed(svg)  # still well-formed


def test_a_long_runs_chart_buckets_its_steps_and_keeps_the_largest_value():
    points = [Point(step, 1.0) for step in range(1, 10_001)]
    points[6_543] = Point(6_544, 900.0)  # one slow step among ten thousand

    svg = _parsed(chart("Step duration", points, x_label="step", y_label="ms", kind="bar"))

    bars = svg.findall(f"{SVG}rect")
    assert 0 < len(bars) <= MAX_CHART_POINTS
    titles = [bar.findtext(f"{SVG}title") or "" for bar in bars]
    tallest = max(bars, key=lambda b: float(b.get("height", 0)))
    assert "up to 900 ms" in (tallest.findtext(f"{SVG}title") or "")
    assert titles[0].startswith("step 1-")
    assert titles[-1].endswith("-10000: up to 1 ms")
    labels = [t.text for t in svg.iter(f"{SVG}text")]
    assert "1" in labels
    assert "10000" in labels


def test_a_long_runs_page_lists_its_latest_checkpoints_and_says_where_the_rest_are():
    checkpoints = [_step(version, version) for version in range(1, MAX_TIMELINE_ROWS + 101)]
    timeline = Timeline(
        run=_run("long", version=len(checkpoints) + 1),
        checkpoints=checkpoints,
        attempts={},
        gaps=[(50, 50), (len(checkpoints) + 1, len(checkpoints) + 1)],
        approvals=[],
        pending=None,
    )

    page = run_page(timeline)

    versions = [int(v) for v in re.findall(r"data-version='(\d+)'", page)]
    assert versions == list(range(101, MAX_TIMELINE_ROWS + 101))
    assert page.count("<tr class='gap'>") == 1  # the gap among the rows shown, not version 50
    assert f"The last {MAX_TIMELINE_ROWS} of {len(checkpoints)} checkpoints" in page
    assert "ratchet history long" in page


@pytest.mark.parametrize(
    ("status", "seconds"),
    [(RunStatus.RUNNING, 5), (RunStatus.WAITING, 30), (RunStatus.DONE, None)],
)
def test_a_page_of_a_run_that_may_still_move_reloads_itself(status, seconds):
    timeline = Timeline(
        run=_run("r1", status=status),
        checkpoints=[_step(1, 1)],
        attempts={},
        gaps=[],
        approvals=[],
        pending=None,
    )
    rows = [RunRow("r1", "a", status, 1, NOW)]

    pages = [run_page(timeline), runs_page(rows, status=None, older=None)]

    reloads = [re.findall(r"<meta http-equiv='refresh' content='(\d+)'>", page) for page in pages]
    assert reloads == [[str(seconds)] if seconds else []] * 2


# --- issue 20: what a row says, once and in words ----------------------------------------------


def _timeline(checkpoints: list[Checkpoint], gaps: list[tuple[int, int]]) -> Timeline:
    return Timeline(
        run=_run("r1", version=max(c.version for c in checkpoints)),
        checkpoints=checkpoints,
        attempts={c.version: c.attempt for c in checkpoints if c.attempt is not None},
        gaps=gaps,
        approvals=[],
        pending=None,
    )


def _row(page: str, version: int | str) -> str:
    found = re.search(rf"<tr[^>]*>(?:<td>|<td [^>]*>){version}</td>.*?</tr>", page)
    assert found is not None, version
    return re.sub(r"<[^>]+>", " ", found.group(0))


def test_a_decision_row_names_who_decided_once_with_the_comment_cut():
    comment = "Checked against the nightly export. " * 10
    decided = Checkpoint(
        version=2,
        step=1,
        status=RunStatus.RUNNING,
        event="decided",
        worker="w1",
        bytes=10,
        time=NOW,
        by="root",
        comment=comment,
        explanation=f"person decided by root: approved: {comment}",
    )

    row = _row(run_page(_timeline([_step(1, 1), decided], [])), 2)

    assert row.count("decided by") == 1
    assert "person decided by root: approved: Checked against" in row
    assert comment not in row  # cut to the preview


def _attempt(version: int, step: int, attempt: int, event: str = "step") -> Checkpoint:
    if event == "step":
        return _step(version, step).model_copy(update={"attempt": attempt})
    # A failed attempt is written at the run's committed step, the one before.
    return Checkpoint(
        version=version,
        step=step - 1,
        status=RunStatus.RUNNING,
        event="attempt_failed",
        worker="w1",
        bytes=10,
        time=NOW,
        attempt=attempt,
        error="boom",
        explanation=f"attempt {attempt} at step {step} failed: boom",
    )


def test_the_versions_before_a_killed_workers_retry_say_the_worker_died():
    # Given step 2 committed on attempt 2, and no record of attempt 1: its worker was killed
    checkpoints = [_attempt(1, 1, 1), _attempt(3, 2, 2)]

    page = run_page(_timeline(checkpoints, [(2, 2)]))

    said = (
        "2 Attempt 1 at step 2: the worker died during this attempt "
        "(the attempt was counted, but no record was written)"
    )
    assert " ".join(_row(page, 2).split()) == said
    assert "2 (retried: the worker died during attempt 1)" in _row(page, 3)
    assert "attempt counted (no record)" not in page


def test_a_gap_that_holds_the_retrys_own_count_too_says_both():
    # Given step 2 committed on attempt 2: version 2 counted attempt 1, whose worker was
    # killed, and version 3 counted attempt 2 as it began (each step counts its own)
    checkpoints = [_attempt(1, 1, 1), _attempt(4, 2, 2)]

    page = run_page(_timeline(checkpoints, [(2, 3)]))

    said = (
        "2..3 Attempt 1 at step 2: the worker died during this attempt "
        "(the attempt was counted, but no record was written); attempt 2 counted as its "
        "work started"
    )
    assert " ".join(_row(page, "2..3").split()) == said


def test_an_attempt_that_failed_with_a_record_is_not_said_to_have_died():
    # Given attempt 1 at step 2 failed (recorded), then attempt 2 was counted and committed
    checkpoints = [_attempt(1, 1, 1), _attempt(2, 2, 1, "attempt_failed"), _attempt(4, 2, 2)]

    page = run_page(_timeline(checkpoints, [(3, 3)]))

    assert "died" not in page
    assert "Attempt 2 at step 2 counted before its work started" in _row(page, 3)
    assert "2 (retried after 1 failed attempt)" in _row(page, 4)


def test_the_latest_versions_with_no_record_yet_are_said_to_be_counted_attempts():
    page = run_page(_timeline([_attempt(1, 1, 1)], [(2, 3)]))

    assert "Attempts counted (or given back) at the next step" in _row(page, "2..3")


def test_each_chart_says_what_its_x_axis_counts():
    timeline = _timeline([_attempt(1, 1, 1), _attempt(2, 2, 1)], [])

    page = run_page(timeline)

    titles = [re.sub(r"<[^>]+>", "", t) for t in re.findall(r"<text class='title'.*?</text>", page)]
    assert titles == ["Step duration by step", "Bytes written by checkpoint version"]
    assert re.findall(r"<text class='x-axis'[^>]*>(.*?)</text>", page) == [
        "step",
        "checkpoint version",
    ]


@pytest.mark.parametrize(("calls", "said"), [(1, "over 1 call"), (2, "over 2 calls")])
def test_the_usage_line_counts_its_model_calls_in_words(calls, said):
    usage = UsageTotals(
        input_tokens=10,
        output_tokens=5,
        cache_read_tokens=0,
        cache_write_tokens=0,
        calls=calls,
        cached_share=0.0,
    )
    timeline = Timeline(
        run=_run(usage=usage), checkpoints=[], attempts={}, gaps=[], approvals=[], pending=None
    )

    page = run_page(timeline)

    assert f"cache read {said}<" in page


@pytest.mark.parametrize(
    ("kind", "name", "on_the_stack", "local_only"),
    [
        (
            "event",
            "ci-finished",
            "<code>POST /runs/r1/events/ci-finished</code> on the stack",
            "ratchet send",
        ),
        ("timer", None, "<code>POST /runs/r1/wake</code> on the stack", "ratchet wake"),
    ],
)
def test_a_deployed_runs_wait_is_settled_through_the_stacks_api(
    kind, name, on_the_stack, local_only
):
    run = _run(
        status=RunStatus.WAITING,
        wait=Wait(
            kind=kind, step=2, since=NOW, prompt="", name=name, until=None, answer_schema=None
        ),
    )
    timeline = Timeline(
        run=run, checkpoints=[], attempts={}, gaps=[], approvals=[], pending=None, on_stack=True
    )

    page = run_page(timeline)

    assert on_the_stack in page
    assert local_only not in page, "a command that refuses a dynamodb:// store"


def test_a_deployed_run_waiting_with_no_request_open_names_no_local_command():
    run = _run(status=RunStatus.WAITING)
    timeline = Timeline(
        run=run,
        checkpoints=[],
        attempts={},
        gaps=[],
        approvals=[],
        pending=None,
        waits_without_request=True,
        on_stack=True,
    )

    page = run_page(timeline)

    assert "the stack's notify function opens one" in page
    assert "ratchet link" not in page


# --- issue 35: a run's webhook deliveries ------------------------------------------------------


def _delivery(
    n: int, state: str, *, error: str | None = None, url: str = "https://a.example/h"
) -> Delivery:
    at = NOW.timestamp()
    return Delivery(
        delivery_id=f"r1:{n}@0a1b2c3d",
        change_id=f"r1:{n}",
        run_id="r1",
        url=url,
        body=f'{{"id":"r1:{n}","status":"{"waiting" if n == 2 else "running"}"}}',
        state=state,
        attempts=3 if error else 1,
        created_at=at,
        next_at=at + 4,
        answered_at=at + 1,
        last_error=error,
    )


def test_a_runs_page_lists_its_webhook_deliveries_and_their_failures_escaped():
    timeline = Timeline(
        run=_run("r1"),
        checkpoints=[_step(1, 1)],
        attempts={},
        gaps=[],
        approvals=[],
        pending=None,
        deliveries=[
            _delivery(
                2, "pending", error=f"answered HTTP 500{EVIL}", url=f"http://b.example/{EVIL}"
            ),
            _delivery(1, "delivered"),
        ],
    )

    page = run_page(timeline)

    table = re.search(r"<table id='deliveries'>.*?</table>", page, re.DOTALL)
    assert table is not None
    rows = [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td>(.*?)</td>", row)]
        for row in re.findall(r"<tr class='\w+'>(.*?)</tr>", table.group(0))
    ]
    assert rows == [
        [
            "r1:2@0a1b2c3d",
            "waiting",
            "http://b.example/&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;",
            "pending",
            "3",
            "answered HTTP 500&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;",
            f"next try {_at(4)}",
        ],
        ["r1:1@0a1b2c3d", "running", "https://a.example/h", "delivered", "1", "", _at(1)],
    ]
    _no_markup_from_the_run(page)


def _at(seconds: int) -> str:
    return f"2026-12-01 12:00:{seconds:02d} UTC"


def test_a_run_with_no_deliveries_says_so_and_a_store_that_keeps_none_shows_none():
    def page(deliveries: list[Delivery] | None) -> str:
        return run_page(
            Timeline(
                run=_run("r1"),
                checkpoints=[_step(1, 1)],
                attempts={},
                gaps=[],
                approvals=[],
                pending=None,
                deliveries=deliveries,
            )
        )

    assert "<h2>Webhook deliveries</h2><p class='note' id='deliveries'>None" in page([])
    assert "Webhook deliveries" not in page(None)


def test_the_run_page_shows_a_runs_key_and_a_priority_other_than_the_default():
    keyed = run_page(
        Timeline(
            run=_run("r1", concurrency_key="acme", priority=9),
            checkpoints=[_step(1, 1)],
            attempts={},
            gaps=[],
            approvals=[],
            pending=None,
        )
    )
    plain = run_page(_timeline([_step(1, 1)], []))

    assert "<dt>concurrency key</dt><dd>acme</dd>" in keyed
    assert "<dt>priority</dt><dd>9</dd>" in keyed
    assert "concurrency key" not in plain
    assert "<dt>priority</dt>" not in plain
