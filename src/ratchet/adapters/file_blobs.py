"""Large tool outputs on the local disk, by content hash (the S3 adapter's local twin)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ratchet.adapters.private import private_folder
from ratchet.errors import BlobCorrupt, BlobMissing
from ratchet.state import BlobRef


class FileBlobStore:
    def __init__(self, root: Path) -> None:
        self._root = root

    def put(self, data: bytes) -> BlobRef:
        digest = hashlib.sha256(data).hexdigest()
        path = self._path(digest)
        try:
            # The same content again: it is in use anew, so `ratchet gc`'s grace period for
            # unreferenced blobs starts over.
            os.utime(path)
        except FileNotFoundError:
            private_folder(self._root)
            private_folder(path.parent)
            # Write aside, fsync, then rename: a crash leaves either no blob or a whole one.
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        return BlobRef(sha256=digest, size=len(data))

    def get(self, ref: BlobRef) -> bytes:
        path = self._path(ref.sha256)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            # Removed or lost: as damaged as bytes that no longer match (one rule, see
            # `BlobMissing`).
            raise BlobMissing(ref.sha256, str(self._root)) from None
        # The name is the content's hash: bytes that no longer match it were damaged or
        # tampered with, and must not be handed to a tool as if they were what was stored.
        if hashlib.sha256(data).hexdigest() != ref.sha256:
            raise BlobCorrupt(ref.sha256, str(path))
        return data

    def _path(self, digest: str) -> Path:
        return self._root / digest[:2] / digest
