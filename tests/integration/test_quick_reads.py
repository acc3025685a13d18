"""`ratchet status`, `history` and `list` on a SQLite store answer from the store's JSON
(`ratchet.cli.quick`), without loading pydantic, typer or rich, and say exactly what the full CLI
says: for runs in every status, every kind of checkpoint, priced usage, and heads of every
schema (the older ones go to the full CLI). What the quick path is unsure of goes to the full
CLI, which answers or refuses as it always has."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import ratchet
from ratchet.adapters.sqlite.leases import SqliteLeases
from ratchet.cli import app as cli
from ratchet.cli import options, quick
from ratchet.errors import StepAttemptFailed
from ratchet.worker import Worker
from tests.fixtures.stores.make_schema_versions import FIXTURE
from tests.integration import test_model_custom as own_model
from tests.integration.test_permanent_errors import Lookup, Order, engine_with
from tests.processes import RATCHET, clean_env
from tests.support import LOG, Harness, StubModel

PRICES = json.dumps({f"{own_model.__name__}:*": {"input": 3.0, "output": 15.0}})


def _never_found(args: Order) -> str:
    raise KeyError(args.order_id)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store with runs in every status, each kind of checkpoint and a priced model's usage."""
    root = tmp_path_factory.mktemp("quick")
    # Three failed attempts (their records), then failed: written by a worker that never waits.
    harness = Harness(root, StubModel(total=1))
    harness.start()
    Worker(
        engine_with(harness, Lookup(_never_found)),
        SqliteLeases(harness.db),
        LOG,
        sleep=lambda _: None,
    ).run(until_idle=True)
    # One failed attempt, and the run left backing off (its head says until when).
    harness.start("backoff")
    with pytest.raises(StepAttemptFailed):
        engine_with(harness, Lookup(_never_found)).advance("backoff")
    harness.db.close()
    url = f"sqlite:///{root / 'ratchet.db'}"
    with contextlib.ExitStack() as stack:
        stack.enter_context(_environment(url))
        client = stack.enter_context(ratchet.connect(url, environ={}))
        for run_id in ("done", "rejected", "cancelled", "waiting"):
            client.run(run_id=run_id, scenario="migration", input={"batches": 2})
        client.approve("done", by="dana", comment="go ahead [bold]")
        client.run(run_id="done")
        client.reject("rejected", by="sam", comment="not today")
        client.run(run_id="rejected")
        client.cancel("cancelled", reason="wrong table", by="dana")
        client.run(run_id="stopped", scenario="migration", input={"batches": 3}, max_steps=2)
        client.run(run_id="broken", agent="tests.breaker_agent:agent")
        client.retry("broken", by="dana")
        client.work("broken")
        client.fork("done", from_step=3, run_id="forked")
        client.run(run_id="priced", agent=own_model.AGENT, model=f"{own_model.__name__}:model")
    return root / "ratchet.db"


RUNS = (
    "run",
    "backoff",
    "done",
    "rejected",
    "cancelled",
    "waiting",
    "stopped",
    "broken",
    "forked",
    "priced",
)


@contextlib.contextmanager
def _environment(url: str) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.startswith(("RATCHET_", "ANTHROPIC_"))]:
            patch.delenv(name)
        patch.setenv("RATCHET_STORE", url)
        patch.setenv("RATCHET_PRICES", PRICES)
        yield


def full_cli(args: list[str]) -> tuple[int, str, str]:
    """What `ratchet.cli` (the full CLI) prints, run in this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(args)
        except SystemExit as exit:
            code = exit.code if isinstance(exit.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def both(url: str, args: list[str]) -> tuple[str | None, str]:
    with _environment(url):
        said = quick.answer(args, os.environ)
        code, full, problem = full_cli(args)
    assert code == 0, problem
    return said, full


@pytest.mark.parametrize("run_id", RUNS)
@pytest.mark.parametrize("command", ["status", "history"])
@pytest.mark.parametrize("as_json", [False, True])
def test_a_run_reads_the_same_on_both_paths(store, run_id, command, as_json):
    args = [command, run_id, *(["--json"] if as_json else [])]

    said, full = both(f"sqlite:///{store}", args)

    assert said is not None, "the quick path answers for a run of the current schema"
    assert said == full


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["list", "--json"],
        ["list", "--status", "failed"],
        ["list", "--status=waiting", "--json"],
        ["list", "--status", "running", "--json"],
        ["list", "--limit", str(len(RUNS))],
        ["list", "--limit=10", "--status", "done", "--json"],
        ["history", "done", "--after", "3"],
        ["history", "done", "--after=3", "--json"],
        ["history", "done", "--last", "2", "--json"],
        ["history", "--last=3", "run", "--after", "1"],
        ["history", "done", "--after", "999"],
        ["history", "broken", "--last", "1000", "--json"],
        ["list", "--limit", str(options.MAX_ROWS)],
        ["history", "done", "--last", str(options.MAX_ROWS)],
    ],
)
def test_the_run_list_and_parts_of_a_history_read_the_same_on_both_paths(store, args):
    said, full = both(f"sqlite:///{store}", args)

    assert said is not None
    assert said == full


@pytest.mark.parametrize(
    "args",
    [
        ["status", "done", "--store", "{path}"],
        ["status", "done", "--store={path}", "--json"],
        ["--json", "status", "done", "--store", "{url}"],
        ["--store", "{path}", "--json", "history", "done"],
        ["list", "--status", "done", "--store", "{path}"],
        ["status", "done", "--log-json", "--store", "{path}"],
        ["--log-json", "history", "done", "--store", "{path}", "--json"],
    ],
)
def test_options_typed_anywhere_and_a_bare_path_read_the_same_on_both_paths(store, args):
    """`--store` after the command, `--json` before it and a store given as a file's path."""
    typed = [a.format(path=store, url=f"sqlite:///{store}") for a in args]
    _, expected = both(f"sqlite:///{store}", [a for a in args if "{" not in a and a != "--store"])

    said, full = both("sqlite:///elsewhere.db", typed)  # the options, not the setting, name it

    assert said is not None
    assert said == full == expected


@pytest.mark.parametrize("as_json", [False, True])
def test_a_list_cut_short_goes_to_the_full_cli_which_says_how_to_go_on(store, as_json):
    url = f"sqlite:///{store}"
    every = json.loads(both(url, ["list", "--json"])[1])["runs"]
    seen: list[dict[str, object]] = []
    args = ["list", "--limit", "4", *(["--json"] if as_json else [])]
    while True:
        said, full = both(url, args)
        assert said is None or said == full  # cut short, or `--after`: the full CLI answers
        if as_json:
            page = json.loads(full)
            seen += page["runs"]
            token = page["next"]
        else:
            *_, last = full.splitlines()
            token = last.split("--after ")[1] if last.startswith("more: ") else None
            seen += json.loads(both(url, [*args[:3], "--json", *args[3:]])[1])["runs"]
        if token is None:
            break
        args = ["list", "--limit", "4", "--after", token, *(["--json"] if as_json else [])]

    assert seen == every  # each run once, in the order of the whole list


def test_a_history_after_a_version_is_the_tail_of_the_whole_and_explains_only_its_gaps(store):
    url = f"sqlite:///{store}"
    whole = json.loads(both(url, ["history", "done", "--json"])[1])
    after = json.loads(both(url, ["history", "done", "--json", "--after", "1"])[1])
    last = json.loads(both(url, ["history", "done", "--json", "--last", "2"])[1])

    assert after["checkpoints"] == [c for c in whole["checkpoints"] if c["version"] > 1]
    assert after["unrecorded_versions"] == whole["unrecorded_versions"]  # the first is 2
    assert last["checkpoints"] == whole["checkpoints"][-2:]
    assert all(g["from"] > last["checkpoints"][0]["version"] for g in last["unrecorded_versions"])


def test_a_run_backing_off_says_until_when(store):
    status = json.loads(both(f"sqlite:///{store}", ["status", "backoff", "--json"])[1])

    assert (status["status"], status["attempts"]) == ("running", 1)
    assert status["not_before"] is not None
    assert "KeyError" in status["error"]


def test_the_store_holds_what_the_comparison_needs(store):
    """The runs above cover every status and every kind of checkpoint, a cost and a gap."""
    url = f"sqlite:///{store}"
    listed = json.loads(both(url, ["list", "--json"])[1])["runs"]
    kinds = {
        c["event"]
        for run_id in RUNS
        for c in json.loads(both(url, ["history", run_id, "--json"])[1])["checkpoints"]
    }
    priced = json.loads(both(url, ["status", "priced", "--json"])[1])

    assert {r["status"] for r in listed} == quick.STATUSES
    assert kinds == {"created", "step", "decided", "attempt_failed", "finished", "retried"}
    assert priced["cost_usd"] > 0
    assert "attempt counted (no record)" in both(url, ["history", "run"])[1]


def test_a_run_priced_by_ratchet_prices_names_them_the_same_on_both_paths(store):
    said, full = both(f"sqlite:///{store}", ["status", "priced"])

    assert said == full
    cost = next(line for line in full.splitlines() if line.lstrip().startswith("cost_usd"))
    assert cost.endswith("(estimated, prices from RATCHET_PRICES)"), cost


def test_heads_of_every_schema_read_the_same_through_the_entry_point(tmp_path, capsys):
    """Older heads go to the full CLI (which upgrades them in memory); current ones do not."""
    copy = tmp_path / "schemas.db"
    shutil.copy(FIXTURE, copy)
    copy.chmod(0o600)  # as Ratchet makes a store: a copy others may read is the full CLI's
    url = f"sqlite:///{copy}"
    run_ids = [r["run_id"] for r in json.loads(both(url, ["list", "--json"])[1])["runs"]]
    answered = set()
    for run_id in run_ids:
        for command in (["status", run_id], ["history", run_id, "--json"]):
            said, full = both(url, command)
            falls_back = pytest.raises(SystemExit) if said is None else contextlib.nullcontext()
            with _environment(url), falls_back:
                quick.main(command)
            assert capsys.readouterr().out == full
            if said is not None:
                answered.add(run_id)

    assert answered == {r for r in run_ids if r.startswith("v4-")}


@pytest.mark.parametrize(
    ("args", "environ"),
    [
        (["status", "nope"], {}),  # no such run: the full CLI says so
        (["status", "-x"], {}),
        (["status"], {}),
        (["status", "done", "extra"], {}),
        (["status", "done", "--help"], {}),
        (["list", "--status", "finished"], {}),  # not a status: the full CLI refuses it
        (["list", "--status", ""], {}),
        (["list", "--limit", "0"], {}),  # out of range: the full CLI refuses it
        (["list", "--limit", "1000000"], {}),
        (["list", "--limit", str(options.MAX_ROWS + 1)], {}),
        (["history", "done", "--last", "1000000"], {}),
        (["show", "done"], {}),
        (["--store", "dynamodb://t?ledger=l&app=a&region=eu-west-1", "status", "done"], {}),
        (["status", "done"], {"RATCHET_FAULT": "kill:after_tool@1"}),  # checked by the full CLI
        (["status", "done"], {"RATCHET_STORE": "sqlite:///no/such/store.db"}),
        ([], {}),
    ],
)
def test_what_the_quick_path_is_unsure_of_goes_to_the_full_cli(store, args, environ):
    # Given as a mapping, not put in os.environ: a RATCHET_FAULT left in this process's
    # environment would kill the step of every later test in the same worker.
    with _environment(f"sqlite:///{store}"):
        assert quick.answer(args, {**os.environ, **environ}) is None
    assert not Path("no/such/store.db").exists()


def test_a_store_flag_a_relative_path_and_uri_characters_in_a_path_are_read(
    store, tmp_path, monkeypatch
):
    odd = tmp_path / "what?#%20" / "runs.db"
    odd.parent.mkdir()
    shutil.copy(store, odd)
    monkeypatch.chdir(store.parent)
    with _environment("sqlite:///elsewhere.db"):
        said = quick.answer(["--store", f"sqlite:///{store.name}", "status", "done"], os.environ)
        again = quick.answer([f"--store=sqlite:///{store.name}", "list"], os.environ)
        odd_list = quick.answer(["--store", f"sqlite:///{odd}", "list", "--json"], os.environ)
    assert said is not None
    assert "done" in said
    assert again is not None
    assert "forked" in again
    assert odd_list is not None
    assert len(json.loads(odd_list)["runs"]) == len(RUNS)
    assert not (store.parent / "elsewhere.db").exists()


def test_the_console_script_answers_without_loading_pydantic_typer_or_rich(store):
    # Nor what takes longer to load than the read takes to answer (bench/cli_start.py):
    # `re` (which `json` and `fnmatch` load), `enum`, `typing`, `dataclasses`, `datetime`'s
    # pure-Python half, `sqlite3`'s (its `dbapi2` loads `datetime`), Ratchet's errors.
    probe = (
        "import sys\n"
        "from ratchet.cli.quick import main\n"
        "for args in (['status', 'done'], ['history', 'broken', '--json'], ['list'],\n"
        "             ['status', 'done', '--json'], ['history', 'done']):\n"
        "    main(args)\n"
        "heavy = {'pydantic', 'typer', 'rich', 'ratchet.state', 're', 'json', 'sqlite3',\n"
        "         'datetime', 'enum', 'typing', 'dataclasses', 'fnmatch', 'ratchet.errors'}\n"
        "quick = {'ratchet.cli.quick', 'ratchet.cli.readout', 'ratchet.cli.argv',\n"
        "         'ratchet.cli.store_file'}\n"
        "full = {m for m in sys.modules if m.startswith('ratchet.cli.') and m not in quick}\n"
        "loaded = heavy & set(sys.modules) | full\n"
        "print('LOADED', sorted(loaded))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}
    env["RATCHET_STORE"] = f"sqlite:///{store}"

    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "LOADED []"
    assert "finished: failed" in done.stdout


@pytest.mark.parametrize("text", ['{"a" 1}', '{"a": 1', "[1, 2", '"cut', "{bad}"])
def test_quickjson_refuses_with_jsons_error_in_a_process_that_has_not_loaded_json(text):
    # As a quick read meets them: `json` not loaded. Python 3.11's scanner raises these
    # errors as `json.decoder.JSONDecodeError`, which it finds only once `json` is loaded.
    probe = (
        "import sys\n"
        "from ratchet import quickjson\n"
        "assert 'json' not in sys.modules\n"
        "try:\n"
        "    quickjson.loads(sys.argv[1])\n"
        "except ValueError as error:\n"
        "    print(type(error).__name__, error.pos, error)\n"
    )
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)

    done = subprocess.run(
        [sys.executable, "-c", probe, text], capture_output=True, text=True, timeout=60
    )

    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"JSONDecodeError {theirs.value.pos} {theirs.value}\n"


def test_the_full_cli_answers_help_and_refuses_an_option_before_loading_the_run_models():
    # Typer reads every command's options first: the command modules import the runtime, the
    # client and the run models inside the commands (ratchet.cli.context says why). Typer's
    # own bounds checks load pydantic itself, so only Ratchet's models are looked for.
    probe = (
        "import sys\n"
        "from ratchet.cli.app import main\n"
        "for args in (['--help'], ['start', '--max-steps', '0'], ['gc', '--help']):\n"
        "    try:\n"
        "        main(args)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = {'ratchet.state', 'ratchet.client', 'ratchet.runtime.local'}\n"
        "print('LOADED', sorted(heavy & set(sys.modules)))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_")}

    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "LOADED []"
    assert "--max-steps must be a whole number from 1 to 10000" in done.stderr


def test_the_console_script_is_the_quick_entry_point():
    script = Path(sys.executable).with_name("ratchet").read_text(encoding="utf-8")

    assert "from ratchet.cli.quick import main" in script


@pytest.mark.parametrize("columns", ["80", "132"])
def test_help_reads_the_same_on_both_paths_on_a_terminal_80_columns_wide_or_wider(columns):
    """The quick path prints the help kept in `src/ratchet/cli/help.txt`; when this fails, the
    commands changed: `COLUMNS=80 python -m ratchet.cli --help > src/ratchet/cli/help.txt`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("COLUMNS", columns)
        said = quick.help_text(os.environ)
        code, full, problem = full_cli(["--help"])

    assert code == 0, problem
    assert said == full


def test_a_narrower_terminal_gets_its_help_from_the_full_cli():
    assert quick.help_text({"COLUMNS": "79"}) is None


QUICK_CLI = [
    sys.executable,
    "-c",
    "import sys; from ratchet.cli.quick import main; main(sys.argv[1:])",
]
"""The console script `ratchet` (the entry point), in a process of its own: stderr as a person
sees it (the warning line). `python -m ratchet.cli` is the full CLI alone."""


def test_a_sealed_store_and_one_others_may_read_say_the_same_on_both_paths(tmp_path: Path):
    # Given a store whose records are sealed (RATCHET_PAYLOAD_KEY), of a run given a secret
    store = tmp_path / "ratchet.db"
    secret = "Zanzibar-Quokka-7731"
    made = subprocess.run(
        [
            *(*RATCHET, "--store", str(store), "run", "--agent"),
            *("tests.fixtures.sealed_agent:agent", "--param", f"customer={secret}"),
            *("--run-id", "s1"),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=clean_env(RATCHET_PAYLOAD_KEY="local"),
    )
    assert made.returncode == 0, made.stderr
    reads = (
        ["status", "s1"],
        ["status", "s1", "--json"],
        ["history", "s1"],
        ["history", "s1", "--json"],
        ["list"],
        ["list", "--json"],
    )

    def said(command: list[str], args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        done = subprocess.run(
            [*command, "--store", str(store), *args],
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=120,
        )
        return done.returncode, done.stdout, done.stderr

    # When each read is asked of the entry point and of the full CLI, with the key and without,
    # and again once others may read the store
    for mode in (0o600, 0o644):
        store.chmod(mode)
        for env in (clean_env(RATCHET_PAYLOAD_KEY="local"), clean_env()):
            for args in reads:
                quick_said = said(QUICK_CLI, args, env)
                full_said = said(RATCHET, args, env)
                # Then both say the same, byte for byte: the secret with the key, one line
                # naming the key without it (the list's ids and times stay readable), and
                # the one warning line while others may read the store
                assert quick_said == full_said, (mode, "RATCHET_PAYLOAD_KEY" in env, args)
                code, out, err = quick_said
                warned = [line for line in err.splitlines() if "may be read by other" in line]
                assert len(warned) == (1 if mode == 0o644 else 0), err
                if "RATCHET_PAYLOAD_KEY" in env or args[0] == "list":
                    assert code == 0, err
                    assert secret in out or args[0] == "list"
                else:
                    assert (code, out) == (2, "")
                    assert "sealed with key 'local:" in err


@pytest.mark.parametrize(
    ("prices", "said"),
    [
        ('{"x": 3}', 'such as {"input": 3, "output": 15} (cache_write and cache_read optional)'),
        ("notjson", "is neither a JSON object nor a readable file"),
    ],
)
@pytest.mark.parametrize("as_json", [False, True])
def test_a_malformed_ratchet_prices_is_refused_by_status_in_one_line_on_both_paths(
    store: Path, prices: str, said: str, as_json: bool
):
    # Given a price table that is not one, when `status` (which prices the run) is asked of
    # the entry point and of the full CLI
    args = ["--store", f"sqlite:///{store}", "status", "priced", *(["--json"] if as_json else [])]
    env = clean_env(RATCHET_PRICES=prices)
    for command in (QUICK_CLI, RATCHET):
        done = subprocess.run(
            [*command, *args], capture_output=True, text=True, env=env, timeout=120, check=False
        )

        # Then each refuses it in one line that says what a price entry looks like, exit 2
        assert done.returncode == 2, done.stderr
        assert done.stdout == ""
        assert done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith("ratchet: RATCHET_PRICES")
        assert said in done.stderr
        assert "PricesInput" not in done.stderr


@pytest.mark.parametrize("args", [["history", "priced"], ["list"], ["list", "--json"]])
def test_a_read_that_prices_nothing_answers_with_a_malformed_ratchet_prices(store: Path, args):
    # `history` and `list` print no cost: a price table they never read does not stop them.
    env = clean_env(RATCHET_PRICES='{"x": 3}')
    for command in (QUICK_CLI, RATCHET):
        done = subprocess.run(
            [*command, "--store", f"sqlite:///{store}", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )

        assert done.returncode == 0, done.stderr
        assert "step committed" in done.stdout or "priced" in done.stdout


UNREAD_SETTINGS = [
    ("RATCHET_LOG_LEVEL", "DEBUG"),
    ("RATCHET_LOG_LEVEL", "warning"),
    ("RATCHET_LOG_LEVEL", ""),
    ("RATCHET_PUBLIC_URL", "https://ratchet.example.com/base"),
    ("RATCHET_WEBHOOK_SECRET", "s3cret"),
    ("RATCHET_SLACK_SIGNING_SECRET", "s3cret"),
]


@pytest.mark.parametrize(("name", "value"), UNREAD_SETTINGS)
@pytest.mark.parametrize(
    "args",
    [
        ["status", "done"],
        ["status", "priced", "--json"],
        ["history", "broken"],
        ["history", "waiting", "--json"],
        ["list"],
        ["list", "--json"],
    ],
)
def test_a_setting_a_read_ignores_leaves_it_on_the_quick_path_saying_the_same(
    store, name, value, args
):
    url = f"sqlite:///{store}"
    _, unset = both(url, args)
    # Given a setting the full CLI checks and a read then ignores, with a value it takes
    with _environment(url), pytest.MonkeyPatch.context() as patch:
        patch.setenv(name, value)
        said = quick.answer(args, os.environ)
        code, full, problem = full_cli(args)

    # Then the quick path answers, and says what the full CLI says with it and without it
    assert code == 0, problem
    assert said is not None, f"{name}={value!r} sends the read to the full CLI"
    assert said == full == unset


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("RATCHET_LOG_LEVEL", "chatty"),
        ("RATCHET_LOG_LEVEL", "\u0131nfo"),  # not ASCII: left to the full CLI, whatever it takes
        ("RATCHET_PUBLIC_URL", "ratchet.example.com"),
        ("RATCHET_PUBLIC_URL", "https://ratchet.example.com/?x"),
        ("RATCHET_PUBLIC_URL", "https://"),
        ("RATCHET_WEBHOOK_SECRET", "caf\udce9"),  # not UTF-8, as the environment gave it
        ("RATCHET_PAYLOAD_KEY", "local"),  # changes what a read can open
        ("RATCHET_WEBHOOKS", "https://hooks.example.com/x"),
        ("RATCHET_NOT_A_SETTING", "1"),
    ],
)
def test_a_setting_the_quick_path_cannot_vouch_for_goes_to_the_full_cli(store, name, value):
    with _environment(f"sqlite:///{store}"):
        assert quick.answer(["status", "done"], {**os.environ, name: value}) is None
