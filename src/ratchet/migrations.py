"""Code drift: states written by an older Ratchet are upgraded on load, one version at a time.

Each entry of `UPGRADES` turns a state dict of version N into version N + 1. A state newer than
this code is refused, never guessed at: a worker on old code must not advance a run that a
newer deploy has already touched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from ratchet.errors import UnsupportedSchema
from ratchet.state import SCHEMA_VERSION, RunState

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


def _v1_to_v2(state: dict[str, Any]) -> dict[str, Any]:
    # Version 2 only adds optional `blob` references (arguments kept by reference); a version 1
    # state has none, so it reads as it is. The bump makes an older Ratchet refuse a version 2
    # state with a clear error instead of failing on a field it does not know.
    return state


def _v2_to_v3(state: dict[str, Any]) -> dict[str, Any]:
    # Version 3 stores the head without its window and its static part, and adds pinned facts
    # and a running summary (both empty by default). A version 2 head was stored whole, so it
    # reads as it is; its digest's `last_arguments` stay, and are no longer written.
    return state


def _v3_to_v4(state: dict[str, Any]) -> dict[str, Any]:
    # Version 4 adds the statuses `stopped` and `cancelled` and the `retried` record; a
    # version 3 head has none of them, so it reads as it is. The bump makes an older Ratchet
    # refuse a run it could not read instead of failing on a status it does not know.
    return state


UPGRADES: Mapping[int, Upgrade] = {1: _v1_to_v2, 2: _v2_to_v3, 3: _v3_to_v4}
"""`UPGRADES[n]` upgrades a version-n state to n + 1."""


def upgrade_state(
    raw: Mapping[str, Any],
    *,
    current: int = SCHEMA_VERSION,
    upgrades: Mapping[int, Upgrade] = UPGRADES,
) -> dict[str, Any]:
    """Return `raw` upgraded to schema version `current`, or raise `UnsupportedSchema`."""
    state = dict(raw)
    version = state.get("schema_version", 1)
    if not isinstance(version, int) or version < 1:
        raise UnsupportedSchema(f"state has an invalid schema_version: {version!r}")
    if version > current:
        raise UnsupportedSchema(
            f"run {state.get('run_id', '?')!r} was written with state schema {version}, but this "
            f"Ratchet reads schema {current} at most; upgrade Ratchet before resuming it"
        )
    while version < current:
        step = upgrades.get(version)
        if step is None:
            raise UnsupportedSchema(f"no upgrade from state schema {version} to {version + 1}")
        state = step(state)
        version += 1
        state["schema_version"] = version
    return state


def load_state(text: str, *, version: int, attempts: int) -> RunState:
    """Parse a stored head, upgrading it first if an older Ratchet wrote it.

    `version` and `attempts` come from the store's own columns, which `begin_attempt` bumps
    without rewriting the JSON, so they win over what the JSON says. A state of the current
    schema is parsed in one pass (this runs on every step); anything else goes through
    `upgrade_state`, which refuses a newer schema.
    """
    columns = {"version": version, "attempts": attempts}
    try:
        state = RunState.model_validate_json(text)
    except ValidationError:
        state = None
    if state is not None and state.schema_version == SCHEMA_VERSION:
        return state.model_copy(update=columns)
    return load_state_raw(json.loads(text), version=version, attempts=attempts)


def load_state_raw(raw: Mapping[str, Any], *, version: int, attempts: int) -> RunState:
    """`load_state` for a head already parsed into a dict (one merged from stored parts)."""
    upgraded = upgrade_state(raw)  # a copy of `raw` when it is current
    upgraded.update({"version": version, "attempts": attempts})
    return RunState.model_validate(upgraded)
