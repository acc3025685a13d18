"""The Python API end to end (issue 8): start, wait until waiting, approve, wait until done,
history and state_at, on a SQLite file and on DynamoDB (moto in server mode, through a real
`dynamodb://` store URL).

A run is worked elsewhere as a program would do it: another thread with a client of its own on
the same URL (a client is not thread-safe), while the test's client waits for the status. Every
wait has a generous timeout and returns as soon as the status is reached, so nothing depends on
how fast the machine is.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import boto3
import pytest
from pydantic import BaseModel, Field

import ratchet
from ratchet.client import Client, Run
from ratchet.errors import InvalidInput, RunNotFound
from ratchet.runs import AgentNotRunnable, RunRequestInvalid
from ratchet.state import RunStatus
from ratchet.tools import (
    Agent,
    Done,
    McpServer,
    RunContext,
    StepView,
    ToolCall,
    ToolContext,
    tool,
)
from tests.dynamodb_support import REGION, create_tables, moto_server, scan

pytest.importorskip("flask", reason="moto's server mode needs moto[server] (flask, flask-cors)")


WAIT_SECONDS = 60.0
BATCHES = 2  # step 1 inspect, 2-3 copy, 4 ask; then 5 drop (if approved), 6 email, DONE
WAITING_STEP = 4
DONE_STEP = 6
THIS_MODULE = __name__
SCRUBBED = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "RATCHET_STORE", "RATCHET_FAULT")


def _nested(depth: int) -> Any:
    """A list in a list ... `depth` levels deep: deeper than `json.dumps` can recurse."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# --- an agent that keeps its data on the local disk ---------------------------------------------


class Note(BaseModel):
    text: str = Field(min_length=1)


@tool(side_effect=True)
def write_note(args: Note, ctx: ToolContext) -> str:
    """Write a note into the run's folder, once per step."""
    note = ctx.resources / f"{ctx.idempotency_key.replace('/', '_')}.txt"
    note.write_text(args.text, encoding="utf-8")
    return f"wrote {note.name}"


def _note_then_finish(view: StepView) -> ToolCall | Done:
    if not view.messages:
        return ToolCall(name="write_note", arguments={"text": "kept on this disk"})
    return Done(summary="wrote one note")


def _prepare_disk(run: RunContext) -> None:
    # Writes where the runtime keeps run data, so a start refused too late would leave a trace.
    assert run.data is not None
    run.data.put("prepared", "yes")
    run.workdir.mkdir(parents=True, exist_ok=True)


disk_agent = Agent(
    name="disk-notes",
    goal="Write one note.",
    tools=[write_note],
    policy=_note_then_finish,
    resources=lambda run: run.workdir,
    prepare=_prepare_disk,
    needs_local_disk=True,
)

stdio_agent = Agent(
    name="stdio-tools",
    goal="Use a local MCP server.",
    tools=[],
    mcp=[McpServer(command="mcp-server-shop", args=["--stdio"])],
    policy=_note_then_finish,
    prepare=_prepare_disk,
)


# --- the stores --------------------------------------------------------------------------------


@dataclass
class Store:
    """One store URL, and what the test needs to see everything it holds."""

    kind: str
    url: str
    snapshot: Callable[[], Any]
    clients: list[Client] = field(default_factory=list)

    def connect(self) -> Client:
        client = ratchet.connect(self.url)
        self.clients.append(client)
        return client


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    with moto_server() as endpoint:
        yield endpoint


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No API key (so the scripted policy drives), no default store, no fault plan."""
    for name in SCRUBBED:
        monkeypatch.delenv(name, raising=False)


def _sqlite_store(tmp_path: Any) -> Store:
    db = tmp_path / "runs.db"

    def snapshot() -> Any:
        files = sorted(p for p in tmp_path.rglob("*") if p.is_file())
        return {str(p.relative_to(tmp_path)): p.read_bytes() for p in files}

    return Store("sqlite", f"sqlite:///{db}", snapshot)


def _dynamodb_store(endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Store:
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AWS_CONFIG_FILE": "/dev/null",
        "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # Tables of its own for each test: the moto server is shared by the module.
    suffix = uuid.uuid4().hex[:8]
    tables = {"checkpoints": f"ckpt-{suffix}", "idempotency": f"ledger-{suffix}"}
    tables["app"] = f"app-{suffix}"
    admin = boto3.client("dynamodb", region_name=REGION, endpoint_url=endpoint)
    create_tables(admin, **tables)

    def snapshot() -> Any:
        return {table: scan(admin, table) for table in tables.values()}

    url = (
        f"dynamodb://{tables['checkpoints']}?ledger={tables['idempotency']}&app={tables['app']}"
        f"&region={REGION}&endpoint={endpoint}"
    )
    return Store("dynamodb", url, snapshot)


@pytest.fixture(params=["sqlite", "dynamodb"])
def store(
    request: pytest.FixtureRequest,
    tmp_path: Any,
    monkeypatch: pytest.MonkeyPatch,
    offline: None,
) -> Iterator[Store]:
    if request.param == "sqlite":
        made = _sqlite_store(tmp_path)
    else:
        made = _dynamodb_store(request.getfixturevalue("moto_endpoint"), monkeypatch)
    yield made
    for client in made.clients:
        client.close()


@pytest.fixture
def client(store: Store) -> Client:
    return store.connect()


class Elsewhere:
    """`client.work(run_id)` on a thread of its own, with a client of its own (made on that
    thread) on the same store URL, as another program would work the run."""

    def __init__(self, store: Store, run_id: str) -> None:
        self.store = store
        self.run_id = run_id
        self.result: Run | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._work, name=f"work-{run_id}", daemon=True)
        self.thread.start()

    def _work(self) -> None:
        try:
            with ratchet.connect(self.store.url) as worker:
                self.result = worker.work(self.run_id)
        except BaseException as error:  # handed to the test's thread by `join`
            self.error = error

    def join(self) -> Run:
        self.thread.join(WAIT_SECONDS)
        assert not self.thread.is_alive(), f"the worker of {self.run_id} did not return"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def _start_migration(client: Client, run_id: str) -> Run:
    return client.start(run_id=run_id, scenario="migration", input={"batches": BATCHES})


# --- start, wait, approve, wait, read ------------------------------------------------------------


def test_a_run_worked_elsewhere_is_followed_approved_and_read_back(store, client):
    # Given a migration started, not worked
    run_id = f"api-{store.kind}"
    started = _start_migration(client, run_id)
    assert (started.status, started.step, started.input) == (RunStatus.RUNNING, 0, {"batches": 2})

    # When another thread works it, we wait until it asks a person
    worker = Elsewhere(store, run_id)
    waiting = client.wait(run_id, until={"waiting"}, timeout=WAIT_SECONDS)

    # Then it waits at the approval step, with the question it asked
    assert worker.join().status is RunStatus.WAITING
    assert waiting.status is RunStatus.WAITING
    assert waiting.step == WAITING_STEP
    assert waiting.waiting is not None
    assert waiting.waiting.step == WAITING_STEP
    assert waiting.waiting.prompt.startswith("Drop legacy_orders.")
    assert waiting.waiting.details["action"] == "Drop legacy_orders"

    # When a person approves and the run is worked again
    approved = client.approve(run_id, by="dana", comment="ok")
    assert (approved.status, approved.waiting) == (RunStatus.RUNNING, None)
    worker = Elsewhere(store, run_id)
    done = client.wait(run_id, until={RunStatus.DONE}, timeout=WAIT_SECONDS)

    # Then it finishes, having dropped the table
    assert worker.join().status is RunStatus.DONE
    assert (done.status, done.step, done.error) == (RunStatus.DONE, DONE_STEP, None)
    assert done.summary is not None
    assert "legacy_orders was dropped" in done.summary

    # And its history is every write, in order, with the person's decision among them
    history = client.history(run_id)
    versions = [c.version for c in history]
    assert versions == sorted(set(versions))
    assert history[-1].version == done.version
    assert history[0].event == "created"
    assert history[-1].event == "finished"
    assert {c.event for c in history} == {"created", "step", "decided", "finished"}
    assert [c.step for c in history if c.event == "step"] == list(range(1, DONE_STEP + 1))
    (decided,) = [c for c in history if c.event == "decided"]
    assert (decided.step, decided.status) == (WAITING_STEP, RunStatus.RUNNING)
    assert client.head(run_id).messages[-1].tool == "send_email"

    # And the state as of step 1 is rebuilt from the records
    at_1 = client.state_at(run_id, step=1)
    assert (at_1.run_id, at_1.step, at_1.status) == (run_id, 1, RunStatus.RUNNING)
    assert [m.tool for m in at_1.messages] == ["inspect_table"]
    assert client.state_at(run_id, step=DONE_STEP) == client.head(run_id)

    # And it is listed among the done runs, and its invariants hold
    assert run_id in {r.run_id for r in client.runs(status="done")}
    assert run_id not in {r.run_id for r in client.runs(status=RunStatus.WAITING)}
    checked = client.verify(run_id)
    assert checked["ok"] is True, checked
    assert (checked["target_rows"], checked["emails_sent"], checked["legacy_dropped"]) == (
        BATCHES * 1000,
        1,
        True,
    )


def test_run_works_in_this_process_until_waiting_then_until_done(store, client):
    run_id = f"inline-{store.kind}"

    waiting = client.run(run_id=run_id, scenario="migration", input={"batches": BATCHES})
    assert (waiting.status, waiting.step) == (RunStatus.WAITING, WAITING_STEP)
    assert waiting.waiting is not None
    client.approve(run_id, by="dana", comment="ok")
    done = client.run(run_id=run_id)

    assert (done.status, done.step) == (RunStatus.DONE, DONE_STEP)
    assert client.verify(run_id)["legacy_dropped"] is True
    assert client.run(run_id=run_id) == done  # a done run: nothing more happens


def test_a_run_parked_on_tables_that_name_no_state_machine_says_nobody_is_asked(
    moto_endpoint: str,
    monkeypatch: pytest.MonkeyPatch,
    offline: None,
    caplog: pytest.LogCaptureFixture,
):
    # A stack's tables without its state machine (`&machine=`): the request can be opened
    # only by the stack, which holds the link key, so the client cannot ask, and says so.
    client = _dynamodb_store(moto_endpoint, monkeypatch).connect()
    try:
        with caplog.at_level(logging.WARNING, logger="ratchet"):
            waiting = client.run(run_id="nobody", scenario="migration", input={"batches": BATCHES})
    finally:
        client.close()

    assert waiting.status is RunStatus.WAITING
    (said,) = [r.getMessage() for r in caplog.records if "nobody is asked" in r.getMessage()]
    assert "&machine=" in said


def test_a_rejected_run_goes_on_knowing_the_answer_was_no(store, client):
    run_id = f"rejected-{store.kind}"
    assert client.run(run_id=run_id, scenario="migration", input={"batches": BATCHES}).waiting

    after = client.reject(run_id, by="dana", comment="not today")
    done = client.run(run_id=run_id)

    assert after.status is RunStatus.RUNNING
    assert done.status is RunStatus.DONE
    assert done.summary is not None
    assert "kept, since the drop was not approved" in done.summary
    assert [m.tool for m in client.head(run_id).messages][-2:] == [
        "request_approval",
        "send_email",
    ]
    checked = client.verify(run_id)
    assert (checked["ok"], checked["legacy_dropped"], checked["emails_sent"]) == (True, False, 1)
    assert "decided" in {c.event for c in client.history(run_id)}


def test_starting_an_existing_id_again_changes_nothing(store, client):
    """The same request again is a no-op; another under the taken id is refused (a conflict),
    and neither writes anything."""
    run_id = f"twice-{store.kind}"
    first = _start_migration(client, run_id)
    before = store.snapshot()

    again = _start_migration(client, run_id)
    with pytest.raises(RunRequestInvalid, match="exists with another goal, input"):
        client.start(run_id=run_id, scenario="migration", input={"batches": 7})

    assert again == first
    assert store.snapshot() == before


# --- refusals ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("request_args", "fields"),
    [
        ({"scenario": "migration", "input": {"batches": 0}}, ("input.batches",)),
        ({"scenario": "migration", "input": {"batches": "many"}}, ("input.batches",)),
        ({"scenario": "migration", "input": {"rows": 5}}, ("input.rows",)),
        ({"agent": "no-such-agent"}, ("agent",)),
        ({"scenario": "no-such-scenario"}, ("scenario",)),
        ({"scenario": "migration", "agent": "migration"}, ("scenario", "agent")),
        ({"scenario": "migration", "max_steps": 0}, ("max_steps",)),
        ({"scenario": "migration", "model": "claude-sonnet-4-5"}, ("model",)),
        ({"scenario": "migration", "input": {"batches": _nested(60_000)}}, ("input",)),
    ],
    ids=[
        "batches-zero",
        "batches-text",
        "unknown-input",
        "unknown-agent",
        "unknown-scenario",
        "scenario-and-agent",
        "max-steps-zero",
        "claude-without-key",
        "input-nested-too-deep",
    ],
)
def test_a_bad_request_names_its_field_and_writes_nothing(store, client, request_args, fields):
    before = store.snapshot()

    with pytest.raises(RunRequestInvalid) as refused:
        client.start(run_id="refused", **request_args)

    assert refused.value.fields == fields
    assert all(f in str(refused.value) for f in fields)
    assert store.snapshot() == before
    with pytest.raises(RunNotFound):
        client.get("refused")


def test_an_agent_module_that_cannot_be_imported_is_a_bad_request(store, client):
    # `Client.start` documents an unknown agent as `RunRequestInvalid` naming `agent`, whether
    # its reference is a name or a module:attr that does not import.
    before = store.snapshot()

    with pytest.raises(RunRequestInvalid) as refused:
        client.start(run_id="refused", agent="no_such_module_anywhere:agent")

    assert refused.value.fields == ("agent",)
    assert store.snapshot() == before


def test_wait_gives_up_at_its_timeout_on_a_run_nobody_works(store, client):
    run_id = f"idle-{store.kind}"
    _start_migration(client, run_id)

    with pytest.raises(ratchet.WaitTimedOut) as gave_up:
        client.wait(run_id, timeout=0)

    assert gave_up.value.run.status is RunStatus.RUNNING
    assert run_id in str(gave_up.value)
    with pytest.raises(ratchet.WaitTimedOut):
        client.wait(run_id, until={"done"}, timeout=0)
    assert client.wait(run_id, until={"running"}, timeout=0).step == 0


def test_reading_an_unknown_run_is_run_not_found(store, client):
    for read in (client.get, client.head, client.history, client.verify, client.work):
        with pytest.raises(RunNotFound):
            read("nobody-started-this")
    with pytest.raises(RunNotFound):
        client.state_at("nobody-started-this", step=1)
    with pytest.raises(RunNotFound):
        client.approve("nobody-started-this", by="dana")
    with pytest.raises(InvalidInput):
        client.get("not a run id!")


def test_state_at_a_step_the_run_never_reached_is_refused(store, client):
    run_id = f"short-{store.kind}"
    _start_migration(client, run_id)

    with pytest.raises(InvalidInput, match="no checkpoint at step 3"):
        client.state_at(run_id, step=3)


# --- agents that need a local disk ----------------------------------------------------------------


def test_an_agent_that_needs_a_local_disk_is_refused_on_dynamodb_and_nothing_is_written(
    moto_endpoint, monkeypatch, offline
):
    store = _dynamodb_store(moto_endpoint, monkeypatch)
    before = store.snapshot()
    with store.connect() as client:
        with pytest.raises(AgentNotRunnable, match="needs_local_disk"):
            client.start(run_id="on-disk", agent=f"{THIS_MODULE}:disk_agent")

        assert store.snapshot() == before
        with pytest.raises(RunNotFound):
            client.get("on-disk")


def test_an_agent_with_a_stdio_mcp_server_is_refused_on_dynamodb_and_nothing_is_written(
    moto_endpoint, monkeypatch, offline
):
    store = _dynamodb_store(moto_endpoint, monkeypatch)
    before = store.snapshot()
    with store.connect() as client:
        with pytest.raises(AgentNotRunnable, match=r"stdio MCP server \(mcp-server-shop\)"):
            client.start(run_id="stdio", agent=f"{THIS_MODULE}:stdio_agent")

        assert store.snapshot() == before


def test_an_agent_that_needs_a_local_disk_runs_on_sqlite(tmp_path, offline):
    store = _sqlite_store(tmp_path)
    with store.connect() as client:
        done = client.run(run_id="on-disk", agent=f"{THIS_MODULE}:disk_agent")

        assert (done.status, done.step, done.summary) == (RunStatus.DONE, 1, "wrote one note")
        note = tmp_path / "runs.data" / "on-disk" / "on-disk_step-1.txt"
        assert note.read_text(encoding="utf-8") == "kept on this disk"
