"""`ratchet serve` under load, with silent connections held open: the figures of issue 22, item 5.

    python -m bench.serve_load [--threads 200] [--seconds 15] [--long]

It makes a store of its own in a temporary directory (three runs), starts `ratchet serve` on
a free loopback port, and opens one connection that sends nothing and one that sends half a
request, both held open to the end. With them open it times one `/dashboard` request (the
idle-connection figure), then `--threads` threads ask for the dashboard and the runs API, one
connection per request, until `--seconds` have passed (`--long`: 64 s, the issue's figure).
A request unanswered after `--read-timeout` seconds counts as unanswered. It then stops the
server with SIGTERM and prints the figures. Loopback only; it stops by itself within
`--seconds` plus the read timeout plus a few seconds. The machine is shared and noisy: compare
figures of one run, not across runs.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
LONG_SECONDS = 64.0
PATHS = ("/dashboard", "/runs/r1", "/runs/r2/history", "/dashboard?status=running")


@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    unanswered: int = 0
    reset: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def requests(self) -> int:
        return sum(self.statuses.values()) + self.unanswered + self.reset

    def count(self, status: int, seconds: float) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.latencies.append(seconds)


def get(port: int, path: str, read_timeout: float) -> tuple[int, float]:
    started = time.monotonic()
    connection = http.client.HTTPConnection(HOST, port, timeout=read_timeout)
    try:
        connection.request("GET", path, headers={"Connection": "close"})
        response = connection.getresponse()
        response.read()
        return response.status, time.monotonic() - started
    finally:
        connection.close()


def hammer(port: int, until: float, read_timeout: float, tally: Tally, start: int) -> None:
    for path in itertools.islice(itertools.cycle(PATHS), start, None):
        if time.monotonic() >= until:
            return
        try:
            status, seconds = get(port, path, read_timeout)
        except TimeoutError:
            with tally.lock:
                tally.unanswered += 1
        except (ConnectionError, http.client.HTTPException, OSError):
            with tally.lock:
                tally.reset += 1
        else:
            tally.count(status, seconds)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else 0.0


def start_server(cwd: Path, env: dict[str, str]) -> tuple[subprocess.Popen[str], int, Path]:
    log = cwd / "serve.log"
    with log.open("w") as output:
        server = subprocess.Popen(
            # No worker: the figures are the server's own (the three runs wait for none).
            [
                sys.executable,
                "-m",
                "ratchet.cli",
                "serve",
                "--host",
                HOST,
                "--port",
                "0",
                "--no-worker",
            ],
            cwd=cwd,
            env=env | {"PYTHONUNBUFFERED": "1", "RATCHET_LOG_LEVEL": "WARNING"},
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
        )
    deadline = time.monotonic() + 60
    while not (found := re.search(r"Serving approvals on http://[^:]+:(\d+)", log.read_text())):
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise SystemExit(f"ratchet serve did not start:\n{log.read_text()}")
        time.sleep(0.05)
    return server, int(found.group(1)), log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=200, help="Client threads (1-500).")
    parser.add_argument("--seconds", type=float, default=15.0, help="Load time (1-120 s).")
    parser.add_argument("--long", action="store_true", help=f"Load for {LONG_SECONDS:g} s.")
    parser.add_argument("--read-timeout", type=float, default=30.0, help="Per request (s).")
    args = parser.parse_args()
    seconds = LONG_SECONDS if args.long else args.seconds
    if not (1 <= args.threads <= 500 and 1 <= seconds <= 120 and 0 < args.read_timeout <= 60):
        parser.error("--threads from 1 to 500, --seconds from 1 to 120, --read-timeout to 60")

    with tempfile.TemporaryDirectory(prefix="ratchet-serve-load-") as tmp:
        cwd = Path(tmp)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("RATCHET_", "ANTHROPIC_"))}
        env["RATCHET_STORE"] = f"sqlite:///{cwd / 'ratchet.db'}"
        for run_id in ("r1", "r2", "r3"):
            start = ["start", "--goal", "file a note", "--run-id", run_id]
            subprocess.run(
                [sys.executable, "-m", "ratchet.cli", *start],
                cwd=cwd,
                env=env,
                check=True,
                capture_output=True,
                timeout=120,
            )
        server, port, log = start_server(cwd, env)
        try:
            get(port, "/dashboard", args.read_timeout)  # warm up
            idle = socket.create_connection((HOST, port), timeout=5)
            half = socket.create_connection((HOST, port), timeout=5)
            half.sendall(b"GET /dashboard HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            try:
                status, idle_seconds = get(port, "/dashboard", args.read_timeout)
                idle_figure = f"{idle_seconds * 1000:.1f} ms (HTTP {status})"
            except TimeoutError:
                idle_figure = f"no answer in {args.read_timeout:g} s"
            tally = Tally()
            until = time.monotonic() + seconds
            threads = [
                threading.Thread(
                    target=hammer, args=(port, until, args.read_timeout, tally, n), daemon=True
                )
                for n in range(args.threads)
            ]
            began = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=seconds + args.read_timeout + 30)
            elapsed = time.monotonic() - began
            idle.close()
            half.close()
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                code: int | str = server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                code = "did not stop in 30 s (killed)"
        errors = sum(n for status, n in tally.statuses.items() if status >= 500)
        lines = [
            f"ratchet serve, {args.threads} threads for {seconds:g} s on loopback, one idle and "
            "one half-request connection held open throughout",
            f"{'requests':>22}  {tally.requests:,} ({tally.requests / elapsed:,.0f}/s)",
            f"{'answered':>22}  {sum(tally.statuses.values()):,} "
            + " ".join(f"{s}:{n:,}" for s, n in sorted(tally.statuses.items())),
            f"{'5xx':>22}  {errors:,}",
            f"{'unanswered':>22}  {tally.unanswered:,} (after {args.read_timeout:g} s)",
            f"{'reset or refused':>22}  {tally.reset:,}",
            f"{'p50 / p99 / max':>22}  {percentile(tally.latencies, 0.5) * 1000:,.1f} / "
            f"{percentile(tally.latencies, 0.99) * 1000:,.1f} / "
            f"{max(tally.latencies, default=0) * 1000:,.1f} ms",
            f"{'idle-connection figure':>22}  /dashboard in {idle_figure}",
            f"{'SIGTERM':>22}  exit {code}",
        ]
        print("\n".join(lines))
        if errors or tally.unanswered:
            print(f"(server log: {log.read_text()[-2000:]})")


if __name__ == "__main__":
    main()
