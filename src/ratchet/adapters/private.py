"""What a local store writes beside it is its owner's only: the store file (SQLite gives its WAL
and SHM the file's mode), its folder when Ratchet makes it, the blobs and each run's data
folder. What runs' tools saw and did (customer records, amounts, answers) is in them."""

from __future__ import annotations

from pathlib import Path

PRIVATE_FILE = 0o600
PRIVATE_FOLDER = 0o700


def private_folder(folder: Path) -> Path:
    """`folder`, made owner-only if missing (its parents as the umask has them)."""
    if not folder.is_dir():
        folder.parent.mkdir(parents=True, exist_ok=True)
        folder.mkdir(mode=PRIVATE_FOLDER, exist_ok=True)
    return folder
