"""Large tool outputs in S3, by content hash: the AWS twin of `adapters/file_blobs.py`."""

from __future__ import annotations

from typing import Any

from ratchet.adapters.file_blobs import blob_address, read_blob, stored_blob
from ratchet.errors import BlobMissing, StoreUnavailable, ToolFailed
from ratchet.sealing import PayloadCodec
from ratchet.state import BlobRef

PREFIX = "blobs/"


class S3BlobStore:
    """`BlobStore` on one bucket, at `blobs/<sha256>`.

    A key names its content, so a put is safe to repeat (a retried step stores the same bytes
    under the same key) and an object is never rewritten with anything else. With a codec the
    key is a keyed hash and the object sealed (`ratchet.adapters.file_blobs`, as on disk).
    """

    def __init__(self, client: Any, bucket: str, codec: PayloadCodec | None = None) -> None:
        # `client` is a boto3 S3 client; typed loosely because the S3 stubs are not a
        # dependency of this project.
        self._client = client
        self._bucket = bucket
        self._codec = codec

    def put(self, data: bytes) -> BlobRef:
        digest = blob_address(data, self._codec)
        self._client.put_object(
            Bucket=self._bucket,
            Key=f"{PREFIX}{digest}",
            Body=stored_blob(data, digest, self._codec),
            ContentType="application/octet-stream",
        )
        return BlobRef(sha256=digest, size=len(data))

    def get(self, ref: BlobRef) -> bytes:
        try:
            response = self._client.get_object(Bucket=self._bucket, Key=f"{PREFIX}{ref.sha256}")
        except self._client.exceptions.NoSuchKey:
            # Removed or lost: as damaged as bytes that no longer match (see `BlobMissing`).
            raise BlobMissing(ref.sha256, f"s3://{self._bucket}/{PREFIX}") from None
        data: bytes = response["Body"].read()
        return read_blob(data, ref.sha256, self._codec, f"s3://{self._bucket}/{PREFIX}{ref.sha256}")


class NoBlobStore:
    """Stands in where no bucket is configured: fine until an output is large enough to need
    one, and then a clear error instead of a silently truncated result."""

    def put(self, data: bytes) -> BlobRef:
        # A failed attempt, so the engine records why on the run (and fails it on the third).
        raise ToolFailed(
            f"{len(data):,} bytes of tool output or arguments need a blob store, and none is "
            "configured: set RATCHET_BLOB_BUCKET to an S3 bucket"
        )

    def get(self, ref: BlobRef) -> bytes:
        raise StoreUnavailable(
            f"blob {ref.sha256} cannot be read: no blob store is configured "
            "(set RATCHET_BLOB_BUCKET to an S3 bucket)"
        )
