"""The damaged-store catalogue (issue 22): one run's row damaged in every way a disk, a bug or
a person can damage it, and every command and page against it.

A damaged run is named in one line (exit 2, no traceback) by every command about it; `list`,
`GET /runs` and the dashboard show it as damaged with the reason; `migrate` and `gc` report it
and go on; a worker skips it and works the other runs. Nothing else changes: the other runs'
rows stay byte-identical. A store damaged as a whole (a cut file, damaged pages) is one line
naming the store. `docs/bad-input.md` ("Damaged stores") says what a person sees.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import sqlite3
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import Client as HttpClient

from ratchet.cli.app import main as full_cli
from ratchet.cli.quick import main as ratchet
from ratchet.runtime.local import LocalRuntime, LocalSettings
from ratchet.runtime.services import local_runs_services
from ratchet.web.dashboard import local_app as dashboard_app
from ratchet.web.runs import build_app as runs_app
from ratchet.web.serve import wsgi_app
from tests.e2e.test_cli_contract import RATCHET, Cli, fresh

DAMAGED = "b"
OTHERS = ("a", "c")
LOG = logging.getLogger("ratchet.tests.damaged")


def _sql(statement: str) -> Callable[[Path], None]:
    def damage(db: Path) -> None:
        connection = sqlite3.connect(db)
        try:
            connection.execute(statement, {"run": DAMAGED})
            connection.commit()
        finally:
            connection.close()

    return damage


def _truncate(db: Path) -> None:
    _checkpointed(db)
    db.write_bytes(db.read_bytes()[: db.stat().st_size // 3])


def _random_pages(db: Path) -> None:
    """Random bytes over a few pages past the first (the header), with a fixed seed."""
    _checkpointed(db)
    data = bytearray(db.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    pick = random.Random(22)
    for number in pick.sample(range(1, len(data) // page), 4):
        data[number * page + 8 : (number + 1) * page] = pick.randbytes(page - 8)
    db.write_bytes(bytes(data))


def _checkpointed(db: Path) -> None:
    connection = sqlite3.connect(db)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()


NOT_UTF8 = "cast(x'7b22ff7d' as text)"
RUN_DAMAGE: dict[str, Callable[[Path], None]] = {
    "head-not-utf8": _sql(f"UPDATE runs SET state = {NOT_UTF8} WHERE run_id = :run"),
    "head-not-json": _sql("UPDATE runs SET state = 'not json {' WHERE run_id = :run"),
    "static-not-utf8": _sql(f"UPDATE run_static SET state = {NOT_UTF8} WHERE run_id = :run"),
    "status-not-utf8": _sql(f"UPDATE runs SET status = {NOT_UTF8} WHERE run_id = :run"),
    "status-tampered": _sql("UPDATE runs SET status = char(27) || '[2Jpwned' WHERE run_id = :run"),
    "record-not-utf8": _sql(
        f"UPDATE checkpoints SET event = {NOT_UTF8} WHERE run_id = :run AND version = "
        "(SELECT max(version) FROM checkpoints WHERE run_id = :run)"
    ),
    "record-not-json": _sql(
        "UPDATE checkpoints SET event = '{\"kind\":' WHERE run_id = :run AND version = "
        "(SELECT max(version) FROM checkpoints WHERE run_id = :run)"
    ),
}
"""Damage to one run's rows: that run is named, the others go on."""
STORE_DAMAGE: dict[str, Callable[[Path], None]] = {
    "truncated-file": _truncate,
    "random-pages": _random_pages,
}
"""Damage to the store as a whole: one line naming the store."""
LISTED = {"head-not-utf8", "head-not-json", "static-not-utf8", "status-not-utf8", "status-tampered"}
"""The damage a listing sees in the run's row; a damaged step record shows when it is read."""

RUN_COMMANDS = [
    ("status", DAMAGED),
    ("status", DAMAGED, "--json"),
    ("history", DAMAGED),
    ("show", DAMAGED),
    ("verify", DAMAGED),
    ("fork", DAMAGED, "--from-step", "1", "--run-id", "f"),
    ("cancel", DAMAGED),
    ("retry", DAMAGED),
    ("replay", DAMAGED, "--step", "1"),
    ("approve", DAMAGED),
]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Cli:
    """Three runs: `a` waiting for a person, `b` and `c` running at step 2 (their worker
    was killed after committing it; its leases are cleared, as if they had lapsed)."""
    cli = fresh(tmp_path_factory.mktemp("base"))
    cli.ok("run", "--scenario", "migration", "--batches", "2", "--run-id", "a")
    for run_id in ("b", "c"):
        cli.env["RATCHET_FAULT"] = "kill:after_commit@2"
        assert cli("run", "--scenario", "migration", "--batches", "2", "--run-id", run_id)
        del cli.env["RATCHET_FAULT"]
    connection = sqlite3.connect(cli.db)
    connection.execute("DELETE FROM leases")
    connection.execute("DELETE FROM workers")
    connection.commit()
    connection.close()
    return cli


def _damaged(base: Cli, tmp_path: Path, damage: Callable[[Path], None]) -> Cli:
    shutil.copytree(base.db.parent, tmp_path / "store")
    cli = Cli(db=tmp_path / "store" / base.db.name, cwd=tmp_path, env=base.env)
    damage(cli.db)
    return cli


def _rows_of_others(db: Path) -> dict[str, list[Any]]:
    """Every row of the other runs, byte for byte (text read as bytes)."""
    return _rows(db, DAMAGED, others=True)


def _say(
    capsys: pytest.CaptureFixture[str],
    cli: Cli,
    *args: str,
    main: Callable[[list[str]], None] = ratchet,
) -> tuple[int, str, str]:
    """`ratchet --store <cli's store> ARGS` in this process: the fast path, or the full CLI
    (with `main=full_cli`, the full CLI alone)."""
    try:
        main(["--store", cli.url, *args])
        code = 0
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    said = capsys.readouterr()
    return code, said.out, said.err


def _one_line(code: int, out: str, err: str, *mentions: str) -> None:
    assert code == 2, (code, out, err)
    assert out == ""
    assert "Traceback" not in err
    lines = err.splitlines()
    assert len(lines) == 1, err
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    assert "\x1b" not in err


# --- commands about the damaged run ----------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(RUN_DAMAGE))
def test_every_command_about_a_damaged_run_names_it_in_one_line(base, tmp_path, capsys, kind):
    cli = _damaged(base, tmp_path, RUN_DAMAGE[kind])
    others = _rows_of_others(cli.db)

    for command in RUN_COMMANDS:
        code, out, err = _say(capsys, cli, *command)
        _one_line(code, out, err, f"run {DAMAGED!r} cannot be read")

    assert _rows_of_others(cli.db) == others


@pytest.mark.parametrize("kind", sorted(RUN_DAMAGE))
def test_list_migrate_and_gc_report_the_damaged_run_and_go_on(base, tmp_path, capsys, kind):
    cli = _damaged(base, tmp_path, RUN_DAMAGE[kind])
    others = _rows_of_others(cli.db)

    code, out, err = _say(capsys, cli, "list", "--json")
    assert (code, err) == (0, "")
    listed = {r["run_id"]: r for r in json.loads(out)["runs"]}
    assert sorted(listed) == ["a", "b", "c"]
    assert [listed[r]["status"] for r in OTHERS] == ["waiting", "running"]
    if kind in LISTED:
        assert listed[DAMAGED]["status"] == "damaged"
        assert listed[DAMAGED]["damage"].startswith("column ")
    code, out, err = _say(capsys, cli, "list")
    assert (code, err) == (0, "")
    assert "\x1b" not in out

    code, out, err = _say(capsys, cli, "migrate", "--dry-run")
    assert (code, err) == (1, "")
    assert f"  {DAMAGED}  schema " in out
    assert "unreadable" in out

    code, out, err = _say(capsys, cli, "gc", "--older-than", "0")
    assert (code, err) == (0, "")

    assert _rows_of_others(cli.db) == others


HEAD_DAMAGE: dict[str, Callable[[Path], None]] = {
    "not-json": _sql("UPDATE runs SET state = '{status: running}' WHERE run_id = :run"),
    "cut-short": _sql(
        "UPDATE runs SET state = substr(state, 1, length(state) / 2) WHERE run_id = :run"
    ),
    "cut-before-its-last-brace": _sql(
        "UPDATE runs SET state = substr(state, 1, length(state) - 1) WHERE run_id = :run"
    ),
    "a-list": _sql("""UPDATE runs SET state = '["waiting", 4]' WHERE run_id = :run"""),
    "not-utf8": RUN_DAMAGE["head-not-utf8"],
    "static-cut-short": _sql(
        "UPDATE run_static SET state = substr(state, 1, length(state) / 2) WHERE run_id = :run"
    ),
}
"""The head (or its static part) damaged in each way the fast read path reads it: text that
JSON's scanner refuses part way (names not quoted, cut short), JSON of another shape, text
that is not UTF-8."""
FAST_READS = [
    ("status", DAMAGED),
    ("history", DAMAGED, "--json"),
    ("list",),
    ("list", "--json"),
]
"""The reads the `ratchet` command answers on its fast path, when it can."""


@pytest.mark.slow
def test_the_fast_reads_say_a_damaged_head_as_the_full_cli_does(base, tmp_path, capsys):
    # Each read is a `ratchet` process of its own: the fast path reads JSON without loading
    # `json` (`ratchet.quickjson`), which this process has loaded, so only a process of its
    # own reads it as a person's command does.
    for kind, damage in HEAD_DAMAGE.items():
        cli = _damaged(base, tmp_path / kind, damage)
        for read in FAST_READS:
            done = cli(*read)
            said = (done.returncode, done.stdout, done.stderr)

            assert said == _say(capsys, cli, *read, main=full_cli), (kind, read)
            if read[0] != "list":
                _one_line(*said, f"run {DAMAGED!r} cannot be read")
            elif read[-1] == "--json":
                listed = {r["run_id"]: r["status"] for r in json.loads(done.stdout)["runs"]}
                shape = kind == "a-list"  # JSON all the same: a listing does not parse heads
                assert listed[DAMAGED] == ("running" if shape else "damaged"), kind


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["head-not-utf8", "record-not-utf8", "static-not-utf8"])
def test_a_worker_skips_the_damaged_run_in_one_line_and_works_the_others(base, tmp_path, kind):
    cli = _damaged(base, tmp_path, RUN_DAMAGE[kind])
    damaged_before = _rows(cli.db, DAMAGED)

    worked = cli("worker", "--until-idle")

    assert worked.returncode == 0, worked.stderr
    assert "Traceback" not in worked.stderr + worked.stdout
    skipped = [
        line for line in (worked.stdout + worked.stderr).splitlines() if "run skipped" in line
    ]
    assert len(skipped) == 1, skipped
    assert f'"run_id":"{DAMAGED}"' in skipped[0].replace(" ", "")
    assert cli.json("status", "c")["status"] == "waiting"
    assert _rows(cli.db, DAMAGED) == damaged_before


def _rows(db: Path, run_id: str, *, others: bool = False) -> dict[str, list[Any]]:
    """Every row of the run (or, with `others`, of every other run), byte for byte."""
    connection = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    connection.text_factory = bytes
    which = "!=" if others else "="
    try:
        return {
            table: connection.execute(
                f"SELECT * FROM {table} WHERE run_id {which} ? ORDER BY 1, 2", (run_id,)
            ).fetchall()
            for table in ("runs", "run_static", "checkpoints", "idempotency", "run_data")
        }
    finally:
        connection.close()


# --- the pages and the runs API --------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(RUN_DAMAGE))
def test_the_pages_and_the_runs_api_mark_the_damaged_run_and_name_it(base, tmp_path, kind):
    cli = _damaged(base, tmp_path, RUN_DAMAGE[kind])
    others = _rows_of_others(cli.db)
    runtime = LocalRuntime.open(LocalSettings(store=cli.url), create=False)
    try:
        runs = local_runs_services(runtime, worker_id="serve:test", logger=LOG, operator="dana")
        desk = runtime.approval_desk(worker_id="serve:test", logger=LOG)
        http = HttpClient(
            wsgi_app(
                [
                    ("/runs", runs_app(lambda: runs)),
                    ("/dashboard", dashboard_app(runs.client, desk, operator="dana")),
                ]
            )
        )
        listed = http.get("/runs").get_json()["runs"]
        assert sorted(r["run_id"] for r in listed) == ["a", "b", "c"]
        for path in ("/dashboard", "/dashboard?status=running", "/dashboard?status=done"):
            page = http.get(path)
            assert page.status_code == 200, (path, page.get_data(as_text=True)[:300])
            assert "\x1b" not in page.get_data(as_text=True)
        everything = http.get("/dashboard").get_data(as_text=True)
        # The page lists what the runs' rows say (one read, no step record): a damaged row
        # shows there, a damaged step record on the run's own page, as in `list`.
        if kind in LISTED:
            assert "s-damaged" in everything
            assert "column " in everything
        else:
            assert f">{DAMAGED}</a>" in everything
        for path in (f"/runs/{DAMAGED}", f"/runs/{DAMAGED}/history"):
            answer = http.get(path)
            assert answer.status_code == 500, path
            assert f"run {DAMAGED!r} cannot be read" in answer.get_json()["error"]
        for path in (f"/dashboard/runs/{DAMAGED}", f"/dashboard/runs/{DAMAGED}/steps/1"):
            page = http.get(path)
            assert page.status_code == 500, path
            assert "Run damaged" in page.get_data(as_text=True)
        assert http.get("/runs/a").status_code == 200
        assert http.get("/dashboard/runs/a").status_code == 200
    finally:
        runtime.close()
    assert _rows_of_others(cli.db) == others


# --- a store damaged as a whole --------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(STORE_DAMAGE))
def test_a_store_damaged_as_a_whole_is_one_line_naming_it(base, tmp_path, capsys, kind):
    cli = _damaged(base, tmp_path, STORE_DAMAGE[kind])

    for command in [*RUN_COMMANDS, ("list",), ("migrate",), ("gc", "--older-than", "0")]:
        code, _, err = _say(capsys, cli, *command)
        assert "Traceback" not in err, (command, err)
        if code == 0:
            continue  # the damaged pages held nothing this command reads
        assert code in (1, 2), (command, code, err)
        lines = err.splitlines()
        assert len(lines) == 1, (command, err)
        # A cut file or a damaged page SQLite notices names the store; a page it cannot tell
        # from a good one may just lose the row (`no run with id 'b'`): one line all the same.
        assert lines[0].startswith("ratchet: "), (command, lines[0])
    if kind == "truncated-file":
        code, _, err = _say(capsys, cli, "status", DAMAGED)
        assert f"the store {cli.db} is damaged: database disk image is malformed" in err


@pytest.mark.slow
def test_the_worker_on_a_store_damaged_as_a_whole_says_so_in_one_line(base, tmp_path):
    cli = _damaged(base, tmp_path, _truncate)

    worked = cli("worker", "--until-idle")

    assert worked.returncode in (1, 2)
    assert "Traceback" not in worked.stderr
    assert str(cli.db) in worked.stderr


# --- reads change nothing ----------------------------------------------------------------------


def _bytes_of(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.mark.slow
def test_read_commands_leave_the_store_and_the_run_data_byte_identical(base, tmp_path, capsys):
    # Given a migration that dropped legacy_orders, approved and worked to the end
    cli = _damaged(base, tmp_path, lambda db: None)
    cli.ok("approve", "a")
    cli.ok("worker", "--until-idle")
    assert cli.json("status", "a")["status"] == "done"
    before = _bytes_of(cli.db.parent)

    # When every read command reads it
    for command in [
        ("verify", "a"),
        ("status", "a"),
        ("status", "a", "--json"),
        ("history", "a"),
        ("show", "a"),
        ("list",),
        ("replay", "a", "--step", "1"),
    ]:
        code, _, err = _say(capsys, cli, *command)
        assert code == 0, (command, err)

    # Then not a byte changed: verify did not make legacy_orders again, empty
    assert _bytes_of(cli.db.parent) == before


@pytest.mark.slow
def test_status_answers_on_a_store_this_process_may_not_write(base, tmp_path):
    # Given a store whose file and folder are read only for the user reading it (as root,
    # whom modes do not stop, the command runs without the capabilities that override them:
    # still root, so it reads the checkout and its .venv wherever they are)
    prefix: list[str] = []
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("needs setpriv to read as root without overriding file modes")
        prefix = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    cli = _damaged(base, tmp_path, _checkpointed)
    for leftover in cli.db.parent.glob("*.db-*"):
        leftover.unlink()
    cli.db.chmod(0o444)
    cli.db.parent.chmod(0o555)
    try:
        for args in (["status", "a"], ["history", "a"], ["list"], ["verify", "a"]):
            for env in ({}, {"RATCHET_BUSY_TIMEOUT_SECONDS": "5"}):  # fast path, full CLI
                done = subprocess.run(
                    [*prefix, str(RATCHET), "--store", cli.url, *args],
                    cwd="/",
                    env=cli.env | env,
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert done.returncode == 0, (args, env, done.stderr)
                assert "readonly" not in done.stderr
        assert not list(cli.db.parent.glob("*.db-*"))
    finally:
        cli.db.parent.chmod(0o755)


def test_a_failed_read_of_a_damaged_row_leaves_its_connection_free_to_write(tmp_path: Path):
    # A fetch that fails on text that is not UTF-8 must not leave its statement stepped: the
    # cursor, kept alive by the caller or the error's traceback, would hold a read snapshot,
    # and the connection's next write would fail at once (SQLITE_BUSY_SNAPSHOT) once another
    # connection had written. Seen as a worker's "step crashed: the store is busy".
    from ratchet.adapters.sqlite.database import SqliteDatabase
    from ratchet.errors import StoreDamaged

    path = tmp_path / "ratchet.db"
    db = SqliteDatabase(path)
    db.connection.execute("CREATE TABLE notes (text TEXT)")
    db.connection.execute(f"INSERT INTO notes VALUES ({NOT_UTF8}), ('readable')")
    cursor = db.connection.execute("SELECT text FROM notes")
    with pytest.raises(StoreDamaged):
        cursor.fetchone()

    other = sqlite3.connect(path)
    other.execute("INSERT INTO notes VALUES ('from another connection')")
    other.commit()
    other.close()
    with db.write() as tx:
        tx.execute("INSERT INTO notes VALUES ('from this one')")

    count = db.connection.execute("SELECT count(*) FROM notes").fetchone()[0]
    assert count == 4
    assert cursor is not None  # held to the end, as a traceback would hold it
    db.close()
