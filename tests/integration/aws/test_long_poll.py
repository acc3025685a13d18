"""The runs API's long poll on the deployed shape (issue 35): `GET /runs/{id}/history?after=&wait=`
holds the request while nothing is new, and answers within about a second of the commit that
writes something; while it holds, it reads the run's records once a second (the calls are
counted: what a followed hour costs); a finished run and a request with something to read
answer at once; `wait` beyond the bound is one 400, nothing written."""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime
from typing import Any

import pytest

from ratchet.handlers import _wiring
from ratchet.web.runs import HISTORY_POLL_SECONDS, MAX_HISTORY_WAIT_SECONDS
from tests.integration.aws.harness import Stack
from tests.integration.aws.test_api import call


def _parked(stack: Stack, run_id: str) -> int:
    status, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": run_id})
    assert status == 201, started
    stack.parked(run_id)
    return stack.head(run_id).version


def _count_calls() -> Counter[str]:
    calls: Counter[str] = Counter()

    def count(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    _wiring.runtime().dynamodb.meta.events.register("before-call.dynamodb", count)
    return calls


def test_a_long_poll_answers_about_a_second_after_the_commit(stack: Stack):
    after = _parked(stack, "lp-1")
    approved = threading.Timer(1.5, lambda: call("POST", "/runs/lp-1/approve", {"comment": "ok"}))

    approved.start()
    started = time.monotonic()
    status, history = call(
        "GET",
        "/runs/lp-1/history",
        query={"after": str(after), "wait": str(MAX_HISTORY_WAIT_SECONDS)},
    )
    answered = time.time()
    approved.join()

    assert status == 200, history
    rows = history["checkpoints"]
    assert rows[0]["event"] == "decided"
    assert rows[0]["version"] > after
    committed = datetime.fromisoformat(rows[0]["time"]).timestamp()
    latency = answered - committed
    assert latency <= HISTORY_POLL_SECONDS + 1.0
    assert time.monotonic() - started < MAX_HISTORY_WAIT_SECONDS
    print(f"long poll: commit to answer {latency * 1000:.0f} ms")


def test_a_held_long_poll_reads_the_run_once_a_second(stack: Stack):
    after = _parked(stack, "lp-2")
    calls = _count_calls()

    started = time.monotonic()
    status, history = call("GET", "/runs/lp-2/history", query={"after": str(after), "wait": "5"})
    held = time.monotonic() - started

    assert status == 200
    assert history["checkpoints"] == []
    assert 4.9 <= held < 8
    # The history read before the hold and after it (the head and the records, each a Query),
    # the head once more, and one Query of the records a second between.
    assert calls["Query"] <= 2 + 1 + 5 / HISTORY_POLL_SECONDS + 2
    assert set(calls) <= {"Query", "GetItem"}
    print(f"long poll held {held:.1f} s: {dict(calls)}")


@pytest.mark.parametrize("query", [{"after": "0", "wait": "5"}, {"after": "999", "wait": "5"}])
def test_a_long_poll_with_something_to_read_or_nothing_to_wait_for_answers_at_once(
    stack: Stack, query: dict[str, str]
):
    # after=0: records to read; after=999 on a finished run: nothing will come
    _, started = stack.post_run({"scenario": "migration", "batches": 1, "run_id": "lp-3"})
    stack.parked("lp-3")
    call("POST", "/runs/lp-3/approve")
    stack.finished(str(started["execution_name"]))

    began = time.monotonic()
    answer = call("GET", "/runs/lp-3/history", query=query)

    assert answer[0] == 200
    assert time.monotonic() - began < 2


@pytest.mark.parametrize("wait", [str(MAX_HISTORY_WAIT_SECONDS + 1), "-1", "soon"])
def test_a_long_poll_beyond_the_bound_is_one_400_and_nothing_written(stack: Stack, wait: str):
    after = _parked(stack, "lp-4")

    status, refused = call("GET", "/runs/lp-4/history", query={"after": str(after), "wait": wait})

    assert status == 400
    assert [p["field"] for p in refused["problems"]] == ["wait"]
    assert stack.head("lp-4").version == after
