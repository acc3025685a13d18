"""`ratchet serve --store dynamodb://...` (issue 40): the runs dashboard and the runs API's reads
of a deployed stack, served from a laptop with the caller's credentials, read-only.

moto runs as a server (`tests.deployed_stack`), so `ratchet serve` is a process of its own
talking to it over HTTP, and every DynamoDB request it makes is counted on the server's side:
each page is answered from Queries alone (the runs pages from the runs index, a run's pages
from its partition), and reads a bounded number of items, whatever the table holds. The
figures each page cost are printed (`-s`). Every write route is refused (405) and every table
is the same after as before. Credentials without read rights are one line and exit 2 (a
missing table, a table not Ratchet's and no credentials are in `tests/e2e/test_bad_input.py`'s
catalogue).
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("flask", reason="moto's server mode needs moto[server] (flask, flask-cors)")

from ratchet.adapters.dynamodb.items import RUNS_INDEX
from ratchet.adapters.dynamodb.store import LIST_SHARDS
from ratchet.state import RECENT_STEPS, RunStatus
from ratchet.web.dashboard import MAX_TIMELINE_ROWS, RUNS_PER_PAGE
from tests.deployed_stack import (
    ACCOUNT,
    DAMAGED,
    LONG_STEPS,
    SMALL_RUNS,
    STACK,
    Call,
    Stack,
    deployed_stack,
    env,
    serve,
)
from tests.processes import RATCHET, Served

API_URL = "https://abc123.execute-api.us-east-1.amazonaws.com/prod"
"""The stack's public URL, as RATCHET_PUBLIC_URL gives it to serve: its routes are named in
full."""
OPENAPI = Path(__file__).parents[2] / "docs" / "openapi.json"
EVERY_STATUS = {
    "done-1": "done",
    "running-1": "running",
    "failed-1": "failed",
    "stopped-1": "stopped",
    "cancelled-1": "cancelled",
    "wait-1": "waiting",
}
HEAD_READ = 1 + RECENT_STEPS + 2
"""The most items a head read asks for at first (`load_head`: the head and its window)."""


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with deployed_stack() as made:
        yield made


@pytest.fixture(scope="module")
def served(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with serve(stack, log, RATCHET_PUBLIC_URL=API_URL) as running:
        stack.calls.take()
        yield running


def get(served: Served, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(served.base + path, timeout=60) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def viewed(stack: Stack, served: Served, path: str) -> tuple[int, str, list[Call]]:
    """A page and the DynamoDB requests it cost, printed."""
    stack.calls.take()
    status, body = get(served, path)
    calls = stack.calls.take()
    operations = Counter(c.operation for c in calls)
    units = sum(c.units for c in calls)
    items = sum(c.items for c in calls)
    print(f"\nGET {path}: {dict(operations)}, {items} items, {units:g} read units")
    return status, body, calls


def only_queries(calls: list[Call]) -> None:
    assert calls, "the page read something"
    assert {c.operation for c in calls} == {"Query"}, "Queries only: no Scan, no GetItem"


def test_the_runs_pages_read_the_runs_index_alone(stack, served):
    # The runs page: one round of Queries of the index (6 statuses x 4 shards), a few more as
    # the merge draws on the partitions that hold the newest runs.
    status, page, calls = viewed(stack, served, "/dashboard")

    assert status == 200
    only_queries(calls)
    assert {c.index for c in calls} == {RUNS_INDEX.name}, "the runs index, never the table"
    partitions = len(RunStatus) * LIST_SHARDS
    assert partitions <= len(calls) <= partitions + 3
    chunk = -(-(RUNS_PER_PAGE + 1) // LIST_SHARDS) + 1
    assert sum(c.items for c in calls) <= RUNS_PER_PAGE + 1 + partitions * chunk
    assert f"<b>{STACK}</b>" in page, "the banner names the stack"
    assert f"<b>{ACCOUNT}</b>" in page, "and the account"
    for run_id, run_status in EVERY_STATUS.items():
        row = re.search(rf">{run_id}</a></td>.*?</tr>", page)
        assert row, run_id
        assert f"s-{run_status}'" in row.group(0), run_id
    damaged = re.search(rf">{DAMAGED}</a></td>.*?</tr>", page)
    assert damaged
    assert "s-damaged'" in damaged.group(0), "marked as locally"
    assert "holds no run status" in damaged.group(0)

    # Filtered: the waiting status's 4 partitions, and the waiting run alone.
    status, waiting, calls = viewed(stack, served, "/dashboard?status=waiting")
    assert status == 200
    only_queries(calls)
    assert len(calls) == LIST_SHARDS
    assert re.findall(r"<tr><td><a href='/dashboard/runs/([^']+)'", waiting) == ["wait-1"]

    # Paged: the older link reads the next page, and the two pages list every run once.
    first = re.findall(r"<tr><td><a href='/dashboard/runs/([^']+)'", page)
    older = re.search(r"<a id='older' href='([^']+)'", page)
    assert len(first) == RUNS_PER_PAGE
    assert older
    status, second_page, calls = viewed(stack, served, older.group(1).replace("&amp;", "&"))
    assert status == 200
    only_queries(calls)
    second = re.findall(r"<tr><td><a href='/dashboard/runs/([^']+)'", second_page)
    everyone = len(EVERY_STATUS) + 1 + SMALL_RUNS + 1  # the damaged run and the long one
    assert len(first + second) == len(set(first + second)) == everyone


def test_a_runs_pages_read_its_partition_and_a_long_run_its_last_page(stack, served):
    # The waiting run: its head, its last records and its approval requests, three Queries of
    # its own partition; it names the stack's approval route, never a local page.
    status, page, calls = viewed(stack, served, "/dashboard/runs/wait-1")

    assert status == 200
    only_queries(calls)
    assert len(calls) == 3
    assert {c.index for c in calls} == {None}
    route = f"{API_URL}/runs/wait-1/approve"
    assert f"data-route='{route}'" in page
    assert f"<code>POST {route}</code>" in page
    assert "/approvals/" not in page, "no approval page signed here"
    assert "127.0.0.1" not in page, "no local page"
    assert "Drop legacy_orders" in page

    # A run of 650 steps: its last 500 records, one Query (DynamoDB's page of 1 MB holds
    # them), never the whole run.
    status, long_page, calls = viewed(stack, served, "/dashboard/runs/long-1")
    assert status == 200
    only_queries(calls)
    assert len(calls) == 3
    assert sum(c.items for c in calls) <= HEAD_READ + MAX_TIMELINE_ROWS
    versions = [int(v) for v in re.findall(r"data-version='(\d+)'", long_page)]
    assert versions == list(range(LONG_STEPS + 2 - MAX_TIMELINE_ROWS, LONG_STEPS + 2))
    assert "id='older'" in long_page

    # A step's state, from the run's records; the damaged run's page says it is damaged.
    status, state, calls = viewed(stack, served, "/dashboard/runs/done-1/steps/3")
    assert status == 200
    only_queries(calls)
    assert "As of step 3" in state or "step 3" in state
    status, damaged, calls = viewed(stack, served, f"/dashboard/runs/{DAMAGED}")
    assert status == 500
    only_queries(calls)
    assert "Run damaged" in damaged
    assert "its stored state is damaged" in damaged


@pytest.mark.parametrize(
    "path",
    [
        "/runs?limit=5",
        "/runs?status=done",
        "/runs/done-1",
        "/runs/done-1/history",
        "/runs/done-1/checkpoints/3",
        "/runs/done-1/steps/2/prompt",
    ],
)
def test_the_runs_apis_reads_answer_from_queries(stack, served, path):
    status, body, calls = viewed(stack, served, path)

    assert status == 200, body
    only_queries(calls)
    assert json.loads(body)


def _write_routes() -> list[tuple[str, str]]:
    """Every route of the runs API that is not a GET (its OpenAPI document), on a real run,
    and the other methods on the dashboard and a run."""
    document = json.loads(OPENAPI.read_text())
    found = [
        (method.upper(), path.format(run_id="wait-1", name="ci", step="1"))
        for path, methods in document["paths"].items()
        for method in methods
        if method != "get"
    ]
    return [
        *found,
        ("PUT", "/runs/wait-1"),
        ("PATCH", "/runs/wait-1"),
        ("DELETE", "/runs/wait-1"),
        ("POST", "/dashboard"),
    ]


def test_every_write_is_refused_before_any_route_and_nothing_is_written(stack, served):
    before = stack.everything()
    stack.calls.take()
    routes = _write_routes()
    assert {m for m, _ in routes} == {"POST", "PUT", "PATCH", "DELETE"}
    assert len(routes) >= 14

    for method, path in routes:
        asked = urllib.request.Request(
            served.base + path,
            data=b'{"comment": "ok"}',
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(asked, timeout=60)
        assert refused.value.code == 405, (method, path)
        assert refused.value.headers["Allow"] == "GET"
        error = json.loads(refused.value.read())["error"]
        assert "changes nothing" in error, error
        assert API_URL in error, error

    assert stack.calls.take() == [], "no request reached DynamoDB"
    assert stack.everything() == before


def test_off_localhost_the_dashboard_and_the_runs_api_take_the_bearer_token(stack, tmp_path):
    with serve(stack, tmp_path / "serve.log", "--host", "127.0.0.2") as remote:
        token = (tmp_path / ".ratchet" / "ratchet-checkpoints.serve-token").read_text().strip()
        for path in ("/dashboard", "/runs/done-1"):
            asked = urllib.request.Request(remote.base + path)
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(asked, timeout=60)
            assert refused.value.code == 401, path
            asked.add_header("Authorization", f"Bearer {token}")
            with urllib.request.urlopen(asked, timeout=60) as answer:
                assert answer.status == 200, path
        assert "reachable from the network" in remote.log.read_text()
    assert (tmp_path / ".ratchet" / "ratchet-checkpoints.serve-token").stat().st_mode & 0o077 == 0


# --- credentials without read rights ---------------------------------------------------------


def _serve_once(stack: Stack, tmp_path: Path, *, store: str | None = None, **extra: str) -> Any:
    return subprocess.run(
        [*RATCHET, "--store", store or stack.url(), "serve", "--port", "0"],
        env=env(**extra),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def assert_one_line(result: Any, *mentions: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    for mention in mentions:
        assert mention.lower() in line.lower(), (mention, line)


@pytest.fixture
def reader_without_rights(stack: Stack) -> Iterator[dict[str, str]]:
    """Credentials of an IAM user who may describe the table but not read its items, with
    moto checking every request's rights until the test ends."""
    import boto3
    from botocore.config import Config

    from tests.deployed_stack import SEEDER

    iam = boto3.client(
        "iam",
        region_name="us-east-1",
        endpoint_url=stack.endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(user_agent_extra=SEEDER),
    )
    iam.create_user(UserName="looker")
    iam.put_user_policy(
        UserName="looker",
        PolicyName="describe-only",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        "Action": ["dynamodb:DescribeTable", "dynamodb:ListTagsOfResource"],
                        "Resource": "*",
                    }
                ],
            }
        ),
    )
    key = iam.create_access_key(UserName="looker")["AccessKey"]
    _moto_auth(stack, "0")
    try:
        yield {
            "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
            "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"],
        }
    finally:
        _moto_auth(stack, "inf")


def _moto_auth(stack: Stack, requests_before: str) -> None:
    """moto's server checks IAM rights after this many requests (inf: never)."""
    asked = urllib.request.Request(
        f"{stack.endpoint}/moto-api/reset-auth",
        data=requests_before.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    with urllib.request.urlopen(asked, timeout=30) as answer:
        assert answer.status == 200


def test_credentials_without_read_rights_are_one_line_and_exit_2(
    stack, tmp_path, reader_without_rights
):
    result = _serve_once(stack, tmp_path, **reader_without_rights)

    assert_one_line(result, "may not read table", "Query refused", "dynamodb:Query")
