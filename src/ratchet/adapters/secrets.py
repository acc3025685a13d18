"""The secrets a project's tools read (`RunContext.secrets[NAME]`): from the process's
environment locally, from Secrets Manager or SSM Parameter Store on AWS.

On AWS the stack grants the step function read access to each secret the project declares
(`[tool.ratchet] secrets`) and tells it where each is (`RATCHET_SECRETS`); a value is fetched
the first time a run asks for it and kept for the container's life (`ttl_seconds`, then fetched
again, so a rotated secret reaches warm containers). A value is never logged, never in a run's
state and never in a repr: the mapping shows its names only.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from ratchet.errors import RatchetError

DEFAULT_TTL_SECONDS = 300.0


class SecretUnavailable(RatchetError, KeyError):
    """A secret the agent asked for that this runtime does not have (not declared, not in the
    environment, or its store refused): the message names it, never a value."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "secret unavailable"


class EnvironmentSecrets(Mapping[str, str]):
    """Locally: each secret is the environment variable of its name (`PAYMENTS_API_KEY=...
    ratchet worker`), as a `.env` loader or a shell would set it."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self._environ = os.environ if environ is None else environ

    def __getitem__(self, name: str) -> str:
        value = self._environ.get(name)
        if value is None:
            raise SecretUnavailable(
                f"secret {name!r}: not in this process's environment (locally each secret is "
                "the environment variable of its name)"
            )
        return value

    def __iter__(self) -> Iterator[str]:
        return iter(())  # every variable could be one: none is listed

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return "EnvironmentSecrets()"


class AwsSecrets(Mapping[str, str]):
    """On AWS: `references` maps each declared name to `secretsmanager:<ARN>` or
    `ssm:<parameter ARN or name>`; the clients are made on first use."""

    def __init__(
        self,
        references: Mapping[str, str],
        *,
        secretsmanager: Callable[[], Any],
        ssm: Callable[[], Any],
        ttl_seconds: float = DEFAULT_TTL_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._references = dict(references)
        self._clients = {"secretsmanager": secretsmanager, "ssm": ssm}
        self._ttl = ttl_seconds
        self._clock = clock
        self._cache: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> str:
        reference = self._references.get(name)
        if reference is None:
            declared = ", ".join(sorted(self._references)) or "none"
            raise SecretUnavailable(
                f"secret {name!r}: the project declares no such secret ([tool.ratchet] "
                f"secrets; declared: {declared})"
            )
        now = self._clock()
        with self._lock:
            cached = self._cache.get(name)
            if cached is not None and now - cached[0] < self._ttl:
                return cached[1]
        value = self._fetch(name, reference)
        with self._lock:
            self._cache[name] = (now, value)
        return value

    def _fetch(self, name: str, reference: str) -> str:
        kind, where = reference.split(":", 1)
        client = self._clients[kind]()
        try:
            if kind == "secretsmanager":
                return str(client.get_secret_value(SecretId=where)["SecretString"])
            found = client.get_parameter(Name=where, WithDecryption=True)
            return str(found["Parameter"]["Value"])
        except Exception as error:
            # The store's own words name the secret and the reason, never a value.
            code = getattr(error, "response", {}).get("Error", {}).get("Code", type(error).__name__)
            raise SecretUnavailable(f"secret {name!r}: {kind} refused: {code}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._references))

    def __len__(self) -> int:
        return len(self._references)

    def __repr__(self) -> str:
        return f"AwsSecrets({sorted(self._references)})"
