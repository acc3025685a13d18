"""Signed approval links: safe to put in an email, useless once changed.

A link names the approval, its run, the one recipient it was sent to, and when it expires,
and carries an HMAC-SHA256 over exactly those. Nothing else in it is trusted: the person who
decides is the recipient the link was signed for, never a form field. A link never carries
the execution's task token; the token stays server-side under the approval id.

    <public url>/approvals/<approval id>?run=<run id>&to=<recipient>&exp=<epoch s>
        &kid=<8 hex>&sig=<hex>

`kid` names the key that signed the link (`key_id`: 8 hex digits of a hash of the key, which
says nothing about the key itself), so a link opened on another store's server is told apart
from a forged one. It is a hint, not a claim: the signature does not cover it (links made
before it, which have none, verify as they did), and a changed `kid` can only turn a
refusal into the other refusal.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import quote, urlencode

from ratchet.errors import ApprovalExpired, InvalidInput, LinkInvalid, LinkOfAnotherStore

KEY_BYTES = 32
_VERSION = b"ratchet-approval-v1"
_KEY_ID_DOMAIN = b"ratchet-approval-key-id-v1\x00"
_FIELDS = ("run", "to", "exp", "sig")
_FIELDS_WITH_KEY_ID = (*_FIELDS, "kid")
_KEY_ID = re.compile(r"[0-9a-f]{8}")
_MAX_FIELD_CHARS = 320
_EXP = re.compile(r"[1-9][0-9]{0,11}")


@dataclass(frozen=True)
class LinkClaims:
    """What a verified link says."""

    approval_id: str
    run_id: str
    recipient: str
    expires_at: datetime


MIN_KEY_BYTES = 16
"""The shortest signing key Ratchet takes (approval links, webhook secrets)."""


class LazyKey:
    """A signing key, or a function that gets it, read on first use and checked then: so that
    what never signs (a decision without a link, a store nobody makes a hook for) never
    needs, or makes, a key file. `what` names the key in the refusal of a short one."""

    def __init__(self, key: bytes | Callable[[], bytes], *, what: str) -> None:
        self._source = key
        self._what = what
        self._loaded: bytes | None = None

    def __call__(self) -> bytes:
        if self._loaded is None:
            key = self._source() if callable(self._source) else self._source
            if len(key) < MIN_KEY_BYTES:
                raise ValueError(f"{self._what} needs at least {MIN_KEY_BYTES} bytes")
            self._loaded = key
        return self._loaded


class LinkSigner:
    def __init__(self, key: bytes | Callable[[], bytes]) -> None:
        """`key` is the secret, or a function that gets it when a link is first signed or
        checked (so that deciding without a link never needs, or makes, a key)."""
        self._lazy_key = LazyKey(key, what="an approval link key")

    @property
    def _key(self) -> bytes:
        return self._lazy_key()

    @property
    def key_id(self) -> str:
        """A short name of the signing key, safe to show: 8 hex digits of SHA-256 over the
        key under a domain of its own (no HMAC of Ratchet's is ever computed over it)."""
        return hashlib.sha256(_KEY_ID_DOMAIN + self._key).hexdigest()[:8]

    def url(self, public_url: str, claims: LinkClaims) -> str:
        query = urlencode(
            {
                "run": claims.run_id,
                "to": claims.recipient,
                "exp": str(_epoch(claims.expires_at)),
                "kid": self.key_id,
                "sig": self._signature(claims),
            },
            quote_via=quote,
        )
        return f"{public_url.rstrip('/')}/approvals/{quote(claims.approval_id)}?{query}"

    def verify(self, approval_id: str, query: Mapping[str, str], *, now: datetime) -> LinkClaims:
        """The link's claims, or `LinkInvalid` (forged, tampered, malformed; `LinkOfAnotherStore`
        if its key id names another key) or `ApprovalExpired`. The signature is checked before
        the expiry, so an expired link is known to be real."""
        if (
            set(query) not in (set(_FIELDS), set(_FIELDS_WITH_KEY_ID))
            or any(len(v) > _MAX_FIELD_CHARS for v in query.values())
            or not _EXP.fullmatch(query["exp"])
            or ("kid" in query and not _KEY_ID.fullmatch(query["kid"]))
        ):
            raise LinkInvalid("the link is incomplete or has been changed")
        if "kid" in query and query["kid"] != self.key_id:
            raise LinkOfAnotherStore(
                "this link belongs to another Ratchet store: it was signed with key "
                f"{query['kid']}, and this server's is {self.key_id}. Open it on the server "
                "of the store whose run asked"
            )
        try:
            expires = datetime.fromtimestamp(int(query["exp"]), UTC)
        except (ValueError, OverflowError, OSError):
            raise LinkInvalid("the link is incomplete or has been changed") from None
        claims = LinkClaims(approval_id, query["run"], query["to"], expires)
        # Bytes, not str: compare_digest raises TypeError on non-ASCII text.
        given = query["sig"].encode("utf-8", "surrogatepass")
        if not hmac.compare_digest(self._signature(claims).encode(), given):
            raise LinkInvalid("the link's signature does not match: it was forged or changed")
        if now >= expires:
            raise ApprovalExpired(f"this link expired at {expires.isoformat(timespec='minutes')}")
        return claims

    def _signature(self, claims: LinkClaims) -> str:
        # Length-prefixed fields: no two different claims can serialize to the same bytes.
        message = _VERSION
        for part in (
            claims.approval_id,
            claims.run_id,
            claims.recipient,
            str(_epoch(claims.expires_at)),
        ):
            data = part.encode("utf-8", "surrogatepass")
            message += len(data).to_bytes(4, "big") + data
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def _epoch(moment: datetime) -> int:
    return int(moment.timestamp())


def new_key() -> bytes:
    return secrets.token_bytes(KEY_BYTES)


def key_file(path: Path) -> bytes:
    """The local signing key, made on first use and readable by its owner only."""
    return bytes.fromhex(_secret_file(path, lambda: new_key().hex()))


def token_file(path: Path) -> str:
    """A bearer token (`secrets.token_urlsafe`), made on first use and readable by its owner
    only, and refused (`InvalidInput`) if others may read it now."""
    token = _secret_file(path, lambda: secrets.token_urlsafe(KEY_BYTES))
    if path.stat().st_mode & 0o077:
        raise InvalidInput(f"{path} may be read by others: chmod 600 it (or delete it)")
    return token


def _secret_file(path: Path, make: Callable[[], str]) -> str:
    """The secret in `path`, written there first by `make` if there is none."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = make()
    # A draft of this call's own (unique per process and thread), created owner-only: the
    # secret is never on disk readable by others, not even for a moment.
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    draft = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(secret)
        # link() publishes the whole file at once and refuses to replace one: two creators
        # making the secret together both end up with the one that was published first.
        try:
            os.link(draft, path)
        except FileExistsError:
            secret = path.read_text().strip()
    finally:
        draft.unlink()
    return secret
