"""How fast the `ratchet` command answers: `--help` and the read commands (`status`, `history`,
`list`) beside a bare `python -c pass`, each the median of several runs in fresh processes.

    python -m bench.cli_start [--runs 9]

It makes a store of its own in a temporary directory, with one migration run waiting for a
person, and times the installed console script (the one beside this Python). The read
commands answer through `ratchet.cli.quick` (sqlite3 and json, no pydantic, typer or rich); `--help`
loads the full CLI. The target (issue 10): a read command in a quarter of the time `--help`
takes. The machine is shared and noisy: compare the figures of one run of the bench, not
across runs.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from functools import partial
from pathlib import Path

from bench.measure import median_seconds

RATCHET = Path(sys.executable).with_name("ratchet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=9, help="Processes per figure (median).")
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory(prefix="ratchet-cli-start-") as tmp:
        cwd = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "ANTHROPIC_"))}
        env["RATCHET_STORE"] = f"sqlite:///{cwd / 'ratchet.db'}"
        subprocess.run(
            [str(RATCHET), "run", "--scenario=migration", "--param=batches=2", "--run-id=bench"],
            cwd=cwd,
            env=env,
            check=True,
            capture_output=True,
            timeout=120,
        )
        cases = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "ratchet --help": [str(RATCHET), "--help"],
            "ratchet status RUN": [str(RATCHET), "status", "bench"],
            "ratchet status RUN --json": [str(RATCHET), "status", "bench", "--json"],
            "ratchet history RUN": [str(RATCHET), "history", "bench"],
            "ratchet list": [str(RATCHET), "list"],
        }
        figures = {
            name: median_seconds(
                partial(
                    subprocess.run,
                    command,
                    cwd=cwd,
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                    timeout=60,
                ),
                times=runs,
            )
            for name, command in cases.items()
        }
    bare, help_ = figures["python -c pass"], figures["ratchet --help"]
    print(f"median of {runs} processes each; a quarter of --help is {help_ / 4 * 1000:.0f} ms")
    print(f"{'command':<28}{'ms':>8}{'over bare python':>18}{'of --help':>11}")
    for name, seconds in figures.items():
        print(
            f"{name:<28}{seconds * 1000:>8.0f}{(seconds - bare) * 1000:>15.0f} ms"
            f"{seconds / help_:>10.0%}"
        )


if __name__ == "__main__":
    main()
