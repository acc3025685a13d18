"""What following a run costs a poll: `ratchet watch`, the dashboard or a program reading what
was written since its last read (`Client.history(run_id, after=version)`, the runs API's
`GET /runs/{id}/history?after=N`), against reading the whole history each time.

    python -m bench.follow_cost [--steps 100,1000,10000] [--reads 9]

It runs the scripted agent of `bench.scripted_agent` to each length on a local store of its
own, then times, in this process, the read a follower makes when one more checkpoint has been
written: the whole history, and only the checkpoints after the last version it read. Medians
of `--reads` reads; compare the figures of one run of the bench (the machine is noisy).
"""

from __future__ import annotations

import argparse
import tempfile
from functools import partial

import ratchet
from bench.measure import median_seconds
from bench.scripted_agent import AGENT_REFERENCE, MAX_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", default="100,1000,10000", help="Run lengths, comma-separated.")
    parser.add_argument("--reads", type=int, default=9, help="Reads per figure (median).")
    options = parser.parse_args()
    lengths = [int(n) for n in options.steps.split(",")]
    print(f"median of {options.reads} reads each, after one more checkpoint was written")
    print(
        f"{'steps':>7}{'checkpoints':>13}{'whole history':>16}{'since last read':>17}{'ratio':>8}"
    )
    with tempfile.TemporaryDirectory(prefix="ratchet-follow-") as tmp:
        client = ratchet.connect(f"sqlite:///{tmp}/ratchet.db", environ={})
        try:
            for steps in lengths:
                run_id = f"follow-{steps}"
                client.run(
                    run_id=run_id,
                    agent=AGENT_REFERENCE,
                    input={"steps": steps},
                    max_steps=min(steps + 1, MAX_STEPS),
                )
                last = client.head(run_id).version
                whole = 1000 * median_seconds(partial(client.history, run_id), times=options.reads)
                since = 1000 * median_seconds(
                    partial(client.history, run_id, after=last - 1), times=options.reads
                )
                count = len(client.history(run_id))
                print(
                    f"{steps:>7,}{count:>13,}{whole:>13.1f} ms{since:>14.2f} ms"
                    f"{whole / since:>7.0f}x"
                )
        finally:
            client.close()


if __name__ == "__main__":
    main()
