"""What a local store writes beside it is its owner's only: the store file (SQLite gives its WAL
and SHM the file's mode), its folder when Ratchet makes it, the blobs and each run's data
folder. What runs' tools saw and did (customer records, amounts, answers) is in them."""

from __future__ import annotations

from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def private_folder(folder: Path) -> Path:
    """`folder`, made owner-only if missing, as is each missing folder above it: a Postgres
    store's host folder (`.ratchet/postgres/<host>_<database>/`) is made with `.ratchet/` and
    `.ratchet/postgres/`, and one at the umask's 0755 would let anyone list it and read what
    Ratchet writes there with the umask's mode (serve's address). A folder that exists is
    left as it is: it is its owner's."""
    if not folder.is_dir():
        private_folder(folder.parent)
        folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
    return folder
