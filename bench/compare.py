"""The same scripted agent on Ratchet, LangGraph and DBOS, each on SQLite (`make compare`), or
on Ratchet and DBOS, each on Postgres (`--postgres`).

Every step of `bench.scripted_agent` is one tool call with 200 bytes of JSON arguments and a
1,024-byte result. Each framework runs it as its users would write it, on its own durable
defaults (printed with the figures):

- Ratchet: the real local runtime and engine (`LocalRuntime`, `Engine.advance` as a worker
  calls it), the agent's scripted policy deciding and its tool answering.
- LangGraph: a `StateGraph` over `MessagesState` with one node that decides and calls the tool
  (an `AIMessage` with the tool call, then the `ToolMessage`), looping through a conditional
  edge, compiled with `SqliteSaver` on a file and run with `durability="sync"`, so each step is
  committed before the next starts (LangGraph's default, "async", commits while the next runs).
- DBOS: a workflow whose loop makes two steps each turn, the decision (where a model call
  goes, so a recovery does not ask again) and the tool call, on a SQLite system database.

Each run of N steps is a fresh database in a fresh process, timed from just before the run is
created until step N is durable; then the process exits without a word to the database, as a
killed worker would. The run of 1,000 steps is then resumed by fresh processes, each timed
from after its imports until its first step is durable (open the database, build the app,
load the run, take and commit the step).

Bytes, per step of the run (its creation included):

- row bytes: the values the framework binds to its INSERT, UPDATE and REPLACE statements
  (text as UTF-8, blobs as they are, numbers as 8 bytes; the keys an UPDATE's WHERE binds
  count too), counted by wrapping Python's `sqlite3` connections, which all three use (DBOS
  through SQLAlchemy);
- written bytes: what the process handed to write(2) (`wchar` in /proc/self/io): SQLite's WAL
  or rollback journal, the pages it checkpoints into the database, nothing else (logs are
  off). The same count for all three, whatever their journal mode;
- stored bytes, read from the database the run left (read only, WAL included): its size
  (pages times page size) and the payload of its rows (the `payload` column of SQLite's
  `dbstat`: every table's and index's cells), and how much each grows a step from the
  second-longest run to the longest, which leaves out what a new database holds before any
  step (its schema).

`--postgres [ADMIN_URL]` runs Ratchet and DBOS with their stores on Postgres instead: a
throwaway cluster (`tests/postgres_support.py`), or the server at ADMIN_URL, each run in a
database of its own (Ratchet's `postgresql://` store; DBOS's system database), fresh runs of
10, 100 and 500 steps in fresh processes. Per step: the wall time of each step (median, p90);
the cluster's WAL (its insert position before and after: the same count for both, whatever
their tables), over the whole run and over its last 10 steps alone, to show whether what a
step writes grows with the run; and the growth of the database's tables (their rows, indexes
and TOAST) from the second-longest run to the longest.

`--before REV` runs Ratchet a second time, as it was at the git revision REV (its `src`,
taken with `git archive`, first on the children's path), in a column of its own: the figures
before and after a change, in one run.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import itertools
import json
import os
import platform
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Any, NoReturn, Protocol, Self

from bench.measure import DISCARD, bytes_written_by_process, wal_position
from bench.scripted_agent import (
    MAX_STEPS,
    TOOL_NAME,
    arguments_for,
    new_scripted_run,
    result_for,
)
from ratchet.engine import Engine, Outcome
from ratchet.observability import json_logger
from ratchet.runtime.local import LocalRuntime, LocalSettings

PROJECT_ROOT = Path(__file__).resolve().parents[1]
FRAMEWORKS = ("ratchet", "langgraph", "dbos")
BEFORE = "ratchet-before"
"""Ratchet at another revision (`--before`): its children run `ratchet` from `SOURCES`."""
NAMES = {"ratchet": "Ratchet", BEFORE: "Ratchet before", "langgraph": "LangGraph", "dbos": "DBOS"}
MODULES = {
    "ratchet": (),
    "langgraph": ("langchain_core.messages", "langgraph.checkpoint.sqlite", "langgraph.graph"),
    "dbos": ("dbos", "dbos._dbos"),
}
"""What each framework's code imports: imported before any timer starts, as a worker's are."""
STEP_COUNTS = (10, 100, 1000)
RESUME_SAMPLES = 3
"""Fresh processes in a row on the longest run; each takes one more step."""
RUN_ID = "compare-lookups"
DATABASE = "compare.sqlite"
CHILD_TIMEOUT_SECONDS = 1800


# --- what a framework hands SQLite -----------------------------------------------------------


@dataclass
class Tally:
    row_bytes: int = 0
    commits: int = 0
    by_statement: dict[str, int] = field(default_factory=dict)
    """Row bytes by verb and table (`INSERT checkpoints`)."""


TALLY = Tally()
_WRITE_VERBS = {"INSERT", "UPDATE", "REPLACE"}
_COMMIT_VERBS = {"COMMIT", "END"}


def _verb(sql: str) -> str:
    head = sql.lstrip().split(None, 1)
    return head[0].upper() if head else ""


def _statement(sql: str) -> str:
    """`INSERT checkpoints`, `UPDATE runs`: the verb and the table a write names."""
    words = sql.replace("(", " ").split()
    verb = words[0].upper()
    rest = [w for w in words[1:] if w.upper() not in {"OR", "REPLACE", "IGNORE", "INTO"}]
    return f"{verb} {rest[0].strip(chr(34)) if rest else '?'}"


def _value_bytes(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, bool | int | float):
        return 8
    if isinstance(value, str):
        return len(value.encode("utf-8", "surrogatepass"))
    if isinstance(value, bytes | bytearray | memoryview):
        return len(value)
    return len(str(value).encode("utf-8"))


def _bound_bytes(parameters: object) -> int:
    if isinstance(parameters, Mapping):
        return sum(_value_bytes(v) for v in parameters.values())
    if isinstance(parameters, list | tuple):
        return sum(_value_bytes(v) for v in parameters)
    return 0


_DIRTY: set[int] = set()
"""Connections whose open transaction has written: committing one that only read costs SQLite
no write and no sync, so it is no durable commit."""


def _counted(
    connection: sqlite3.Connection, sql: str, rows: Sequence[Any], run: Callable[[], Any]
) -> Any:
    verb = _verb(sql)
    answer = run()
    if verb in _WRITE_VERBS:
        bound = sum(_bound_bytes(row) for row in rows)
        TALLY.row_bytes += bound
        statement = _statement(sql)
        TALLY.by_statement[statement] = TALLY.by_statement.get(statement, 0) + bound
        if connection.in_transaction:
            _DIRTY.add(id(connection))
        else:
            TALLY.commits += 1  # autocommit: the statement was its own transaction
    elif verb in _COMMIT_VERBS or verb == "ROLLBACK":
        _ended(connection, committed=verb != "ROLLBACK")
    elif verb == "PRAGMA":
        _note_synchronous(connection, sql)
    return answer


def _ended(connection: sqlite3.Connection, *, committed: bool) -> None:
    if id(connection) in _DIRTY:
        _DIRTY.discard(id(connection))
        TALLY.commits += committed and _SYNCHRONOUS.get(id(connection), 2) >= 2


_SYNCHRONOUS: dict[int, int] = {}
"""Each connection's `PRAGMA synchronous` as last set through it (SQLite's default, FULL, where
never set): a commit at NORMAL in WAL mode is synced by the next one that syncs, so it is no
durable commit of its own. Only Ratchet lowers it, for its attempt counts, in WAL mode."""
_LEVELS = {"0": 0, "off": 0, "1": 1, "normal": 1, "2": 2, "full": 2, "3": 3, "extra": 3}


def _note_synchronous(connection: sqlite3.Connection, sql: str) -> None:
    setting = re.fullmatch(r"\s*PRAGMA\s+synchronous\s*=\s*(\w+)\s*;?\s*", sql, re.IGNORECASE)
    if setting is not None:
        _SYNCHRONOUS[id(connection)] = _LEVELS.get(setting.group(1).lower(), 2)


class _CountingCursor(sqlite3.Cursor):
    def execute(self, sql: str, parameters: Any = (), /) -> Self:
        run = super().execute
        _counted(self.connection, sql, [parameters], lambda: run(sql, parameters))
        return self

    def executemany(self, sql: str, seq_of_parameters: Any, /) -> Self:
        rows = list(seq_of_parameters)
        run = super().executemany
        _counted(self.connection, sql, rows, lambda: run(sql, rows))
        return self


class _CountingConnection(sqlite3.Connection):
    """Mixed into whatever connection class the caller asked for (Ratchet has its own).
    `Connection.execute` makes its cursor in C, past `cursor()`, so it is counted here."""

    def cursor(self, factory: Any = _CountingCursor) -> Any:
        return super().cursor(factory)

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:
        run = super().execute
        cursor: sqlite3.Cursor = _counted(self, sql, [parameters], lambda: run(sql, parameters))
        return cursor

    def executemany(self, sql: str, parameters: Any, /) -> sqlite3.Cursor:
        rows = list(parameters)
        run = super().executemany
        cursor: sqlite3.Cursor = _counted(self, sql, rows, lambda: run(sql, rows))
        return cursor

    def commit(self) -> None:
        super().commit()
        _ended(self, committed=True)

    def rollback(self) -> None:
        super().rollback()
        _ended(self, committed=False)


@contextmanager
def counting_sqlite_writes() -> Iterator[Tally]:
    """Count what every connection opened meanwhile writes (`Connection.execute` and
    SQLAlchemy's pysqlite both go through `cursor()`)."""
    original = sqlite3.connect
    mixed: dict[type[sqlite3.Connection], type[sqlite3.Connection]] = {}

    def connect(*args: Any, factory: type[sqlite3.Connection] = sqlite3.Connection, **kw: Any):
        if factory not in mixed:
            mixed[factory] = type(f"Counting{factory.__name__}", (_CountingConnection, factory), {})
        return original(*args, factory=mixed[factory], **kw)

    for module in (sqlite3, sqlite3.dbapi2):
        setattr(module, "connect", connect)  # noqa: B010 (a module attribute, patched)
    try:
        yield TALLY
    finally:
        for module in (sqlite3, sqlite3.dbapi2):
            setattr(module, "connect", original)  # noqa: B010


# --- one run, measured -----------------------------------------------------------------------


@dataclass(frozen=True)
class RunFigures:
    framework: str
    steps: int
    wall_ms: float
    cpu_ms: float
    row_bytes: int
    written_bytes: int
    """Handed to write(2): `wchar` in /proc/self/io."""
    commits: int
    journal_mode: str
    synchronous: int
    database_bytes: int = 0
    """The database the run left: pages times page size (read after the run, WAL included)."""
    payload_bytes: int = 0
    """The payload of every cell of its tables and indexes (`dbstat`)."""
    by_statement: dict[str, int] = field(default_factory=dict)
    """Row bytes by verb and table."""
    pages: dict[str, int] = field(default_factory=dict)
    """Pages by table or index (`dbstat`)."""

    def per_step(self, figure: str) -> float:
        value: float = getattr(self, figure)
        return value / self.steps


@dataclass
class Meter:
    wall: float = field(default_factory=time.perf_counter)
    cpu: float = field(default_factory=time.process_time)
    written: int = field(default_factory=bytes_written_by_process)
    row_bytes: int = field(default_factory=lambda: TALLY.row_bytes)
    commits: int = field(default_factory=lambda: TALLY.commits)
    by_statement: dict[str, int] = field(default_factory=lambda: dict(TALLY.by_statement))

    def figures(
        self, framework: str, steps: int, pragmas: Callable[[], tuple[str, int]]
    ) -> RunFigures:
        """The counters since the meter started; then `pragmas`, outside the window."""
        wall, cpu, written = time.perf_counter(), time.process_time(), bytes_written_by_process()
        row_bytes, commits = TALLY.row_bytes, TALLY.commits
        journal_mode, synchronous = pragmas()
        return RunFigures(
            framework=framework,
            steps=steps,
            wall_ms=(wall - self.wall) * 1000,
            cpu_ms=(cpu - self.cpu) * 1000,
            row_bytes=row_bytes - self.row_bytes,
            written_bytes=written - self.written,
            commits=commits - self.commits,
            journal_mode=journal_mode,
            synchronous=synchronous,
            by_statement={
                name: bound - self.by_statement.get(name, 0)
                for name, bound in TALLY.by_statement.items()
            },
        )


def _sqlite_pragmas(connection: sqlite3.Connection) -> Callable[[], tuple[str, int]]:
    """The journal mode and synchronous level of a connection the framework writes through."""

    def read() -> tuple[str, int]:
        (journal_mode,) = connection.execute("PRAGMA journal_mode").fetchone()
        (synchronous,) = connection.execute("PRAGMA synchronous").fetchone()
        return str(journal_mode), int(synchronous)

    return read


def _exit_with(answer: dict[str, Any]) -> NoReturn:
    """Print the figures and die without closing anything, as a killed worker does."""
    print(json.dumps(answer))
    sys.stdout.flush()
    os._exit(0)


# --- Ratchet ---------------------------------------------------------------------------------


def _ratchet_engine(runtime: LocalRuntime) -> Engine:
    return runtime.engine(worker_id="compare", logger=json_logger(DISCARD))


def run_ratchet(directory: Path, steps: int) -> RunFigures:
    """N steps of a new run, as `ratchet worker` takes them; the run is left running."""
    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{directory / DATABASE}"))
    try:
        engine = _ratchet_engine(runtime)
        state = new_scripted_run(RUN_ID, max_steps=MAX_STEPS)
        meter = Meter()
        if not engine.start(state):
            raise RuntimeError(f"{RUN_ID} already exists in {directory}")
        for expected in range(1, steps + 1):
            outcome = engine.advance(RUN_ID)
            if outcome.outcome is not Outcome.CONTINUE or outcome.step != expected:
                raise RuntimeError(f"expected step {expected} to complete, got {outcome}")
        return meter.figures("ratchet", steps, _sqlite_pragmas(runtime.db.connection))
    finally:
        runtime.close()


def resume_ratchet(directory: Path, from_step: int) -> float:
    started = time.perf_counter()
    runtime = LocalRuntime.open(
        LocalSettings(store=f"sqlite:///{directory / DATABASE}"), create=False
    )
    outcome = _ratchet_engine(runtime).advance(RUN_ID)
    durable = time.perf_counter()
    runtime.close()
    if outcome.outcome is not Outcome.CONTINUE or outcome.step != from_step + 1:
        raise RuntimeError(f"expected step {from_step + 1} to complete, got {outcome}")
    return (durable - started) * 1000


# --- LangGraph -------------------------------------------------------------------------------


def _langgraph_app(path: Path, at_step: Callable[[int], None]) -> tuple[Any, Any]:
    """The graph, compiled with a `SqliteSaver` on `path` (as `from_conn_string` opens it)."""
    from langchain_core.messages import AIMessage, ToolMessage
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, MessagesState, StateGraph

    def act(state):
        # Each step adds two messages: the model's tool call and the tool's answer.
        step = len(state["messages"]) // 2 + 1
        at_step(step)
        arguments = arguments_for(step)
        call_id = f"call-{step}"
        call = {"name": TOOL_NAME, "args": arguments, "id": call_id, "type": "tool_call"}
        return {
            "messages": [
                AIMessage(content="", tool_calls=[call]),
                ToolMessage(content=result_for(arguments), tool_call_id=call_id),
            ],
        }

    def route(state):
        return END if len(state["messages"]) // 2 >= MAX_STEPS else "act"

    builder = StateGraph(MessagesState)
    builder.add_node("act", act)
    builder.add_edge(START, "act")
    builder.add_conditional_edges("act", route, ["act", END])
    saver = SqliteSaver(sqlite3.connect(path, check_same_thread=False))
    saver.setup()
    return builder.compile(checkpointer=saver), saver


def _langgraph_config() -> dict[str, Any]:
    return {"configurable": {"thread_id": RUN_ID}, "recursion_limit": MAX_STEPS + 10}


def run_langgraph(directory: Path, steps: int) -> NoReturn:
    meter: Meter | None = None

    def at_step(step: int) -> None:
        if step > steps:
            assert meter is not None
            _exit_with(asdict(meter.figures("langgraph", steps, _sqlite_pragmas(saver.conn))))

    graph, saver = _langgraph_app(directory / DATABASE, at_step)
    meter = Meter()
    graph.invoke({"messages": []}, _langgraph_config(), durability="sync")
    raise RuntimeError("the graph ended before its last step")


def resume_langgraph(directory: Path, from_step: int) -> NoReturn:
    started = time.perf_counter()
    durable: list[float] = []

    def at_step(step: int) -> None:
        if step > from_step + 1:
            _exit_with({"ms": (durable[-1] - started) * 1000, "puts": len(durable)})

    graph, saver = _langgraph_app(directory / DATABASE, at_step)
    put = saver.put

    def timed_put(*args: Any, **kwargs: Any) -> Any:
        saved = put(*args, **kwargs)
        durable.append(time.perf_counter())
        return saved

    saver.put = timed_put
    # What resuming a thread is in LangGraph: no input, the same thread id.
    graph.invoke(None, _langgraph_config(), durability="sync")
    raise RuntimeError("the graph ended before its last step")


# --- DBOS ------------------------------------------------------------------------------------


def _dbos_app(system_database: str, at_step: Callable[[int], None]) -> Callable[[], int]:
    """The workflow, and DBOS launched on the system database `system_database` (a SQLite
    file's URL, or a Postgres database's: `--postgres`), which recovers any workflow a dead
    process left pending."""
    from dbos import DBOS

    def model_call(step: int) -> dict[str, Any]:
        return {"name": TOOL_NAME, "arguments": arguments_for(step)}

    def tool_call(call: dict[str, Any]) -> str:
        return result_for(call["arguments"])

    # DBOS's decorators, applied as calls: the same registration, typed for mypy.
    decide: Callable[[int], dict[str, Any]] = DBOS.step(name="decide")(model_call)
    call_tool: Callable[[dict[str, Any]], str] = DBOS.step(name="call_tool")(tool_call)

    def lookups() -> int:
        transcript = []
        for step in range(1, MAX_STEPS + 1):
            at_step(step)
            call = decide(step)
            transcript.append((call, call_tool(call)))
        return len(transcript)

    scripted_lookups: Callable[[], int] = DBOS.workflow(name="scripted_lookups")(lookups)

    DBOS(
        config={
            "name": "compare",
            "system_database_url": system_database,
            "log_level": "ERROR",
        }
    )
    DBOS.launch()
    return scripted_lookups


def _dbos_pragmas() -> tuple[str, int]:
    from dbos._dbos import _get_dbos_instance

    # Private, but the only way to ask DBOS's own connections what they were opened with.
    engine = _get_dbos_instance()._sys_db.engine
    with engine.connect() as connection:
        journal_mode = connection.exec_driver_sql("PRAGMA journal_mode").scalar()
        synchronous = connection.exec_driver_sql("PRAGMA synchronous").scalar()
    return str(journal_mode), int(str(synchronous))


def run_dbos(directory: Path, steps: int) -> NoReturn:
    from dbos import SetWorkflowID

    meter: Meter | None = None

    def at_step(step: int) -> None:
        if step > steps:
            assert meter is not None
            _exit_with(asdict(meter.figures("dbos", steps, _dbos_pragmas)))

    workflow = _dbos_app(f"sqlite:///{directory / DATABASE}", at_step)
    meter = Meter()
    with SetWorkflowID(RUN_ID):
        workflow()
    raise RuntimeError("the workflow ended before its last step")


def resume_dbos(directory: Path, from_step: int) -> NoReturn:
    started = time.perf_counter()
    replay_started: list[float] = []

    def at_step(step: int) -> None:
        if not replay_started:
            replay_started.append(time.perf_counter())
        # The step before this one returned from its tool call, recorded: it is durable.
        if step > from_step + 1:
            durable = time.perf_counter()
            _exit_with(
                {
                    "ms": (durable - started) * 1000,
                    "until_replay_ms": (replay_started[0] - started) * 1000,
                }
            )

    _dbos_app(f"sqlite:///{directory / DATABASE}", at_step)
    time.sleep(CHILD_TIMEOUT_SECONDS)
    raise RuntimeError("DBOS did not recover the workflow")


CHILD_RUNS: dict[str, Callable[[Path, int], Any]] = {
    "ratchet": run_ratchet,
    "langgraph": run_langgraph,
    "dbos": run_dbos,
}
CHILD_RESUMES: dict[str, Callable[[Path, int], Any]] = {
    "ratchet": resume_ratchet,
    "langgraph": resume_langgraph,
    "dbos": resume_dbos,
}


# --- the parent: fresh processes, the table, the plot ----------------------------------------


def installed(framework: str) -> bool:
    try:
        return all(util.find_spec(name) is not None for name in MODULES[framework])
    except ModuleNotFoundError:  # a submodule's parent package is missing
        return False


SOURCES: dict[str, Path] = {}
"""Where a framework's children import `ratchet` from, if not this tree (`--before`)."""


def _child(*args: str, framework: str = "") -> dict[str, Any]:
    environment = dict(os.environ)
    if framework in SOURCES:
        environment["PYTHONPATH"] = os.pathsep.join([str(SOURCES[framework]), str(PROJECT_ROOT)])
    done = subprocess.run(
        [sys.executable, "-m", "bench.compare", *args],
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_SECONDS,
        check=False,
        env=environment,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"bench.compare {' '.join(args)} failed:\n{done.stderr[-4000:]}")
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


def _kind(framework: str) -> str:
    return "ratchet" if framework == BEFORE else framework


def measure_run(framework: str, steps: int, directory: Path) -> RunFigures:
    """N steps of a fresh run of `framework`, in a fresh process, in `directory`; then what
    the database it left holds."""
    directory.mkdir(parents=True, exist_ok=True)
    answer = _child("run", _kind(framework), str(steps), str(directory), framework=framework)
    database, payload, pages = stored_bytes(directory / DATABASE)
    answer.update(framework=framework, database_bytes=database, payload_bytes=payload, pages=pages)
    return RunFigures(**answer)


def stored_bytes(path: Path) -> tuple[int, int, dict[str, int]]:
    """The database's size (pages times page size), its rows' payload and its pages by table
    or index (`dbstat`), read through a read-only connection, which sees the WAL and writes
    nothing (no checkpoint)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (pages,) = connection.execute("PRAGMA page_count").fetchone()
        (page_size,) = connection.execute("PRAGMA page_size").fetchone()
        (payload,) = connection.execute("SELECT coalesce(sum(payload), 0) FROM dbstat").fetchone()
        by_table = dict(connection.execute("SELECT name, count(*) FROM dbstat GROUP BY name"))
    finally:
        connection.close()
    return int(pages) * int(page_size), int(payload), by_table


def measure_resume(framework: str, directory: Path, from_step: int) -> dict[str, float]:
    """`ms`: from after a fresh process's imports until its first step is durable (and, for
    DBOS, `until_replay_ms`: until its recovered workflow started running again)."""
    return _child("resume", _kind(framework), str(from_step), str(directory), framework=framework)


def _today() -> str:
    """The date a comparison was taken (UTC), as its report prints it."""
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")


@dataclass(frozen=True)
class Comparison:
    runs: dict[str, dict[int, RunFigures]]
    resumes: dict[str, list[dict[str, float]]]
    resumed_from: int
    missing: list[str]
    seconds: float
    before: str | None = None
    """The revision the `ratchet-before` column ran, if any."""
    taken: str = field(default_factory=_today)


def compare(
    root: Path,
    step_counts: Sequence[int] = STEP_COUNTS,
    frameworks: Sequence[str] = FRAMEWORKS,
    *,
    before: str | None = None,
) -> Comparison:
    started = time.perf_counter()
    present = [f for f in frameworks if installed(_kind(f))]
    runs: dict[str, dict[int, RunFigures]] = {f: {} for f in present}
    for steps in step_counts:
        for framework in present:  # interleaved, so that a noisy minute hits all three
            runs[framework][steps] = measure_run(framework, steps, root / f"{framework}-{steps}")
    longest = max(step_counts)
    resumes = {
        framework: [
            measure_resume(framework, root / f"{framework}-{longest}", longest + sample)
            for sample in range(RESUME_SAMPLES)
        ]
        for framework in present
    }
    return Comparison(
        runs=runs,
        resumes=resumes,
        resumed_from=longest,
        missing=[f for f in frameworks if f not in present],
        seconds=time.perf_counter() - started,
        before=before,
    )


def checked_out(revision: str, root: Path) -> Path:
    """Ratchet's `src` at `revision`, extracted under `root` (`git archive`, no checkout)."""
    target = root / "before"
    target.mkdir()
    archive = subprocess.run(
        ["git", "archive", "--format=tar", revision, "src"],
        cwd=PROJECT_ROOT,
        capture_output=True,
        check=True,
    )
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target / "src"


def versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "sqlite": sqlite3.sqlite_version}
    for package in (
        "ratchet-agents",
        "langgraph",
        "langgraph-checkpoint-sqlite",
        "dbos",
        "sqlalchemy",
        "psycopg",
        "matplotlib",
    ):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    return found


def machine() -> str:
    return f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs"


DURABILITY = {
    "ratchet": (
        "both set by the store; a step's attempt counted at NORMAL (in the WAL, synced by the"
        " decision's commit, before the tool runs)"
    ),
    "langgraph": "WAL set by SqliteSaver, synchronous SQLite's default; durability='sync' "
    "(LangGraph's default, 'async', commits while the next step runs)",
    "dbos": "neither set by DBOS (SQLite's defaults); each step's output committed as it returns",
    BEFORE: "as Ratchet",
}
SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def _ratio(value: float, base: float) -> str:
    return f"{value / base:.2f}x" if base else "-"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            cell.ljust(width) if i == 0 else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ).rstrip()
        for row in rows
    ]


FIGURES = (
    ("ms per step", "wall_ms", "{:,.2f} ms"),
    ("CPU ms per step (all threads)", "cpu_ms", "{:,.2f} ms"),
    ("row bytes per step", "row_bytes", "{:,.0f} B"),
    ("written bytes per step (write(2))", "written_bytes", "{:,.0f} B"),
    ("durable commits per step", "commits", "{:,.2f}"),
)


def _growth(result: Comparison, framework: str, attribute: str) -> float:
    """What `attribute` grows a step from the second-longest run to the longest."""
    runs = result.runs[framework]
    low, high = sorted(runs)[-2:]
    grown: float = getattr(runs[high], attribute) - getattr(runs[low], attribute)
    return grown / (high - low)


GROWTH = (
    ("payload a step (dbstat)", "payload_bytes"),
    ("database growth a step (file)", "database_bytes"),
)


def report(result: Comparison) -> str:
    present = list(result.runs)
    counts = sorted(next(iter(result.runs.values()))) if present else []
    found = versions()
    lines = [
        "The scripted agent (bench/scripted_agent.py): one tool call a step, 200 B of JSON "
        "arguments, a 1,024 B result",
        f"{result.taken}, {machine()}, Python {found['python']}, SQLite {found['sqlite']}",
        "ratchet-agents {ratchet-agents}, langgraph {langgraph} with langgraph-checkpoint-sqlite "
        "{langgraph-checkpoint-sqlite}, dbos {dbos} (SQLAlchemy {sqlalchemy})".format(**found),
        "Figures per step are means over a fresh run of that many steps, its creation included; "
        "ratios against Ratchet (1.00x).",
        *([f"Ratchet before: this tree's src at {result.before}."] if result.before else []),
        "",
    ]
    header = ["figure", *(NAMES[f] for f in present)]
    rows: list[list[str]] = [header]
    for label, attribute, shape in FIGURES:
        for steps in counts:
            base = result.runs["ratchet"][steps].per_step(attribute) if "ratchet" in present else 0
            cells = [f"{label}, {steps:,} steps"]
            for framework in present:
                value = result.runs[framework][steps].per_step(attribute)
                cells.append(f"{shape.format(value)} ({_ratio(value, base)})")
            rows.append(cells)
    if len(counts) > 1:
        low, high = counts[-2:]
        for label, attribute in GROWTH:
            base = _growth(result, "ratchet", attribute) if "ratchet" in present else 0.0
            cells = [f"{label}, steps {low:,}-{high:,}"]
            for framework in present:
                value = _growth(result, framework, attribute)
                cells.append(f"{value:,.0f} B ({_ratio(value, base)})")
            rows.append(cells)
    resume_ms = {f: [sample["ms"] for sample in result.resumes[f]] for f in present}
    if present:
        base = statistics.median(resume_ms["ratchet"]) if "ratchet" in present else 0.0
        cells = [f"resume after {result.resumed_from:,} steps, fresh process (median)"]
        for framework in present:
            value = statistics.median(resume_ms[framework])
            cells.append(f"{value:,.1f} ms ({_ratio(value, base)})")
        rows.append(cells)
        rows.append(
            ["  samples (ms)", *(" / ".join(f"{ms:,.1f}" for ms in resume_ms[f]) for f in present)]
        )
    lines += _table(rows)
    for framework in (f for f in ("ratchet", BEFORE) if f in present):
        longest = result.runs[framework][counts[-1]]
        bound = sorted(longest.by_statement.items(), key=lambda item: -item[1])
        pages = sorted(longest.pages.items(), key=lambda item: -item[1])
        lines += [
            f"{NAMES[framework]}, {longest.steps:,} steps: row bytes a step by statement: "
            + ", ".join(f"{name} {b / longest.steps:,.0f} B" for name, b in bound),
            "  pages by table or index (dbstat): "
            + ", ".join(f"{name} {n:,}" for name, n in pages if n > 1),
        ]
    lines += ["", "Durability, as each ran:"]
    for framework in present:
        figures = result.runs[framework][counts[-1]]
        lines.append(
            f"  {NAMES[framework]}: journal_mode={figures.journal_mode}, synchronous="
            f"{SYNCHRONOUS.get(figures.synchronous, figures.synchronous)}; "
            f"{DURABILITY[framework]}"
        )
    lines += [
        "Row bytes: values bound to INSERT/UPDATE/REPLACE. Written bytes: /proc/self/io wchar "
        "(WAL or journal, and checkpoints into the database).",
        "Resume: a fresh process, from after its imports until its first step is durable; "
        f"{RESUME_SAMPLES} processes in a row, each taking one more step.",
    ]
    if "dbos" in present:
        waited = statistics.median(s["until_replay_ms"] for s in result.resumes["dbos"])
        lines.append(
            f"DBOS's resume: {waited:,.0f} ms (median) until its recovered workflow ran again: "
            "launch re-enqueues it and its internal queue is polled (1 s by default)."
        )
    if result.missing:
        lines.append(
            "Not measured (not installed: make compare installs them): "
            + ", ".join(NAMES[f] for f in result.missing)
        )
    lines.append(f"compare took {result.seconds:.0f} s")
    return "\n".join(lines)


def plot(result: Comparison, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = versions()
    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6))
    colours = {
        "ratchet": "tab:blue",
        BEFORE: "tab:gray",
        "langgraph": "tab:orange",
        "dbos": "tab:green",
    }
    for framework, by_steps in result.runs.items():
        counts = sorted(by_steps)
        name, colour = NAMES[framework], colours[framework]
        series = (
            (left, "wall_ms", "o", "-", "wall"),
            (left, "cpu_ms", "s", ":", "CPU"),
            (right, "row_bytes", "o", "-", "row bytes"),
            (right, "written_bytes", "s", "--", "written (write(2))"),
        )
        for axes, figure_name, marker, linestyle, label in series:
            axes.plot(
                counts,
                [by_steps[n].per_step(figure_name) for n in counts],
                marker=marker,
                linestyle=linestyle,
                color=colour,
                label=f"{name}: {label}",
            )
    left.set(xscale="log", xlabel="steps in the run", ylabel="ms per step (mean)")
    left.set_title("Time per step")
    right.set(xscale="log", yscale="log", xlabel="steps in the run", ylabel="bytes per step (mean)")
    right.set_title("Bytes written per step")
    for axes in (left, right):
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(fontsize=8)
    left.set_ylim(bottom=0)
    figure.suptitle(
        "One scripted agent on SQLite: a tool call a step (200 B in, 1 KB out), one run each"
    )
    figure.text(
        0.01,
        0.01,
        f"{result.taken}, one run on a shared machine; {machine()}; "
        f"Python {found['python']}, SQLite {found['sqlite']}; "
        f"ratchet-agents {found['ratchet-agents']}, langgraph {found['langgraph']} + "
        f"checkpoint-sqlite {found['langgraph-checkpoint-sqlite']}, dbos {found['dbos']}",
        fontsize=7,
    )
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


# --- on Postgres (`--postgres`) --------------------------------------------------------------

POSTGRES_FRAMEWORKS = ("ratchet", "dbos")
POSTGRES_STEP_COUNTS = (10, 100, 500)
WINDOW_STEPS = 10
"""The last steps of each run, whose WAL is read apart: what a step writes at steps 1-10,
91-100 and 491-500, the run's creation out, to show whether it grows with the run."""
POSTGRES_DURABILITY = {
    "ratchet": "the engine's own commits: the attempt, the decision before the tool runs, the step",
    "dbos": "each DBOS step's output committed as it returns (two a turn: the decision and "
    "the tool call)",
}


@dataclass(frozen=True)
class PostgresRunFigures:
    framework: str
    steps: int
    step_ms: list[float]
    """Each step's wall time, from the step before it durable until it is durable."""
    wal_bytes: int
    """The cluster's WAL from just before the run was created until its last step was durable."""
    window_wal_bytes: int
    """The same for the run's last `window_steps` steps alone."""
    window_steps: int
    table_bytes: dict[str, int] = field(default_factory=dict)
    """What the run's database holds after it, by table (`pg_total_relation_size`: its rows,
    indexes and TOAST), read by the parent."""

    def wal_per_step(self) -> float:
        return self.wal_bytes / self.steps

    def window_wal_per_step(self) -> float:
        return self.window_wal_bytes / self.window_steps

    @property
    def window(self) -> tuple[int, int]:
        return self.steps - self.window_steps + 1, self.steps


class _StepClock:
    """Each step's wall time and the WAL positions a run's figures need, the positions read
    between steps, outside the steps' times (a query to the cluster costs a round trip)."""

    def __init__(self, url: str, steps: int) -> None:
        self.url, self.steps = url, steps
        self.window_steps = min(steps, WINDOW_STEPS)
        self.step_ms: list[float] = []
        self.started = self.window = wal_position(url)
        self._resumed = 0.0

    def before(self, step: int) -> None:
        """Step `step` starts: the one before it is durable."""
        if step == self.steps - self.window_steps + 1:
            self.window = wal_position(self.url)
        self._resumed = time.perf_counter()

    def after(self, step: int) -> None:
        self.step_ms.append((time.perf_counter() - self._resumed) * 1000)

    def figures(self, framework: str) -> dict[str, Any]:
        ended = wal_position(self.url)
        return asdict(
            PostgresRunFigures(
                framework=framework,
                steps=self.steps,
                step_ms=self.step_ms,
                wal_bytes=ended - self.started,
                window_wal_bytes=ended - self.window,
                window_steps=self.window_steps,
            )
        )


def run_ratchet_on_postgres(url: str, steps: int) -> dict[str, Any]:
    """N steps of a new run in the store at `url`, made first (its schema out of the figures),
    as `ratchet worker` takes them."""
    from ratchet.runtime.postgres import PostgresRuntime

    runtime = PostgresRuntime.open(LocalSettings(store=url))
    try:
        engine = _ratchet_engine(runtime)
        clock = _StepClock(url, steps)
        if not engine.start(new_scripted_run(RUN_ID, max_steps=MAX_STEPS)):
            raise RuntimeError(f"{RUN_ID} already exists in {url}")
        for expected in range(1, steps + 1):
            clock.before(expected)
            outcome = engine.advance(RUN_ID)
            clock.after(expected)
            if outcome.outcome is not Outcome.CONTINUE or outcome.step != expected:
                raise RuntimeError(f"expected step {expected} to complete, got {outcome}")
        return clock.figures("ratchet")
    finally:
        runtime.close()


def run_dbos_on_postgres(url: str, steps: int) -> NoReturn:
    """N steps of the workflow with DBOS's system database at `url`, launched first (its
    migrations out of the figures)."""
    from dbos import SetWorkflowID

    clock: _StepClock | None = None

    def at_step(step: int) -> None:
        # Called as each turn starts: the turn before it returned from its tool call, its two
        # DBOS steps recorded.
        assert clock is not None
        if step > 1:
            clock.after(step - 1)
        if step > steps:
            _exit_with(clock.figures("dbos"))
        clock.before(step)

    workflow = _dbos_app(url, at_step)
    clock = _StepClock(url, steps)
    with SetWorkflowID(RUN_ID):
        workflow()
    raise RuntimeError("the workflow ended before its last step")


CHILD_POSTGRES_RUNS: dict[str, Callable[[str, int], Any]] = {
    "ratchet": run_ratchet_on_postgres,
    "dbos": run_dbos_on_postgres,
}


class PostgresServer(Protocol):
    """Where the runs' databases are made: the tests' throwaway cluster
    (`tests.postgres_support.Cluster`) or a server given by its URL (`GivenServer`)."""

    def url(self, database: str = "postgres") -> str: ...

    def fresh_database(self) -> str: ...

    def drop_database(self, name: str) -> None: ...


@dataclass
class GivenServer:
    """A Postgres server given by a URL whose role may create databases: each run gets a
    database of its own there, dropped after."""

    admin_url: str
    _names: Iterator[int] = field(default_factory=itertools.count)

    def url(self, database: str = "postgres") -> str:
        parts = urllib.parse.urlsplit(self.admin_url)
        return urllib.parse.urlunsplit(parts._replace(path=f"/{database}"))

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as connection:
            connection.execute(sql.encode())  # names made here, never a caller's text

    def fresh_database(self) -> str:
        name = f"ratchet_compare_{os.getpid()}_{next(self._names)}"
        self._admin(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        self._admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def table_bytes(url: str) -> dict[str, int]:
    """Every table of the database at `url` but the catalog's, with its indexes and TOAST."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT n.nspname || '.' || c.relname, pg_total_relation_size(c.oid) "
            "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE c.relkind IN ('r', 'p') "
            "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
            "AND n.nspname NOT LIKE 'pg_toast%%'"
        ).fetchall()
    return {str(name): int(size) for name, size in rows}


def server_settings(url: str) -> dict[str, str]:
    """The server's version and the settings that decide what a commit costs it."""
    import psycopg

    names = ("server_version", "fsync", "synchronous_commit", "full_page_writes", "wal_level")
    with psycopg.connect(url, autocommit=True) as connection:
        return {name: str(connection.execute(f"SHOW {name}").fetchone()[0]) for name in names}  # type: ignore[index]


def measure_on_postgres(framework: str, steps: int, server: PostgresServer) -> PostgresRunFigures:
    """N steps of a fresh run of `framework` in a fresh process, in a database of its own on
    `server`; then what that database holds, and it is dropped."""
    name = server.fresh_database()
    url = server.url(name)
    try:
        answer = _child("postgres", framework, str(steps), url)
        answer["table_bytes"] = table_bytes(url)
    finally:
        server.drop_database(name)
    return PostgresRunFigures(**answer)


@dataclass(frozen=True)
class PostgresComparison:
    runs: dict[str, dict[int, PostgresRunFigures]]
    settings: dict[str, str]
    server: str
    missing: list[str]
    seconds: float
    taken: str = field(default_factory=_today)


def compare_on_postgres(
    server: PostgresServer,
    step_counts: Sequence[int] = POSTGRES_STEP_COUNTS,
    frameworks: Sequence[str] = POSTGRES_FRAMEWORKS,
    *,
    described: str = "a throwaway cluster, tests/postgres_support.py",
) -> PostgresComparison:
    started = time.perf_counter()
    present = [f for f in frameworks if installed(f)]
    runs: dict[str, dict[int, PostgresRunFigures]] = {f: {} for f in present}
    for steps in step_counts:
        for framework in present:  # interleaved, so that a noisy minute hits both
            runs[framework][steps] = measure_on_postgres(framework, steps, server)
    return PostgresComparison(
        runs=runs,
        settings=server_settings(server.url()),
        server=described,
        missing=[f for f in frameworks if f not in present],
        seconds=time.perf_counter() - started,
    )


def _p90(values: Sequence[float]) -> float:
    return (
        statistics.quantiles(values, n=10, method="inclusive")[-1] if len(values) > 1 else values[0]
    )


def _table_growth(result: PostgresComparison, framework: str) -> float:
    """What the database's tables grow a step from the second-longest run to the longest."""
    runs = result.runs[framework]
    low, high = sorted(runs)[-2:]
    grown = sum(runs[high].table_bytes.values()) - sum(runs[low].table_bytes.values())
    return grown / (high - low)


POSTGRES_FIGURES: tuple[tuple[str, Callable[[PostgresRunFigures], float], str], ...] = (
    ("ms a step, median", lambda run: statistics.median(run.step_ms), "{:,.2f} ms"),
    ("ms a step, p90", lambda run: _p90(run.step_ms), "{:,.2f} ms"),
    ("WAL bytes a step (creation included)", PostgresRunFigures.wal_per_step, "{:,.0f} B"),
)


def postgres_report(result: PostgresComparison) -> str:
    present = list(result.runs)
    counts = sorted(next(iter(result.runs.values()))) if present else []
    found = versions()
    settings = result.settings
    lines = [
        "The scripted agent (bench/scripted_agent.py) on Postgres: one tool call a step, 200 B "
        "of JSON arguments, a 1,024 B result",
        f"{result.taken}, {machine()}, Python {found['python']}, PostgreSQL "
        f"{settings['server_version']} ({result.server}): fsync={settings['fsync']}, "
        f"synchronous_commit={settings['synchronous_commit']}, "
        f"full_page_writes={settings['full_page_writes']}, wal_level={settings['wal_level']}",
        "ratchet-agents {ratchet-agents} (psycopg {psycopg}), dbos {dbos} (SQLAlchemy "
        "{sqlalchemy})".format(**found),
        "Each run a fresh database of that server, in a fresh process; ratios against Ratchet "
        "(1.00x).",
        "",
    ]
    rows: list[list[str]] = [["figure", *(NAMES[f] for f in present)]]

    def row(label: str, values: dict[str, float], shape: str) -> None:
        base = values.get("ratchet", 0.0)
        rows.append(
            [label, *(f"{shape.format(values[f])} ({_ratio(values[f], base)})" for f in present)]
        )

    for label, figure, shape in POSTGRES_FIGURES:
        for steps in counts:
            row(
                f"{label}, {steps:,} steps",
                {f: figure(result.runs[f][steps]) for f in present},
                shape,
            )
    for steps in counts:
        first, last = next(iter(result.runs.values()))[steps].window
        row(
            f"WAL bytes a step, steps {first:,}-{last:,}",
            {f: result.runs[f][steps].window_wal_per_step() for f in present},
            "{:,.0f} B",
        )
    if len(counts) > 1:
        low, high = counts[-2:]
        row(
            f"table bytes a step, steps {low:,}-{high:,}",
            {f: _table_growth(result, f) for f in present},
            "{:,.0f} B",
        )
    lines += _table(rows)
    for framework in present:
        longest = result.runs[framework][counts[-1]]
        tables = sorted(longest.table_bytes.items(), key=lambda item: -item[1])
        lines.append(
            f"{NAMES[framework]}, {longest.steps:,} steps, its tables (pg_total_relation_size): "
            + ", ".join(f"{name} {size / 1024:,.0f} KB" for name, size in tables if size)
        )
    if "ratchet" in present and len(counts) > 1:
        windows = [result.runs["ratchet"][n] for n in counts]
        lines.append(
            "What a Ratchet step writes to the WAL as its run grows: "
            + ", ".join(
                f"steps {w.window[0]:,}-{w.window[1]:,} {w.window_wal_per_step():,.0f} B"
                for w in windows
            )
            + f" ({windows[-1].window_wal_per_step() / windows[0].window_wal_per_step():.2f}x)"
        )
    lines += ["", "Durability, as each ran (the server's settings above hold for both):"]
    lines += [f"  {NAMES[f]}: {POSTGRES_DURABILITY[f]}" for f in present]
    lines += [
        "ms: a step's wall time, from the step before it durable until it is durable. WAL: "
        "pg_current_wal_insert_lsn() before and after, the whole cluster's (nothing else runs "
        "on it; autovacuum may).",
        "Table bytes: every table of the run's database with its indexes and TOAST, after the "
        "run; a step's is the growth from the second-longest run to the longest.",
    ]
    if result.missing:
        lines.append(
            "Not measured (not installed: make compare installs them): "
            + ", ".join(NAMES[f] for f in result.missing)
        )
    lines.append(f"compare took {result.seconds:.0f} s")
    return "\n".join(lines)


def _child_main(kind: str, framework: str, number: int, where: str) -> None:
    """`where`: the run's folder, or (`postgres`) its database's URL."""
    for module in MODULES[framework]:
        importlib.import_module(module)
    if kind == "postgres":
        _exit_with(CHILD_POSTGRES_RUNS[framework](where, number))
    with counting_sqlite_writes():
        if kind == "run":
            _exit_with(asdict(CHILD_RUNS[framework](Path(where), number)))
        _exit_with({"ms": CHILD_RESUMES[framework](Path(where), number)})


def _postgres_main(admin_url: str, steps: str | None) -> str:
    step_counts = [int(n) for n in steps.split(",")] if steps else POSTGRES_STEP_COUNTS
    if admin_url:
        server = GivenServer(admin_url)
        host = urllib.parse.urlsplit(admin_url).hostname or "a unix socket"
        return postgres_report(compare_on_postgres(server, step_counts, described=host))
    from tests.postgres_support import cluster

    return postgres_report(compare_on_postgres(cluster(), step_counts))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="The scripted agent on Ratchet, LangGraph, DBOS.")
    parser.add_argument("--steps", help=f"default {','.join(map(str, STEP_COUNTS))}")
    parser.add_argument("--plot", type=Path, default=PROJECT_ROOT / "docs" / "compare.png")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument(
        "--before",
        metavar="REV",
        help="also run Ratchet as it was at this git revision, in a column of its own",
    )
    parser.add_argument(
        "--postgres",
        nargs="?",
        const="",
        metavar="ADMIN_URL",
        help="Ratchet and DBOS with their stores on Postgres instead (steps 10,100,500 unless "
        "--steps says): on a throwaway cluster, or on the server at ADMIN_URL, whose role may "
        "create databases",
    )
    parser.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        kind, framework, number, where = args.child
        _child_main(kind, framework, int(number), where)
        return
    if args.postgres is not None:
        print(_postgres_main(args.postgres, args.steps))
        return
    step_counts = [int(n) for n in (args.steps or ",".join(map(str, STEP_COUNTS))).split(",")]
    frameworks: tuple[str, ...] = FRAMEWORKS
    with tempfile.TemporaryDirectory(prefix="ratchet-compare-") as root:
        if args.before:
            SOURCES[BEFORE] = checked_out(args.before, Path(root))
            frameworks = ("ratchet", BEFORE, *FRAMEWORKS[1:])
        result = compare(Path(root), step_counts, frameworks, before=args.before)
    print(report(result))
    if not args.no_plot and util.find_spec("matplotlib") is not None:
        plot(result, args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
