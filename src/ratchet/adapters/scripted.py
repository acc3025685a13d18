"""A deterministic model for offline runs and tests: an agent's scripted policy."""

from __future__ import annotations

from ratchet.ports import ModelRequest
from ratchet.state import Decision
from ratchet.tools import Policy


class ScriptedModel:
    """Decides from the same bounded view Claude gets, so it resumes exactly as Claude would
    have to: from the checkpoint, with no memory of its own."""

    def __init__(self, policy: Policy) -> None:
        self._policy = policy

    def decide(self, request: ModelRequest) -> Decision:
        return self._policy(request.view)
