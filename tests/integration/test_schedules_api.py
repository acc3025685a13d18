"""The schedules routes of the runs API on the local runtime, mounted as `ratchet serve` mounts
them: added, listed, paused, resumed and removed through the client's schedule methods, and
each refusal a JSON 4xx naming the field, quoting nothing sent and writing nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client

from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.web.runs import build_app
from ratchet.web.serve import wsgi_app
from tests.integration.test_runs_api_local import LOG, OPERATOR, Served

NIGHTLY = {
    "name": "nightly",
    "agent": "migration",
    "cron": "0 2 * * *",
    "timezone": "Europe/Berlin",
    "input": {"batches": 2},
}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp_path}/ratchet.db"))
    services = local_runs_services(runtime, worker_id="serve:test", logger=LOG, operator=OPERATOR)
    app = build_app(lambda: services)
    # The lines `ratchet serve` has for them:
    routes = [("/runs", app), ("/schedules", app)]
    try:
        yield Served(runtime, Client(wsgi_app(routes)))
    finally:
        runtime.close()


def test_a_schedule_is_added_listed_paused_resumed_and_removed_through_the_api(served: Served):
    status, added = served.call("POST", "/schedules", NIGHTLY)

    assert status == 201
    assert {k: added[k] for k in ("name", "agent", "rule", "cron", "timezone", "paused")} == {
        "name": "nightly",
        "agent": "migration",
        "rule": "cron 0 2 * * * (Europe/Berlin)",
        "cron": "0 2 * * *",
        "timezone": "Europe/Berlin",
        "paused": False,
    }
    assert added["input"] == {"batches": 2}
    status, polled = served.call(
        "POST", "/schedules", {"name": "poll", "agent": "migration", "every": "15m"}
    )
    assert (status, polled["every_seconds"], polled["rule"]) == (201, 900, "every 15m")

    assert served.call("GET", "/schedules") == (
        200,
        {"schedules": [added, polled]},  # by name
    )
    status, paused = served.call("POST", "/schedules/nightly/pause")
    assert (status, paused["paused"]) == (200, True)
    status, resumed = served.call("POST", "/schedules/nightly/resume")
    assert (status, resumed["paused"]) == (200, False)
    assert served.call("DELETE", "/schedules/poll") == (200, {"name": "poll"})
    _, listed = served.call("GET", "/schedules")
    assert [s["name"] for s in listed["schedules"]] == ["nightly"]
    assert [s.name for s in served.runtime.schedules.all()] == ["nightly"]


REFUSED = [
    # (body, status, field): the client's own checks, as `ratchet schedule add` makes them.
    ({**NIGHTLY, "cron": "61 * * * *"}, 400, "cron"),
    ({**NIGHTLY, "cron": None, "every": "30s"}, 400, "every"),
    ({**NIGHTLY, "cron": None, "every": "soon"}, 400, "every"),
    ({**NIGHTLY, "every": "1h"}, 400, "cron"),
    ({**NIGHTLY, "timezone": "Mars/Olympus"}, 400, "timezone"),
    ({**NIGHTLY, "agent": "nobody.agents:secret"}, 400, "agent"),
    ({**NIGHTLY, "input": {"batches": "many"}}, 400, "input.batches"),
    # The body's model, checked before the route runs.
    ({**NIGHTLY, "name": "Nightly!"}, 400, "name"),
    ({**NIGHTLY, "every_seconds": 60}, 400, "every_seconds"),
]


@pytest.mark.parametrize(("body", "status", "field"), REFUSED)
def test_a_schedule_that_cannot_fire_is_refused_naming_the_field_and_nothing_is_written(
    served: Served, body: dict[str, Any], status: int, field: str
):
    before = served.rows()

    answer = served.call("POST", "/schedules", body)

    assert answer[0] == status
    assert [p["field"] for p in answer[1]["problems"]][:1] == [field]
    sent = [str(v) for v in body.values() if v not in (None, "migration", "UTC")]
    assert not [v for v in sent if v in json.dumps(answer[1])], "the refusal quotes the body"
    assert served.rows() == before


def test_a_name_taken_is_409_and_a_name_unknown_404_both_naming_name(served: Served):
    assert served.call("POST", "/schedules", NIGHTLY)[0] == 201

    taken = served.call("POST", "/schedules", NIGHTLY)
    unknown = [
        served.call("POST", "/schedules/weekly/pause"),
        served.call("POST", "/schedules/weekly/resume"),
        served.call("DELETE", "/schedules/weekly"),
    ]

    assert (taken[0], [p["field"] for p in taken[1]["problems"]]) == (409, ["name"])
    for status, refused in unknown:
        assert (status, [p["field"] for p in refused["problems"]]) == (404, ["name"])


def test_no_web_page_can_add_or_pause_a_schedule_on_localhost(served: Served):
    form = served.call("POST", "/schedules", "name=x", content_type="text/plain")
    assert form[0] == 415
    assert served.call("POST", "/schedules", NIGHTLY)[0] == 201
    bare = served.call("POST", "/schedules/nightly/pause", content_type="text/plain")
    assert bare[0] == 415
    assert served.runtime.schedules.all()[0].paused is False
