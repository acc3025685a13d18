"""How fast the `ratchet` command answers: the read commands (`status`, `history`, `list`),
`--help` and the commands that write (`start`, `run`, `approve`) beside a bare
`python -c pass`, each the median over rounds of fresh processes.

    python -m bench.cli_start [--runs 11]

It makes a store of its own in a temporary directory, with one migration run waiting for a
person, and times the installed console script (the one beside this Python). Every figure is
also a ratio over `python -c pass`, beside its target: a read command within 2x,
`--help` within 4x, a command that writes within 11x (150 ms beside a 13.7 ms `python -c pass`,
issue 36). The read commands and `--help` answer through `ratchet.cli.quick`, which
loads neither pydantic, typer nor rich (nor `re`, `json` or `sqlite3`'s Python half); beside
each is the same command through the full CLI (`python -m ratchet.cli`), timed in the same
rounds: what the quick path saves, and what a command it does not answer pays.

The commands that write: each round starts a run of the migration (`start`, which a worker
would work), runs another to where it waits for a person (`run`: its 4 steps, in the
foreground) and approves that one (`approve`), once through the console script and once through
the full CLI, each on runs of its own. The console script reads `start`'s and `approve`'s
options itself (`ratchet.cli.quick_writes`) and hands `run` to the full CLI. `run` is timed a
second time, on a run of its own, to its first step only: until its worker says it claimed the
run (the JSON log line `run claimed`, which `run` writes to a stderr that is not a terminal,
just before the step begins), which is what `run` takes to start, whatever its steps take.

Two things keep the figures honest on a shared, noisy machine:

- Bytecode. An installed copy runs from `.pyc` files; a machine that sets
  `PYTHONDONTWRITEBYTECODE` (this one does) would otherwise have every child compile our modules
  from source on every run. The children get `PYTHONPYCACHEPREFIX` pointing into the temporary
  directory (and no `PYTHONDONTWRITEBYTECODE`), and one warm-up round writes the bytecode there:
  nothing is written into the source tree or the venv, and every case, `python -c pass`
  included, reads its modules as an installed copy does.
- Interleaving. Each round runs one process of each case, in turn; a figure is the median over
  rounds, so a burst of load on the machine lands on every case alike.

Beside them are two floors, timed in the same rounds: a `python -c` that defines one pydantic
model and validates with it, and one that loads `ratchet.state`, the models of a run's state and
records. A command that writes validates its input with pydantic (every boundary does) and
writes the run's records through those models, so no write can start in less than they take:
on this bench's machines they stand at or above the 11x target, which is why the writes miss it.

Last, it times a poll of `ratchet watch RUN` on a run that has not moved (`WatchPoll.head`, in
one process: a watch is one long process), beside the head read each poll made before.

Compare the figures of one run of the bench, not across runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RATCHET = Path(sys.executable).with_name("ratchet")
READ_TARGET = 2.0
"""A read command within this many times `python -c pass`."""
HELP_TARGET = 4.0
"""`ratchet --help` within this many times `python -c pass`."""
WRITE_TARGET = 11.0
"""A command that writes within this many times `python -c pass` (issue 36: 150 ms beside a
13.7 ms `python -c pass`)."""
FIRST_STEP = "ratchet run, to its first step"
"""`ratchet run` timed until its worker claims the run, just before the first step."""
CLAIMED = '"message":"run claimed"'
"""The JSON log line `run` writes as its worker claims the run, before the step begins."""
WRITES = ("ratchet start", "ratchet run", "ratchet approve RUN", FIRST_STEP)
"""The commands that write, timed on runs of their own each round (see `_writes`)."""
BARE = "python -c pass"
PYDANTIC_FLOOR = "python: pydantic, one model"
"""A process that defines one pydantic model and validates with it: what any command that
validates its input with pydantic pays before its first line of its own."""
RUN_MODELS = "python: the run's models"
"""A process that loads `ratchet.state`, the models of a run's state and records: what a write
builds before it can write a checkpoint."""
FLOORS = {
    PYDANTIC_FLOOR: "from pydantic import BaseModel\nclass M(BaseModel):\n    x: int\nM(x=1)",
    RUN_MODELS: "import ratchet.state",
}
"""The floors a command that writes stands on, timed in the same rounds (`python -c CODE`)."""
FULL = "full: "
"""The key prefix of a case run through the full CLI (`python -m ratchet.cli`)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11, help="Rounds (median over them).")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="ratchet-cli-start-") as tmp:
        cwd = Path(tmp)
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("RATCHET_", "ANTHROPIC_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env["RATCHET_STORE"] = f"sqlite:///{cwd / 'ratchet.db'}"
        env["PYTHONPYCACHEPREFIX"] = str(cwd / "pycache")
        subprocess.run(
            [str(RATCHET), "run", "--scenario=migration", "--param=batches=2", "--run-id=bench"],
            cwd=cwd,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        commands = {
            "ratchet --help": ["--help"],
            "ratchet status RUN": ["status", "bench"],
            "ratchet status RUN --json": ["status", "bench", "--json"],
            "ratchet history RUN": ["history", "bench"],
            "ratchet list": ["list"],
        }
        full = [sys.executable, "-m", "ratchet.cli"]
        cases = {BARE: [sys.executable, "-c", "pass"]}
        cases |= {name: [sys.executable, "-c", code] for name, code in FLOORS.items()}
        cases |= {name: [str(RATCHET), *args] for name, args in commands.items()}
        cases |= {FULL + name: [*full, *args] for name, args in commands.items()}
        rounds = iter(range(runs + 1))

        def timed(command: list[str]) -> float:
            # No timeout: with one, `subprocess` waits by polling with sleeps that double from
            # 0.5 ms, and every figure would round up to 15.5 or 31.5 ms.
            started = time.perf_counter()
            subprocess.run(
                command,
                cwd=cwd,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # the writes' lines for a person, and their logs
            )
            return time.perf_counter() - started

        def to_first_step(command: list[str]) -> float:
            # Read to the end, past the line, so the child never waits on a full pipe.
            started = time.perf_counter()
            claimed = None
            with subprocess.Popen(
                command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            ) as child:
                assert child.stderr is not None
                for line in child.stderr:
                    if claimed is None and CLAIMED.encode() in line:
                        claimed = time.perf_counter() - started
            if child.returncode or claimed is None:
                raise SystemExit(f"{' '.join(command)}: exit {child.returncode}, no {CLAIMED}")
            return claimed

        def round_of(number: int) -> dict[str, list[str]]:
            # The cases in the order they run: a write's run is new each round, and `approve`
            # decides the run `run` just parked (on each path, a run of its own).
            quick = _writes(f"r{number}")
            slow = _writes(f"full-r{number}")
            return (
                cases
                | {name: [str(RATCHET), *args] for name, args in quick.items()}
                | {FULL + name: [*full, *args] for name, args in slow.items()}
            )

        def time_of(name: str, command: list[str]) -> float:
            return to_first_step(command) if name.endswith(FIRST_STEP) else timed(command)

        for name, command in round_of(next(rounds)).items():  # the warm-up round: the bytecode
            time_of(name, command)
        taken: dict[str, list[float]] = {name: [] for name in round_of(0)}
        for number in rounds:
            for name, command in round_of(number).items():
                taken[name].append(time_of(name, command))
        polls = _poll_seconds(cwd, env)
    figures = {name: statistics.median(seconds) for name, seconds in taken.items()}
    bare = figures[BARE]
    print(f"median over {runs} rounds, one process of each case a round (bytecode warm)")
    print(f"{'command':<32}{'ms':>8}{'x bare':>8}{'target':>8}{'full CLI ms':>14}{'x bare':>8}")
    for name, seconds in figures.items():
        if name.startswith(FULL):
            continue
        line = f"{name:<32}{seconds * 1000:>8.1f}{seconds / bare:>7.2f}x"
        if name != BARE and name not in FLOORS:
            target = (
                WRITE_TARGET if name in WRITES else HELP_TARGET if "help" in name else READ_TARGET
            )
            slow = figures[FULL + name]
            line += f"{target:>7.0f}x{slow * 1000:>14.1f}{slow / bare:>7.2f}x"
        print(line.rstrip())
    print(
        "full CLI: the same command through `python -m ratchet.cli` (typer and every command), "
        "what the quick path saves; the commands it does not answer (run, worker, ...) pay that"
    )
    print(
        "start, run, approve: each on a migration run (--param=batches=2) of its own; run works "
        "its 4 steps to the wait for a person (through the full CLI on both paths), approve "
        "decides it; run, to its first step: another run, until its worker claims it"
    )
    print(
        f"{PYDANTIC_FLOOR}: python -c defining one pydantic model and validating with it; "
        f"{RUN_MODELS}: python -c 'import ratchet.state'. A write validates with pydantic and "
        "builds the run's models, so it stands on both: a write target below them cannot be met "
        "by loading less"
    )
    print(
        f"ratchet watch RUN, a poll of a run that has not moved: {polls['poll'] * 1e6:.1f} µs "
        f"(a head read, what each poll read before: {polls['head'] * 1e6:.1f} µs)"
    )


def _writes(suffix: str) -> dict[str, list[str]]:
    """The arguments of the commands that write, on runs named with `suffix` (one per round)."""
    migration = ["--scenario=migration", "--param=batches=2"]
    return {
        "ratchet start": ["start", *migration, f"--run-id=start-{suffix}"],
        "ratchet run": ["run", *migration, f"--run-id=run-{suffix}"],
        "ratchet approve RUN": ["approve", f"run-{suffix}", "--comment", "ok", "--by", "bench"],
        FIRST_STEP: ["run", *migration, f"--run-id=first-{suffix}"],
    }


def _poll_seconds(cwd: Path, env: dict[str, str]) -> dict[str, float]:
    """The median time, in seconds, of one of `ratchet watch`'s polls of a run nobody writes
    to (`WatchPoll.head`), and of a read of its head (what every poll read before), each
    measured 200 times in a child process on the bench's store."""
    code = (
        "import os, statistics, sys, time\n"
        "import ratchet\n"
        "from ratchet.cli.inspection import WatchPoll\n"
        "store = os.environ['RATCHET_STORE']\n"
        "client = ratchet.connect(store)\n"
        "poll = WatchPoll(client, 'bench', store)\n"
        "for name, read in (('poll', poll.head), ('head', lambda: client.head('bench'))):\n"
        "    read()\n"
        "    taken = []\n"
        "    for _ in range(200):\n"
        "        started = time.perf_counter(); read()\n"
        "        taken.append(time.perf_counter() - started)\n"
        "    print(name, statistics.median(taken))\n"
        "poll.close(); client.close()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        env=env,
        check=True,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return {name: float(seconds) for name, seconds in map(str.split, done.stdout.splitlines())}


if __name__ == "__main__":
    main()
