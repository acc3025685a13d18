"""An input field the agent's input model does not have is refused, naming it (issue 36),
not dropped without a word; a model that says what to do with extras decides itself."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from ratchet.tools import Agent


class Refund(BaseModel):
    customer: str
    cents: int


class Lenient(Refund):
    model_config = ConfigDict(extra="ignore")


def _agent(model: type[BaseModel]) -> Agent:
    return Agent(name="refunds", goal="Refund {cents} cents", tools=[], input=model)


def test_a_field_the_input_model_lacks_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^agent 'refunds' takes no input 'cent' \(it takes: "):
        _agent(Refund).params_for({"customer": "acme", "cent": 5})


def test_a_model_that_ignores_extras_keeps_its_word():
    params = _agent(Lenient).params_for({"customer": "acme", "cents": 5, "note": "x"})

    assert params == {"customer": "acme", "cents": 5}
