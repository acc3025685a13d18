"""A deployment's own models, named like agents (`RATCHET_MODELS`): a run that names one records
its `module:attr`; a `module:attr` the deployment does not register is refused, naming what it
does register; a malformed registry is the deployer's error."""

from __future__ import annotations

import pytest

from ratchet.agents import AgentRegistry
from ratchet.runs import RunRequest, RunRequestInvalid, new_run

REGISTRY = AgentRegistry.deployment(None, '{"house": "tests.fixtures.house_model:model"}')


def test_a_registered_model_is_started_by_name_and_recorded_by_target():
    state = new_run(
        RunRequest(scenario="notebook", goal="g", model="house"),
        has_anthropic_key=False,
        agents=REGISTRY,
    )
    assert state.options.model == "tests.fixtures.house_model:model"


def test_an_unregistered_import_path_is_refused_naming_the_registered_ones():
    with pytest.raises(RunRequestInvalid, match=r"or a model it registers \(house\)"):
        new_run(
            RunRequest(scenario="notebook", goal="g", model="evil.module:model"),
            has_anthropic_key=False,
            agents=REGISTRY,
        )


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("not json", "RATCHET_MODELS is not JSON"),
        ('{"scripted": "a:b"}', "'scripted' is a built-in model's name"),
        ('{"house": "no-colon"}', "'house' must map to 'module:attr'"),
    ],
)
def test_a_malformed_model_registry_says_so(text, said):
    with pytest.raises(ValueError, match=said):
        AgentRegistry.deployment(None, text)
