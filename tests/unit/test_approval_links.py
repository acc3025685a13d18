"""Signed approval links: what a link proves, and every way a changed link is refused."""

from __future__ import annotations

import multiprocessing
import os
import stat
import threading
from datetime import UTC, datetime, timedelta
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

import pytest

from ratchet.approvals import links
from ratchet.approvals.links import LinkClaims, LinkSigner, key_file
from ratchet.errors import ApprovalExpired, LinkInvalid, LinkOfAnotherStore

KEY = bytes(range(32))
PUBLIC_URL = "https://approvals.example.com/prod"
EXPIRES = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
BEFORE = EXPIRES - timedelta(hours=1)
CLAIMS = LinkClaims(
    approval_id="A1b2C3d4E5f6G7h8I9j0Kq",
    run_id="run-7f3a",
    recipient="dana@example.com",
    expires_at=EXPIRES,
)


def split(url: str) -> tuple[str, dict[str, str]]:
    """The approval id and query of a link, as the page handler receives them."""
    parts = urlsplit(url)
    query = {k: v[0] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    return unquote(parts.path.rsplit("/", 1)[-1]), query


def signed(claims: LinkClaims = CLAIMS, key: bytes = KEY) -> tuple[str, dict[str, str]]:
    return split(LinkSigner(key).url(PUBLIC_URL, claims))


def verify(approval_id: str, query: dict[str, str], now: datetime = BEFORE) -> LinkClaims:
    return LinkSigner(KEY).verify(approval_id, query, now=now)


# --- what a good link says ---------------------------------------------------------------------


def test_a_link_verifies_to_exactly_the_claims_it_was_signed_with():
    url = LinkSigner(KEY).url(PUBLIC_URL + "/", CLAIMS)

    assert url.startswith(f"{PUBLIC_URL}/approvals/{CLAIMS.approval_id}?")
    assert verify(*split(url)) == CLAIMS


def test_a_link_carries_only_the_run_the_recipient_the_expiry_the_key_id_and_the_signature():
    _, query = signed()

    assert set(query) == {"run", "to", "exp", "kid", "sig"}
    assert query["exp"] == str(int(EXPIRES.timestamp()))
    assert query["kid"] == LinkSigner(KEY).key_id
    assert len(query["sig"]) == 64


def test_a_non_ascii_recipient_survives_the_url():
    claims = LinkClaims(CLAIMS.approval_id, CLAIMS.run_id, "zoë.ñúñez@exämple.com", EXPIRES)

    url = LinkSigner(KEY).url(PUBLIC_URL, claims)

    assert url.isascii()
    assert verify(*split(url)).recipient == "zoë.ñúñez@exämple.com"


def test_a_recipient_with_url_syntax_in_it_is_one_field():
    claims = LinkClaims(CLAIMS.approval_id, CLAIMS.run_id, "a&sig=0#x?y=z@example.com", EXPIRES)

    approval_id, query = split(LinkSigner(KEY).url(PUBLIC_URL, claims))

    assert set(query) == {"run", "to", "exp", "kid", "sig"}
    assert verify(approval_id, query).recipient == "a&sig=0#x?y=z@example.com"


def test_the_expiry_is_kept_to_the_second_it_was_signed_for():
    claims = LinkClaims(CLAIMS.approval_id, CLAIMS.run_id, CLAIMS.recipient, EXPIRES)
    with_micros = LinkClaims(
        CLAIMS.approval_id,
        CLAIMS.run_id,
        CLAIMS.recipient,
        EXPIRES + timedelta(microseconds=999_999),
    )

    assert verify(*signed(with_micros)) == claims


# --- expiry ------------------------------------------------------------------------------------


def test_a_link_is_good_until_the_second_before_it_expires():
    assert verify(*signed(), now=EXPIRES - timedelta(microseconds=1)) == CLAIMS


@pytest.mark.parametrize("late", [timedelta(0), timedelta(seconds=1), timedelta(days=400)])
def test_a_link_is_expired_from_its_expiry_on(late):
    with pytest.raises(ApprovalExpired, match="expired at 2026-03-01T12:00"):
        verify(*signed(), now=EXPIRES + late)


def test_an_expired_link_that_was_changed_is_refused_as_changed_not_as_expired():
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "to": "mallory@example.com"}, now=EXPIRES + timedelta(1))


# --- forged and changed links ------------------------------------------------------------------


@pytest.mark.parametrize(
    "forged",
    [
        "0" * 64,
        "",
        "not-hex",
        "A" * 64,
        "v0=" + "0" * 61,
    ],
)
def test_a_forged_signature_is_refused(forged):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "sig": forged})


def test_the_right_signature_in_capitals_is_not_the_signature():
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "sig": query["sig"].upper()})


def _last_digit_changed(sig: str) -> str:
    return sig[:-1] + ("0" if sig[-1] != "0" else "1")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda sig: sig[:8],
        lambda sig: sig[:32],
        lambda sig: sig[:-1],
        _last_digit_changed,
        lambda sig: sig + "0",
    ],
    ids=["first-8", "first-half", "last-digit-dropped", "last-digit-changed", "digit-added"],
)
def test_the_real_signature_cut_short_changed_or_extended_is_refused(tamper):
    # Each shares a prefix with the real one: only a comparison of every digit tells them apart.
    approval_id, query = signed()

    with pytest.raises(LinkInvalid, match="signature does not match"):
        verify(approval_id, {**query, "sig": tamper(query["sig"])})


def test_a_signature_with_non_ascii_characters_is_refused_as_forged():
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "sig": "é" * 64})


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run", "run-other"),
        ("run", "run-7f3a "),
        ("to", "mallory@example.com"),
        ("to", "Dana@example.com"),
        ("exp", str(int(EXPIRES.timestamp()) + 1)),
        ("exp", str(int((EXPIRES + timedelta(days=365)).timestamp()))),
    ],
)
def test_a_changed_field_breaks_the_signature(field, value):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid, match="signature does not match"):
        verify(approval_id, {**query, field: value})


@pytest.mark.parametrize(
    "approval_id", ["A1b2C3d4E5f6G7h8I9j0Kr", "A1b2C3d4E5f6G7h8I9j0K", "x" * 10_000]
)
def test_the_link_of_one_approval_does_not_open_another(approval_id):
    _, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, query)


def test_a_link_signed_with_another_key_is_refused():
    with pytest.raises(LinkInvalid):
        verify(*signed(key=b"another key, 32 bytes long......"))


# --- key ids -----------------------------------------------------------------------------------


def test_the_key_id_is_short_stable_and_differs_between_keys():
    other = b"another key, 32 bytes long......"

    assert LinkSigner(KEY).key_id == LinkSigner(bytes(KEY)).key_id
    assert len(LinkSigner(KEY).key_id) == 8
    assert int(LinkSigner(KEY).key_id, 16) >= 0
    assert LinkSigner(KEY).key_id != LinkSigner(other).key_id
    # A hash of its own: not the start of any HMAC a link or hook carries, nor of the key.
    assert LinkSigner(KEY).key_id not in KEY.hex()
    assert not signed()[1]["sig"].startswith(LinkSigner(KEY).key_id)


def test_a_link_of_another_store_says_so_rather_than_forged():
    other = b"another key, 32 bytes long......"

    with pytest.raises(LinkOfAnotherStore, match="belongs to another Ratchet store") as refused:
        verify(*signed(key=other))

    assert LinkSigner(other).key_id in str(refused.value)
    assert "forged" not in str(refused.value)


def test_a_link_made_before_key_ids_verifies_as_before():
    approval_id, query = signed()
    del query["kid"]

    assert verify(approval_id, query) == CLAIMS


def test_an_old_link_of_another_store_is_still_refused_as_not_matching():
    approval_id, query = signed(key=b"another key, 32 bytes long......")
    del query["kid"]

    with pytest.raises(LinkInvalid, match="signature does not match") as refused:
        verify(approval_id, query)
    assert not isinstance(refused.value, LinkOfAnotherStore)


def test_a_link_whose_key_id_was_set_to_ours_is_still_checked_by_its_signature():
    approval_id, query = signed(key=b"another key, 32 bytes long......")

    with pytest.raises(LinkInvalid, match="signature does not match"):
        verify(approval_id, {**query, "kid": LinkSigner(KEY).key_id})


@pytest.mark.parametrize("kid", ["", "ABCDEF01", "1234567", "123456789", "zzzzzzzz", "٣" * 8])
def test_a_key_id_that_is_not_one_is_refused_as_changed(kid):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid, match="incomplete or has been changed"):
        verify(approval_id, {**query, "kid": kid})


@pytest.mark.parametrize("missing", ["run", "to", "exp", "sig"])
def test_a_link_missing_a_field_is_refused(missing):
    approval_id, query = signed()
    del query[missing]

    with pytest.raises(LinkInvalid, match="incomplete or has been changed"):
        verify(approval_id, query)


@pytest.mark.parametrize("extra", ["by", "token", "utm_source", "SIG", ""])
def test_a_link_with_an_extra_field_is_refused(extra):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid, match="incomplete or has been changed"):
        verify(approval_id, {**query, extra: "x"})


@pytest.mark.parametrize("field", ["run", "to", "sig"])
def test_a_huge_field_is_refused_before_any_work(field):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid, match="incomplete or has been changed"):
        verify(approval_id, {**query, field: "x" * 1_000_000})


@pytest.mark.parametrize(
    "exp",
    ["", "soon", "1e9", "nan", "9" * 300, "99999999999999999", "-99999999999999999", "٣"],
)
def test_an_expiry_that_is_not_a_time_is_refused(exp):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "exp": exp})


def test_a_link_for_a_recipient_too_long_for_a_link_never_verifies():
    claims = LinkClaims(CLAIMS.approval_id, CLAIMS.run_id, "d" * 400 + "@example.com", EXPIRES)

    with pytest.raises(LinkInvalid):
        verify(*signed(claims))


@pytest.mark.parametrize("spelling", ["+{}", "0{}", " {}", "{} "])
def test_the_expiry_has_one_spelling(spelling):
    approval_id, query = signed()

    with pytest.raises(LinkInvalid):
        verify(approval_id, {**query, "exp": spelling.format(query["exp"])})


@pytest.mark.parametrize("key", [b"short", lambda: b"short"])
def test_a_key_shorter_than_16_bytes_signs_nothing(key):
    with pytest.raises(ValueError, match="at least 16 bytes"):
        LinkSigner(key).url(PUBLIC_URL, CLAIMS)


def test_a_key_from_a_function_is_fetched_once_and_only_when_first_needed():
    fetched: list[int] = []

    def fetch() -> bytes:
        fetched.append(1)
        return KEY

    signer = LinkSigner(fetch)
    assert fetched == []

    approval_id, query = split(signer.url(PUBLIC_URL, CLAIMS))
    assert signer.verify(approval_id, query, now=BEFORE) == CLAIMS
    assert fetched == [1]


# --- the local key file ------------------------------------------------------------------------


def test_the_key_file_is_made_once_owner_only_and_reused(tmp_path):
    path = tmp_path / "store" / "ratchet.approval-key"

    first = key_file(path)
    again = key_file(path)

    assert first == again
    assert len(first) == links.KEY_BYTES
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == [path.name], "no draft is left behind"


def test_two_stores_get_different_keys(tmp_path):
    assert key_file(tmp_path / "a.key") != key_file(tmp_path / "b.key")


def _key_in_child(path: str, start: Barrier, out: Queue[str]) -> None:
    start.wait()
    out.put(key_file(Path(path)).hex())


def test_processes_making_the_key_together_all_get_the_one_on_disk(tmp_path):
    path = tmp_path / "ratchet.approval-key"
    context = multiprocessing.get_context("fork")
    start, out = context.Barrier(4), context.Queue()
    children = [
        context.Process(target=_key_in_child, args=(str(path), start, out)) for _ in range(4)
    ]
    for child in children:
        child.start()
    keys = {out.get(timeout=10) for _ in children}
    for child in children:
        child.join(timeout=10)

    assert keys == {path.read_text().strip()}
    assert all(child.exitcode == 0 for child in children)


def test_threads_making_the_key_together_all_get_the_one_on_disk(tmp_path, monkeypatch):
    path = tmp_path / "ratchet.approval-key"
    # Both threads have written their draft before either publishes it: the interleaving
    # that a real race produces now and then, made certain.
    both_drafted = threading.Barrier(2, timeout=10)
    real_link = os.link

    def link_after_both_drafted(src: Path, dst: Path) -> None:
        both_drafted.wait()
        real_link(src, dst)

    monkeypatch.setattr(os, "link", link_after_both_drafted)
    keys: list[bytes] = []
    errors: list[BaseException] = []

    def make() -> None:
        try:
            keys.append(key_file(path))
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=make) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)

    assert errors == []
    assert keys == [bytes.fromhex(path.read_text())] * 2


def test_the_key_is_never_on_disk_readable_by_others(tmp_path, monkeypatch):
    # The file's mode is seen wherever it may change or be published: before any chmod, and
    # when the draft is linked into place.
    modes: list[int] = []
    real_chmod, real_link = Path.chmod, os.link

    def chmod_seeing_mode(self: Path, mode: int, **kwargs: bool) -> None:
        modes.append(stat.S_IMODE(self.stat().st_mode))
        real_chmod(self, mode, **kwargs)

    def link_seeing_mode(src: Path, dst: Path) -> None:
        modes.append(stat.S_IMODE(os.stat(src).st_mode))
        real_link(src, dst)

    monkeypatch.setattr(Path, "chmod", chmod_seeing_mode)
    monkeypatch.setattr(os, "link", link_seeing_mode)
    old = os.umask(0o022)
    try:
        key_file(tmp_path / "ratchet.approval-key")
    finally:
        os.umask(old)

    assert modes
    assert [oct(m) for m in modes if m & 0o077] == []
