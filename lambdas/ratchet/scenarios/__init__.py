"""Built-in agents, by scenario name, and the loader for `--agent module:attr`."""

from __future__ import annotations

import importlib

from ratchet.errors import AgentNotFound
from ratchet.tools import Agent

SCENARIOS = {
    "migration": "ratchet.scenarios.migration:agent",
    "notebook": "ratchet.scenarios.notebook:agent",
}


def load_agent(reference: str) -> Agent:
    """Resolve a scenario name (`migration`) or an import path (`my_pkg.agents:billing`)."""
    target = SCENARIOS.get(reference, reference)
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        known = ", ".join(sorted(SCENARIOS))
        raise AgentNotFound(
            f"unknown scenario or agent {reference!r}: use one of {known}, or module:attr"
        )
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise AgentNotFound(
            f"cannot import {module_name!r} for agent {reference!r}: {error}"
        ) from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Agent):
        raise AgentNotFound(f"{target!r} is not a ratchet.tools.Agent")
    return found
