"""The payload codec's keys (`ratchet.sealing.PayloadCodec`): a keyring file, or KMS envelopes.

`RATCHET_PAYLOAD_KEY` picks one: `local` (the keyring `<store>.payload-keys` beside the store,
made owner-only on first use), `file:PATH` (a keyring of yours), `kms:<key ARN or alias>`.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import importlib.util
import os
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ratchet.errors import InvalidInput, PayloadKeyMissing, PayloadTampered, StoreUnavailable
from ratchet.sealing import KEY_BYTES, header_of, open_with, seal_with

ADDRESS_INFO = b"ratchet blob address"
"""What the blob-address key is derived for (HKDF's info): never the key that seals."""


def _address_key(key: bytes) -> bytes:
    # Loaded when first needed, as `ratchet.sealing` loads AES-GCM: not by the runtime's
    # import when no codec is set.
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=ADDRESS_INFO).derive(
        key
    )


def local_key_id(key: bytes) -> str:
    """A key file's key is named by a hash of it: a keyring's line cannot be given the
    wrong name, and the name says nothing of the key (a 256-bit key's SHA-256)."""
    return "local:" + hashlib.sha256(key).hexdigest()[:16]


class KeyringCodec:
    """AES-256-GCM under the keys of a keyring file: one key a line (64 hex), the newest
    first. New values are sealed with the first; a value sealed with another opens while its
    line is there. Rotating is putting a new line first (`new_keyring_line`)."""

    def __init__(self, path: Path, *, create: bool) -> None:
        self._path = path
        text = _secret_file(path) if create else _read(path)
        self._keys: dict[str, bytes] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            try:
                key = bytes.fromhex(line)
            except ValueError:
                key = b""
            if len(key) != KEY_BYTES:
                raise InvalidInput(f"{path}:{number} is not a payload key (64 hex characters)")
            self._keys.setdefault(local_key_id(key), key)
        if not self._keys:
            raise InvalidInput(f"{path} holds no payload key")
        if path.stat().st_mode & 0o077:
            raise InvalidInput(f"{path} may be read by others: chmod 600 it")
        self._newest = next(iter(self._keys))
        self._address = _address_key(self._keys[self._newest])

    @property
    def key_id(self) -> str:
        return self._newest

    def seal(self, plaintext: bytes, *, context: bytes) -> bytes:
        return seal_with(self._keys[self._newest], self._newest, plaintext, context=context)

    def open(self, sealed: bytes, *, context: bytes) -> bytes:
        key_id, _, _ = header_of(sealed)
        key = self._keys.get(key_id)
        if key is None:
            raise PayloadKeyMissing(key_id, f"the keyring {self._path} does not hold it")
        return open_with(key, sealed, context=context)

    def address(self, data: bytes) -> str:
        return hmac.new(self._address, data, hashlib.sha256).hexdigest()


def new_keyring_line() -> str:
    return os.urandom(KEY_BYTES).hex()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii")
    except FileNotFoundError:
        raise InvalidInput(f"there is no payload keyring at {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise StoreUnavailable(f"the payload keyring {path} cannot be read: {error}") from None


def _secret_file(path: Path) -> str:
    """The keyring at `path`, made with one new key on first use (as the signing key is,
    `ratchet.approvals.links.key_file`): written owner-only aside, then linked in place, so it
    is never on disk readable by others and two creators end up with the one key."""
    try:
        return _read(path)
    except InvalidInput:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    draft = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="ascii") as out:
            out.write(new_keyring_line() + "\n")
        with contextlib.suppress(FileExistsError):
            os.link(draft, path)
    finally:
        draft.unlink()
    return _read(path)


DATA_KEY_SECONDS = 300.0
"""How long a KMS data key seals new values in one process: a worker asks KMS for one
(GenerateDataKey) at most every five minutes, not once a step."""
DATA_KEY_USES = 10_000
"""And for at most this many values, so one data key never seals more than a bounded share."""
OPENED_KEYS = 256
"""Data keys KMS decrypted for this process, kept (newest used last out) so reading a run's
records calls Decrypt once per data key, not once per record."""


class KmsCodec:
    """Envelope encryption: each value sealed with a data key from KMS (GenerateDataKey),
    the data key as KMS encrypted it stored in the value's header. A data key is reused for
    `DATA_KEY_SECONDS` or `DATA_KEY_USES` values, whichever comes first; the data keys KMS
    decrypts for reads are kept (up to `OPENED_KEYS`). `client` is a boto3 KMS client."""

    ENCRYPTION_CONTEXT = {"ratchet": "payload"}
    """Bound to every data key: KMS decrypts one only with it, and CloudTrail shows it."""

    def __init__(
        self, client: Any, key: str, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._client = client
        self._key = key
        self._clock = clock
        self._lock = threading.Lock()
        self._current: tuple[str, bytes, bytes, float] | None = None  # id, key, wrapped, since
        self._uses = 0
        self._opened: OrderedDict[bytes, bytes] = OrderedDict()

    @property
    def key_id(self) -> str:
        return self._data_key()[0]

    def seal(self, plaintext: bytes, *, context: bytes) -> bytes:
        key_id, key, wrapped = self._data_key(use=True)
        return seal_with(key, key_id, plaintext, context=context, wrapped=wrapped)

    def open(self, sealed: bytes, *, context: bytes) -> bytes:
        key_id, wrapped, _ = header_of(sealed)
        return open_with(self._opened_key(key_id, wrapped), sealed, context=context)

    def address(self, data: bytes) -> str:
        # Under the current data key: equal outputs share an address while it seals (five
        # minutes in one process), and no longer, which reveals no more than one run could.
        _, key, _ = self._data_key()
        return hmac.new(_address_key(key), data, hashlib.sha256).hexdigest()

    def _data_key(self, *, use: bool = False) -> tuple[str, bytes, bytes]:
        with self._lock:
            now = self._clock()
            current = self._current
            if (
                current is None
                or now - current[3] >= DATA_KEY_SECONDS
                or self._uses >= DATA_KEY_USES
            ):
                made = self._kms("GenerateDataKey", self._key, self._generate)
                current = (str(made["KeyId"]), made["Plaintext"], made["CiphertextBlob"], now)
                self._current, self._uses = current, 0
                self._opened[current[2]] = current[1]
            if use:
                self._uses += 1
            return current[0], current[1], current[2]

    def _generate(self) -> Any:
        return self._client.generate_data_key(
            KeyId=self._key, KeySpec="AES_256", EncryptionContext=self.ENCRYPTION_CONTEXT
        )

    def _opened_key(self, key_id: str, wrapped: bytes) -> bytes:
        with self._lock:
            kept = self._opened.get(wrapped)
            if kept is not None:
                self._opened.move_to_end(wrapped)
                return kept

        def decrypt() -> Any:
            return self._client.decrypt(
                CiphertextBlob=wrapped, KeyId=key_id, EncryptionContext=self.ENCRYPTION_CONTEXT
            )

        key: bytes = self._kms("Decrypt", key_id, decrypt)["Plaintext"]
        with self._lock:
            self._opened[wrapped] = key
            while len(self._opened) > OPENED_KEYS:
                self._opened.popitem(last=False)
        return key

    def _kms(self, action: str, key_id: str, call: Callable[[], Any]) -> Any:
        """KMS's refusals, in Ratchet's words: a key this process may not use (or that is
        gone, disabled, pending deletion) is a missing key; a wrapped key KMS does not take
        is a tampered value."""
        errors = self._client.exceptions
        try:
            return call()
        except errors.InvalidCiphertextException:
            raise PayloadTampered(key_id, "a stored payload's data key") from None
        except (
            errors.NotFoundException,
            errors.DisabledException,
            errors.KMSInvalidStateException,
            errors.IncorrectKeyException,
        ) as error:
            raise PayloadKeyMissing(key_id, f"KMS refuses {action}: {error}") from None
        except errors.ClientError as error:
            code = error.response.get("Error", {}).get("Code", "")
            if code in {"AccessDeniedException", "AccessDenied"}:
                raise PayloadKeyMissing(key_id, f"KMS refuses {action}: {error}") from None
            raise StoreUnavailable(f"KMS {action} failed: {error}") from None


def payload_codec(
    setting: str | None, *, beside: Path | None, kms: Callable[[], Any] | None = None
) -> KeyringCodec | KmsCodec | None:
    """The codec `RATCHET_PAYLOAD_KEY` names (`ratchet.sealing.check_setting` checked it), or
    None when it is unset: `local` keeps its keyring at `<beside>.payload-keys`, made on first
    use; `kms` builds its client with `kms` when it is first needed."""
    if setting is None:
        return None
    if importlib.util.find_spec("cryptography") is None:
        raise InvalidInput(
            "RATCHET_PAYLOAD_KEY needs the encryption extra: "
            "pip install 'ratchet-agents[encryption]'"
        )
    kind, _, rest = setting.partition(":")
    if setting == "local":
        if beside is None:
            raise InvalidInput(
                "RATCHET_PAYLOAD_KEY=local keeps its keys beside a store on one host: name a "
                "keyring every host reads (file:PATH) or a KMS key (kms:...) instead"
            )
        return KeyringCodec(Path(f"{beside}.payload-keys"), create=True)
    if kind == "file":
        return KeyringCodec(Path(rest).expanduser(), create=False)
    if kms is None:
        raise InvalidInput(
            "RATCHET_PAYLOAD_KEY=kms:... needs boto3 (pip install 'ratchet-agents[aws]')"
        )
    return KmsCodec(kms(), rest)
