"""A user's project (`ratchet/cdk/project.py`): `[tool.ratchet]` or `ratchet.toml`, checked with
the file and key named in every refusal; what of it ships; how it reaches the stack."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from aws_cdk import App

from ratchet.cdk.bundling import asset_hash
from ratchet.cdk.config import DeployConfig
from ratchet.cdk.project import Project, ProjectError
from ratchet.cdk.sources import RatchetCode
from tests.infra.synth import REPO_ROOT, Synthesized

EXAMPLE = REPO_ROOT / "examples" / "billing_agent"


def _project(tmp_path: Path, table: str, *, name: str = "pyproject.toml") -> Path:
    """A project folder with a package `acme` (an agent module and a test) under src/."""
    package = tmp_path / "src" / "acme"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "agents.py").write_text("agent = None\n")
    header = "[tool.ratchet]\n" if name == "pyproject.toml" else ""
    (tmp_path / name).write_text('[project]\nname = "acme"\n' * (name == "pyproject.toml"))
    with (tmp_path / name).open("a") as file:
        file.write(header + table)
    return tmp_path


def test_the_example_project_registers_its_agent_and_ships_its_package() -> None:
    project = Project.load(EXAMPLE)

    assert project.config_file == EXAMPLE / "pyproject.toml"
    assert project.agents == {"billing": "billing_agent.agent:agent"}
    assert project.source == (EXAMPLE / "src",)
    assert project.requirements == ()
    shipped = {f.path for f in project.shipped_files()}
    assert {"billing_agent/__init__.py", "billing_agent/agent.py"} <= shipped


def test_a_ratchet_toml_takes_the_same_keys_at_its_top_level(tmp_path: Path) -> None:
    folder = _project(
        tmp_path,
        'agents = { acme = "acme.agents:agent" }\nsource = ["src"]\n'
        'requirements = ["httpx==0.28.1"]\n',
        name="ratchet.toml",
    )

    project = Project.load(folder)

    assert (project.config_file.name, project.agents) == (
        "ratchet.toml",
        {"acme": "acme.agents:agent"},
    )
    assert project.requirements == ("httpx==0.28.1",)


def test_tests_caches_venvs_and_dotfiles_never_ship(tmp_path: Path) -> None:
    folder = _project(tmp_path, 'agents = { acme = "acme.agents:agent" }\nsource = "src"\n')
    src = folder / "src"
    for junk in ("acme/tests/test_agents.py", "acme/test_more.py", "acme/__pycache__/x.pyc",
                 "acme/.secret", "tests/__init__.py", "conftest.py", ".venv/pyvenv.cfg",
                 "venv/lib/site.py"):  # fmt: skip
        (src / junk).parent.mkdir(parents=True, exist_ok=True)
        (src / junk).write_text("")
    (src / "venv" / "pyvenv.cfg").write_text("")
    (src / "venv" / "__init__.py").write_text("")
    (src / "helpers.py").write_text("")
    (src / "acme" / "prices.json").write_text("{}")

    shipped = sorted(f.path for f in Project.load(folder).shipped_files())

    assert shipped == ["acme/__init__.py", "acme/agents.py", "acme/prices.json", "helpers.py"]


BAD_TABLES = [
    ('agents = { "bad name" = "acme.agents:agent" }\nsource = "src"\n', "agents", "bad name"),
    ('agents = { migration = "acme.agents:agent" }\nsource = "src"\n', "agents", "built-in"),
    ('agents = { acme = "acme/agents.py" }\nsource = "src"\n', "agents", "module:attr"),
    ('agents = { acme = "acme.agents:agent" }\nsource = "lib"\n', "source", "'lib' is not a"),
    ('agents = { acme = "acme.agents:agent" }\nsource = "/abs"\n', "source", "relative"),
    ('agents = { acme = "acme.agents:agent" }\nsources = "src"\n', "sources", "unknown key"),
    ('agents = { acme = "other.agents:agent" }\nsource = "src"\n', "agents.acme", "'other'"),
    ('source = "src"\nrequirements = ["httpx >>= 1"]\n', "requirements", "PEP 508"),
    ('source = "src"\nrequirements = ["x @ https://e.com/x.whl"]\n', "requirements", "direct"),
    ('source = "src"\nrequirements = ["ratchet==0.1"]\n', "requirements", "always in the bundle"),
    ('source = "src"\nrequirements = ["Ratchet_Agents>=0.1"]\n', "requirements", "always in the"),
    ('source = "src"\nrequirements = "httpx"\n', "requirements", "valid list"),
]


@pytest.mark.parametrize(("table", "key", "says"), BAD_TABLES)
def test_a_bad_project_names_the_file_and_the_key(
    tmp_path: Path, table: str, key: str, says: str
) -> None:
    folder = _project(tmp_path, table)

    with pytest.raises(ProjectError) as refused:
        Project.load(folder)

    message = str(refused.value)
    assert message.startswith(f"{folder / 'pyproject.toml'}: [tool.ratchet] {key}"), message
    assert says in message


def test_a_pyproject_without_the_table_or_a_folder_without_either_file_is_refused(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "acme"\n')
    with pytest.raises(ProjectError, match=r"pyproject.toml: has no \[tool.ratchet\] table"):
        Project.load(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProjectError, match=r"holds neither ratchet\.toml nor pyproject\.toml"):
        Project.load(tmp_path / "empty")
    with pytest.raises(ProjectError, match="no such file or folder"):
        Project.load(tmp_path / "nowhere")


def test_a_package_named_ratchet_would_replace_ratchet_and_is_refused(tmp_path: Path) -> None:
    folder = _project(tmp_path, 'agents = { acme = "acme.agents:agent" }\nsource = "src"\n')
    (folder / "src" / "ratchet").mkdir()
    (folder / "src" / "ratchet" / "__init__.py").write_text("")

    with pytest.raises(ProjectError, match=r"\[tool.ratchet\] source: .* Ratchet's own package"):
        Project.load(folder)


# --- reaching the stack ----------------------------------------------------------------------


def _config(**context: Any) -> DeployConfig:
    return DeployConfig.from_context(App(context=context))


def test_the_project_agents_join_the_context_agents(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # a relative path is relative to where cdk runs
    config = _config(
        **{
            "ratchet:project": "examples/billing_agent",
            "ratchet:agents": '{"other": "acme.agents:other"}',
        }
    )

    assert config.project is not None
    assert config.agents_json == (
        '{"billing":"billing_agent.agent:agent","other":"acme.agents:other"}'
    )


def test_an_agent_named_in_the_context_and_in_the_project_is_refused() -> None:
    with pytest.raises(ValueError, match="'billing' is named both in context ratchet:agents"):
        _config(
            **{
                "ratchet:project": str(EXAMPLE),
                "ratchet:agents": '{"billing": "acme.agents:billing"}',
            }
        )


def test_a_bad_project_path_fails_the_synth_with_the_context_key(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"context ratchet:project=.*no such file or folder"):
        _config(**{"ratchet:project": str(tmp_path / "nowhere")})


def test_the_functions_register_the_project_agents(with_project: Synthesized) -> None:
    # Bundling is skipped here: the template, not the asset (tests/infra/test_user_agent*).
    functions = with_project.of_type("AWS::Lambda::Function")
    registered = {
        name: json.loads(f["Properties"]["Environment"]["Variables"]["RATCHET_AGENTS"])
        for name, f in functions.items()
        if "RATCHET_AGENTS" in f["Properties"]["Environment"]["Variables"]
    }
    assert len(registered) == 2, sorted(registered)  # the api and the step functions
    assert all(r == {"billing": "billing_agent.agent:agent"} for r in registered.values())


def test_the_asset_hash_follows_the_project_files_and_requirements(tmp_path: Path) -> None:
    folder = _project(tmp_path, 'agents = { acme = "acme.agents:agent" }\nsource = "src"\n')
    bare = asset_hash(RatchetCode.checkout(REPO_ROOT))
    before = asset_hash(RatchetCode.checkout(REPO_ROOT), Project.load(folder))
    assert before != bare

    (folder / "src" / "acme" / "agents.py").write_text("agent = 1\n")
    edited = asset_hash(RatchetCode.checkout(REPO_ROOT), Project.load(folder))
    with (folder / "pyproject.toml").open("a") as file:
        file.write('requirements = ["httpx==0.28.1"]\n')
    required = asset_hash(RatchetCode.checkout(REPO_ROOT), Project.load(folder))
    (folder / "src" / "acme" / "__pycache__").mkdir()
    (folder / "src" / "acme" / "__pycache__" / "agents.cpython-311.pyc").write_bytes(b"\0")

    assert len({before, edited, required}) == 3
    assert asset_hash(RatchetCode.checkout(REPO_ROOT), Project.load(folder)) == required


def test_ratchets_own_distribution_is_the_one_this_repository_builds() -> None:
    import tomllib

    from ratchet.cdk.project import RATCHET_DISTRIBUTIONS

    built = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    assert built["project"]["name"] in RATCHET_DISTRIBUTIONS
