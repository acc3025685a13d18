"""The local runtime's locks of at-most-once calls (`ratchet.adapters.call_locks`), held by real
processes: a holder frozen by SIGSTOP still holds, one killed by SIGKILL holds no more (its file
is cleared away by the next look), one that lets go leaves nothing behind."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ratchet.adapters.call_locks import FileCallLocks

KEY = "pay/step-1"
HOLDER = """
import sys
from pathlib import Path
from ratchet.adapters.call_locks import FileCallLocks

held = FileCallLocks(Path(sys.argv[1])).hold(sys.argv[2])
print("held" if held is not None else "refused", flush=True)
sys.stdin.readline()
if held is not None:
    held.release()
print("released", flush=True)
sys.stdin.readline()
"""


@contextmanager
def holder(folder: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that takes the key's lock, lets go at its first line of input, and ends at
    its second."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(folder), KEY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "held"
        yield process
    finally:
        process.kill()
        process.wait(timeout=60)


def test_a_frozen_holder_still_holds_and_a_killed_one_does_not(tmp_path):
    locks = FileCallLocks(tmp_path)
    with holder(tmp_path) as process:
        process.send_signal(signal.SIGSTOP)
        assert locks.held(KEY)
        assert locks.hold(KEY) is None

        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)

    assert not locks.held(KEY)
    assert list(tmp_path.iterdir()) == []  # the dead holder's file, cleared away
    held = locks.hold(KEY)
    assert held is not None
    held.release()


def test_a_holder_that_lets_go_leaves_nothing(tmp_path):
    locks = FileCallLocks(tmp_path)
    with holder(tmp_path) as process:
        assert locks.held(KEY)
        assert not locks.held("pay/step-2")

        assert process.stdin is not None
        assert process.stdout is not None
        process.stdin.write("\n")
        process.stdin.flush()
        assert process.stdout.readline().strip() == "released"

        assert not locks.held(KEY)
        assert list(tmp_path.iterdir()) == []


def test_a_call_of_this_process_holds_against_a_look_from_here(tmp_path):
    # A call given up at its deadline still runs on its thread here: the lock is the open
    # file's, so this process's own look finds it held too.
    locks = FileCallLocks(tmp_path)
    held = locks.hold(KEY)
    assert held is not None

    assert locks.held(KEY)
    assert locks.hold(KEY) is None
    held.release()
    held.release()  # a second release does nothing
    assert not locks.held(KEY)
