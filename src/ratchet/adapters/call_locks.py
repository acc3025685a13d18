"""The local runtime's `CallLocks`: a lock file per at-most-once call under way, in a folder
beside the store (`<store>.calls/`), held with `flock` by the process that makes the call.

The kernel keeps an flock for as long as the open file it was taken on lives: through a SIGSTOP,
a paused VM or a long GC, and no longer than its process (a SIGKILL lets it go). The lock
belongs to the open file, not to the process, so a call of this very process (an abandoned one
still running on its thread) holds against a check from here as from anywhere else on the host.

The holder removes its file when the call ends, before letting it go, and only a holder
removes one: whoever takes a lock on a file that is no longer at its path (opened before the
removal) knows the call it stood for is over, and a new holder takes the file at the path.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from contextlib import suppress
from pathlib import Path

from ratchet.adapters.private import private_folder
from ratchet.errors import StoreUnavailable


class FileCallLocks:
    """`CallLocks` in `folder`, made on first use (owner-only)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def hold(self, key: str) -> HeldFile | None:
        path = self._path(key)
        try:
            private_folder(self._folder)  # and the store's folders above it, if missing
            while True:
                fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
                if not _locked(fd, fcntl.LOCK_EX):
                    os.close(fd)
                    return None
                if _still_at(fd, path):
                    return HeldFile(fd, path)
                # Its holder removed it between our open and our lock: its call is over, and
                # the path is free for a file of ours.
                os.close(fd)
        except OSError as error:
            raise StoreUnavailable(
                f"cannot lock the call {key!r} in {self._folder}: {error}"
            ) from None

    def held(self, key: str) -> bool:
        path = self._path(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return False
        except OSError as error:
            raise StoreUnavailable(
                f"cannot read the lock of {key!r} in {self._folder}: {error}"
            ) from None
        try:
            if not _locked(fd, fcntl.LOCK_EX):
                return True
            if _still_at(fd, path):
                # Left by a process that died in its call (SIGKILL): free, so clear it away as
                # its holder would have (we hold it while it goes).
                os.unlink(path)
            return False
        except OSError as error:
            raise StoreUnavailable(
                f"cannot read the lock of {key!r} in {self._folder}: {error}"
            ) from None
        finally:
            os.close(fd)

    def _path(self, key: str) -> Path:
        return self._folder / f"{hashlib.sha256(key.encode('utf-8')).hexdigest()[:32]}.lock"


class HeldFile:
    """A call's lock, let go by `release` (from any thread; once)."""

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self._path = path
        self._guard = threading.Lock()

    def release(self) -> None:
        with self._guard:
            fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            # The lock goes with the file whatever happens here: one left behind is cleared
            # by the next `held`.
            with suppress(OSError):
                os.unlink(self._path)
        finally:
            os.close(fd)


def _locked(fd: int, how: int) -> bool:
    """Take the lock without waiting; False if another open file holds it."""
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _still_at(fd: int, path: Path) -> bool:
    """Whether the open file `fd` is still the one at `path`."""
    try:
        at_path = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (opened.st_dev, opened.st_ino) == (at_path.st_dev, at_path.st_ino)
