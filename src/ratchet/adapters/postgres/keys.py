"""The keys every host of a Postgres store signs with, one row per key: the approval links'
key and the hooks' key. Kept in the database, not in a file on each host, so that a link a
worker on one host sends is verified by a `ratchet serve` on another, and a hook's URL made
on one host is taken on every other.

With a payload codec (`RATCHET_PAYLOAD_KEY`) a key is stored sealed, bound to its name: whoever
reads the database could otherwise sign an approval link, and approve a risky step, or make a
hook's URL. A key written in clear before the codec was turned on reads as it is (`ratchet
migrate --reencrypt` seals it). A sealed key this process cannot open (no payload key, not the
key it was sealed with, a damaged row) is refused in one line, and never taken for an absent
one: making a new key in its place would break every link and hook already given out."""

from __future__ import annotations

from collections.abc import Callable

from ratchet.adapters.postgres.database import PostgresDatabase
from ratchet.errors import PayloadKeyMissing, PayloadTampered
from ratchet.sealing import PayloadCodec, header_of, is_sealed

APPROVAL_LINKS = "approval-links"
HOOKS = "hooks"


def key_context(name: str) -> bytes:
    """What a sealed key is bound to: its name, so that the hooks' key put in the approval
    links' row fails its authentication instead of signing links."""
    return f"ratchet:signing-key:{name}".encode()


def sealed_key(secret: bytes, codec: PayloadCodec | None, *, name: str) -> bytes:
    """The key `name` as the store writes it: sealed if there is a codec, as it is if not."""
    return secret if codec is None else codec.seal(secret, context=key_context(name))


def opened_key(stored: bytes, codec: PayloadCodec | None, *, name: str) -> bytes:
    """The key `sealed_key` was given. `PayloadKeyMissing` or `PayloadTampered`, naming the key,
    for a sealed one this process cannot open."""
    # A key is random bytes: one written in clear begins as a sealed value does once in 2^32
    # stores, and is then refused as damaged, never misread.
    if not is_sealed(stored):
        return stored
    what = f"the store's {name!r} signing key"
    try:
        key_id = header_of(stored)[0]
    except PayloadTampered:
        raise PayloadTampered("?", what) from None
    if codec is None:
        raise PayloadKeyMissing(
            key_id,
            f"it seals {what}, and this process has no payload key (set RATCHET_PAYLOAD_KEY "
            "as the store's other processes have it)",
        )
    try:
        return codec.open(stored, context=key_context(name))
    except PayloadKeyMissing:
        raise PayloadKeyMissing(
            key_id, f"it seals {what}, and this process's RATCHET_PAYLOAD_KEY does not hold it"
        ) from None
    except PayloadTampered:
        raise PayloadTampered(key_id, what) from None


class PostgresKeys:
    def __init__(self, db: PostgresDatabase, codec: PayloadCodec | None = None) -> None:
        self._db = db
        # Seals each key made from now on, and opens each one read.
        self._codec = codec

    def key(self, name: str, *, make: Callable[[], bytes]) -> bytes:
        """The key `name`, made by `make` on first use: every process of the store gets the
        same one, whichever made it. A stored key this process cannot open is refused
        (`opened_key`), never replaced."""
        with self._db.read() as tx:
            row = tx.execute("SELECT secret FROM signing_keys WHERE name = %s", (name,)).fetchone()
        if row is not None:
            return opened_key(bytes(row[0]), self._codec, name=name)
        with self._db.write() as tx:
            # Insert-if-absent: of two processes making the key at once, the second's insert
            # waits for the first's transaction and does nothing, and it reads back the key
            # the first wrote (a new statement, which sees it committed), never its own. What
            # it reads back is opened as a key read first is: one it cannot open is refused.
            tx.execute(
                "INSERT INTO signing_keys (name, secret) VALUES (%s, %s) "
                "ON CONFLICT (name) DO NOTHING",
                (name, sealed_key(make(), self._codec, name=name)),
            )
            row = tx.execute("SELECT secret FROM signing_keys WHERE name = %s", (name,)).fetchone()
        assert row is not None, "inserted or found in this transaction"
        return opened_key(bytes(row[0]), self._codec, name=name)
