"""Large tool outputs on the local disk, by content hash (the S3 adapter's local twin)."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from ratchet.adapters.private import private_folder
from ratchet.errors import (
    BlobCorrupt,
    BlobMissing,
    BlobTampered,
    PayloadKeyMissing,
    PayloadTampered,
)
from ratchet.sealing import PayloadCodec, header_of, is_sealed
from ratchet.state import BlobRef


def blob_context(address: str) -> bytes:
    """What a sealed blob is bound to: its name. A sealed blob copied under another name fails
    its authentication, as a plain one fails its hash."""
    return f"ratchet:blob:{address}".encode()


def blob_address(data: bytes, codec: PayloadCodec | None) -> str:
    """A blob's name: its SHA-256, or with a codec a keyed hash (`PayloadCodec.address`), so
    that two runs storing the same output are not seen to, nor a guessed output confirmed."""
    return hashlib.sha256(data).hexdigest() if codec is None else codec.address(data)


def stored_blob(data: bytes, address: str, codec: PayloadCodec | None) -> bytes:
    """What is written for a blob: its bytes, or with a codec those bytes sealed."""
    return data if codec is None else codec.seal(data, context=blob_context(address))


def read_blob(stored: bytes, address: str, codec: PayloadCodec | None, where: str) -> bytes:
    """A blob's bytes from what was written for it: `BlobCorrupt` if they are not what was
    stored under `address` (a plain blob's SHA-256 differs, a sealed one fails its
    authentication), `PayloadKeyMissing` for a sealed one without its key."""
    if hashlib.sha256(stored).hexdigest() == address:
        return stored  # written without a codec (before it was turned on, or never)
    if not is_sealed(stored):
        raise BlobCorrupt(address, where)
    try:
        key_id = header_of(stored)[0]
    except PayloadTampered:
        raise BlobCorrupt(address, where) from None
    if codec is None:
        raise PayloadKeyMissing(
            key_id, "this process has no payload key (set RATCHET_PAYLOAD_KEY) to read a blob"
        )
    try:
        return codec.open(stored, context=blob_context(address))
    except PayloadTampered:
        raise BlobTampered(address, where, key_id) from None


class FileBlobStore:
    def __init__(self, root: Path, codec: PayloadCodec | None = None) -> None:
        self._root = root
        self._codec = codec

    def put(self, data: bytes) -> BlobRef:
        digest = blob_address(data, self._codec)
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
                handle.write(stored_blob(data, digest, self._codec))
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
        # The name is the content's hash (or keyed hash): bytes that no longer match it were
        # damaged or tampered with, and must not be handed to a tool as if they were what was
        # stored.
        return read_blob(data, ref.sha256, self._codec, str(path))

    def _path(self, digest: str) -> Path:
        return self._root / digest[:2] / digest
