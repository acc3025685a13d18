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
    except Exception as error:
        # Importing the user's module runs their code, which can fail in any way (ImportError,
        # SyntaxError, anything it raises): each is a bad agent reference, said in one line.
        raise AgentNotFound(
            f"cannot import {module_name!r} for agent {reference!r}: "
            f"{type(error).__name__}: {error}"
        ) from None
    found = getattr(module, attribute, None)
    if not isinstance(found, Agent):
        raise AgentNotFound(f"{target!r} is not a ratchet.tools.Agent")
    return found
