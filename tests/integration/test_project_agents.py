"""The agents `ratchet serve` starts by name: a project's `[tool.ratchet]` table, read as the
stack reads it (`ratchet/cdk/project.py`), and the names given with `--agent`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ratchet.agents import SCENARIOS, AgentRegistry, project_agents
from ratchet.cdk.project import Project
from ratchet.errors import AgentNotFound, InvalidInput
from ratchet.runtime.local import LocalSettings

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = [REPO / "examples" / name for name in ("billing_agent", "pr_agent", "support_agent")]


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "src").mkdir(exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("example", [e for e in EXAMPLES if (e / "pyproject.toml").exists()])
def test_the_examples_agents_are_those_the_stack_registers(example):
    read = project_agents(example)
    stack = Project.load(example)

    assert read.config_file == stack.config_file
    assert dict(read.agents) == dict(stack.agents)
    assert dict(read.models) == dict(stack.models)
    assert read.source == stack.source


def test_a_folder_with_no_project_registers_nothing(tmp_path):
    _write(tmp_path, "pyproject.toml", '[project]\nname = "x"\n')

    assert project_agents(tmp_path).agents == {}
    assert project_agents(tmp_path / "src").config_file is None


def test_a_ratchet_toml_comes_first_as_for_the_stack(tmp_path):
    _write(tmp_path, "pyproject.toml", '[tool.ratchet]\nagents = { a = "m:a" }\n')
    _write(tmp_path, "ratchet.toml", 'agents = { b = "m:b" }\n')

    assert dict(project_agents(tmp_path).agents) == {"b": "m:b"}


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('agents = { migration = "m:a" }', "agents.migration: 'migration' is a built-in"),
        ('agents = { "a b" = "m:a" }', "agents.a b: 'a b' is not a name"),
        ('agents = { a = "not a path" }', "agents.a: must map to 'module:attr'"),
        ('agents = "m:a"', "agents: must be a table"),
        ('source = "nowhere"', "source: 'nowhere' is not a folder"),
    ],
)
def test_a_mistake_names_the_file_and_the_key(tmp_path, table, message):
    config = _write(tmp_path, "pyproject.toml", f"[tool.ratchet]\n{table}\n")

    with pytest.raises(InvalidInput) as refused:
        project_agents(tmp_path)
    assert str(refused.value).startswith(f"{config}: [tool.ratchet] ")
    assert message in str(refused.value)


def test_registered_names_resolve_and_nothing_else_imports():
    registry = AgentRegistry().with_agents({"billing": "acme.billing:agent", "x.y:z": "x.y:z"})

    assert registry.resolve("billing") == "acme.billing:agent"
    assert registry.resolve("x.y:z") == "x.y:z"
    assert registry.names == sorted(["billing", "x.y:z", *SCENARIOS])
    with pytest.raises(AgentNotFound, match="unknown agent"):
        registry.resolve("acme.other:agent")


@pytest.mark.parametrize(
    ("agents", "message"),
    [
        ({"migration": "m:a"}, "built-in scenario's name"),
        ({"bad name": "m:a"}, "is not an agent name"),
        ({"a": "not a path"}, "must map to 'module:attr'"),
        ({"m:a": "m:b"}, "is not an agent name"),
    ],
)
def test_a_bad_name_is_refused(agents, message):
    with pytest.raises(ValueError, match=message):
        AgentRegistry().with_agents(agents)


def test_a_public_url_set_wins_over_where_serve_listens():
    unset = LocalSettings.from_env({})
    given = LocalSettings.from_env({"RATCHET_PUBLIC_URL": "https://tunnel.example.com"})

    assert unset.serving_at("http://127.0.0.1:8771").public_url == "http://127.0.0.1:8771"
    assert given.serving_at("http://127.0.0.1:8771").public_url == "https://tunnel.example.com"
