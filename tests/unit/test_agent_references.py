"""An agent reference that names no attribute of its module says so (issue 36), rather than
calling what is not there something other than an Agent."""

from __future__ import annotations

import pytest

from ratchet.agents import load_agent
from ratchet.errors import AgentNotFound


def test_a_misspelt_attribute_is_named_as_missing():
    with pytest.raises(AgentNotFound) as missing:
        load_agent("ratchet.scenarios.notebook:agnet")

    assert "'ratchet.scenarios.notebook' has no 'agnet'" in str(missing.value)
    assert "is not a ratchet.tools.Agent" not in str(missing.value)


def test_an_attribute_that_is_no_agent_is_named_so():
    with pytest.raises(AgentNotFound, match=r"is not a ratchet\.tools\.Agent"):
        load_agent("ratchet.scenarios.notebook:notebook_policy")
