"""Which agents may be loaded, and by what name: the built-in scenarios' names and the registries.

Loading an agent imports its module, which runs that module's code. So a reference that comes
from someone else (an API caller) is only ever a name, looked up in an `AgentRegistry` before
anything is imported; import paths (`my_pkg.agents:billing`) are accepted only where the person
typing them runs the code anyway (the CLI, locally).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from ratchet.errors import AgentNotFound, InvalidInput, RatchetError
from ratchet.imports import IMPORT_PATH, ImportFailed, import_object
from ratchet.model_names import CLAUDE_PREFIX, SCRIPTED
from ratchet.tools import Agent

SCENARIOS: Mapping[str, str] = MappingProxyType(
    {
        "migration": "ratchet.scenarios.migration:agent",
        "notebook": "ratchet.scenarios.notebook:agent",
    }
)
"""The built-in agents (the demos in `ratchet.scenarios`): every runtime resolves these names,
so a run stores them as they are, and a deployment may not take them over."""

AGENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
"""A registered agent's name (the same rule as the stack's `ratchet:agents` context)."""


@dataclass(frozen=True)
class AgentRegistry:
    """Which agent references resolve, and to which `module:attr`.

    `resolve` decides without importing anything; `load` imports only what `resolve` allowed.
    The built-in scenarios are always registered. A deployment adds its own names
    (`deployment`); the CLI also takes import paths as they are (`local`).
    """

    registered: Mapping[str, str] = field(default_factory=lambda: SCENARIOS)
    import_paths: bool = False
    """Whether a `module:attr` reference that no name maps to may be imported as it is."""
    models: Mapping[str, str] = field(default_factory=dict)
    """Models of the deployment's own (`RATCHET_MODELS`: name -> `module:attr`), which a run
    names as it names an agent; a run records the target."""

    @classmethod
    def local(cls) -> AgentRegistry:
        """The CLI's: built-in names, and any import path the user types."""
        return cls(import_paths=True)

    @classmethod
    def deployment(cls, agents_json: str | None, models_json: str | None = None) -> AgentRegistry:
        """The built-in names plus the deployment's (`RATCHET_AGENTS`: a JSON object of
        `{"name": "module:attr"}`), and its own models (`RATCHET_MODELS`, the same form), and
        nothing else. A malformed registry is the deployer's error and says so; it never falls
        back to importing what a caller names."""
        agents = _registered("RATCHET_AGENTS", agents_json, "an agent name")
        if taken := _builtin_agent(agents):
            raise ValueError(f"RATCHET_AGENTS: {taken!r} is a built-in scenario's name")
        models = _registered("RATCHET_MODELS", models_json, "a model name")
        if taken := _builtin_model(models):
            raise ValueError(f"RATCHET_MODELS: {taken!r} is a built-in model's name")
        return cls(MappingProxyType({**SCENARIOS, **agents}), models=MappingProxyType(models))

    def with_agents(
        self, agents: Mapping[str, str], models: Mapping[str, str] | None = None
    ) -> AgentRegistry:
        """These agents (and models) too, by name, checked by the rules of a deployment's
        (`RATCHET_AGENTS`); `ValueError` says what is wrong. An agent registered under its
        own `module:attr` is named by that target, as it is, in a request."""
        if taken := _builtin_agent(agents):
            raise ValueError(f"{taken!r} is a built-in scenario's name")
        for name, target in agents.items():
            if name != target and not AGENT_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not an agent name (letters, digits, '.', '_', '-')")
            if not IMPORT_PATH.fullmatch(target):
                raise ValueError(f"{name!r} must map to 'module:attr', not {target!r}")
        if taken := _builtin_model(models or {}):
            raise ValueError(f"{taken!r} is a built-in model's name")
        for name, target in (models or {}).items():
            if not AGENT_NAME.fullmatch(name) or not IMPORT_PATH.fullmatch(target):
                raise ValueError(f"model {name!r} must be a name mapped to 'module:attr'")
        return AgentRegistry(
            MappingProxyType({**self.registered, **agents}),
            import_paths=self.import_paths,
            models=MappingProxyType({**self.models, **(models or {})}),
        )

    @property
    def names(self) -> list[str]:
        return sorted(self.registered)

    def resolve(self, reference: str) -> str:
        """The `module:attr` that `reference` stands for, or `AgentNotFound`. Imports nothing.

        A registered name resolves to its target, and so does the target itself: a run stores
        the target of a deployment's name (see `stored_reference`), which must load again in
        every later step."""
        target = self.registered.get(reference)
        if target is not None:
            return target
        if reference in self.registered.values():
            return reference
        if self.import_paths and IMPORT_PATH.fullmatch(reference):
            return reference
        known = ", ".join(self.names)
        if self.import_paths:
            raise AgentNotFound(
                f"unknown scenario or agent {reference!r}: use one of {known}, or module:attr"
            )
        raise AgentNotFound(f"unknown agent: use one of {known}")

    def stored_reference(self, reference: str) -> str:
        """What a run records as its agent: a built-in name as it is (it resolves anywhere),
        otherwise the `module:attr` it resolved to, which the step function, a worker and the
        CLI can all load without knowing this deployment's names."""
        return reference if reference in SCENARIOS else self.resolve(reference)

    def load(self, reference: str) -> Agent:
        return _import(self.resolve(reference), reference)


LOCAL = AgentRegistry.local()


def _builtin_agent(names: Iterable[str]) -> str | None:
    """The first of `names` that would take over a built-in scenario's name, if one does."""
    return next((name for name in names if name in SCENARIOS), None)


def _builtin_model(names: Iterable[str]) -> str | None:
    """The first of `names` that would take over a built-in model's name (the scripted
    policy's, or any `claude-...`), if one does."""
    return next((n for n in names if n == SCRIPTED or n.startswith(CLAUDE_PREFIX)), None)


def _registered(variable: str, text: str | None, noun: str) -> dict[str, str]:
    """`{"name": "module:attr"}` from the environment variable `variable`, checked."""
    if not text:
        return {}
    try:
        parsed = json.loads(text)
    except ValueError:
        raise ValueError(f'{variable} is not JSON: use {{"name": "module:attr"}}') from None
    if not isinstance(parsed, dict):
        raise ValueError(f"{variable} must be a JSON object of name -> module:attr")
    for name, target in parsed.items():
        if not AGENT_NAME.fullmatch(name):
            raise ValueError(f"{variable}: {name!r} is not {noun}")
        if not isinstance(target, str) or not IMPORT_PATH.fullmatch(target):
            raise ValueError(f"{variable}: {name!r} must map to 'module:attr'")
    return parsed


def load_agent(reference: str) -> Agent:
    """Resolve a scenario name (`migration`) or an import path (`my_pkg.agents:billing`), as
    the CLI and the runtimes do for a run's stored agent."""
    return LOCAL.load(reference)


def _import(target: str, reference: str) -> Agent:
    try:
        found = import_object(target, what="agent", reference=reference)
    except ImportFailed as failed:  # the module does not import, or lacks the attribute
        raise AgentNotFound(str(failed)) from None
    if not isinstance(found, Agent):
        raise AgentNotFound(f"{target!r} is not a ratchet.tools.Agent")
    return found


def declared_events(reference: str, registry: AgentRegistry = LOCAL) -> Sequence[str] | None:
    """The event names the run's agent declares it waits for (`Agent.events`), or None: it
    declares none, or it cannot be loaded here (the event is then kept, as for any agent)."""
    try:
        agent = registry.load(reference)
    except RatchetError:
        return None
    return list(agent.events) if agent.events is not None else None


PROJECT_FILES = ("ratchet.toml", "pyproject.toml")
"""Where a project keeps its `[tool.ratchet]` table (a `ratchet.toml`, at its top level), in the
order the stack looks for them (`ratchet/cdk/project.py`)."""


@dataclass(frozen=True)
class ProjectAgents:
    """The agents and models a project registers by name, and the folders their code imports
    from: what `ratchet serve` reads from the folder it starts in, as the stack reads it."""

    config_file: Path | None
    agents: Mapping[str, str] = field(default_factory=dict)
    models: Mapping[str, str] = field(default_factory=dict)
    source: tuple[Path, ...] = ()


def project_agents(folder: Path) -> ProjectAgents:
    """The `[tool.ratchet]` agents, models and source folders of the project in `folder` (a
    `ratchet.toml`, else a `pyproject.toml` with that table); none if it has neither. Only
    those keys are read here: the stack checks the rest (`ratchet/cdk/project.py`). A mistake is
    `InvalidInput` naming the file and the key."""
    for name in PROJECT_FILES:
        config_file = folder / name
        if not config_file.is_file():
            continue
        # Loaded only for a project that has a file to read: `ratchet start` elsewhere has none.
        import tomllib

        try:
            document = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise InvalidInput(f"{config_file}: cannot read it as TOML: {error}") from None
        if name == "pyproject.toml":
            table = document.get("tool", {}).get("ratchet")
            if table is None:
                continue
            prefix = "[tool.ratchet] "
        else:
            table, prefix = document, ""
        return _project_table(config_file, prefix, table)
    return ProjectAgents(config_file=None)


def _project_table(config_file: Path, prefix: str, table: Any) -> ProjectAgents:
    def refused(key: str, message: str) -> InvalidInput:
        return InvalidInput(f"{config_file}: {prefix}{key}: {message}")

    if not isinstance(table, dict):
        raise refused("(table)", "is not a table")
    named: dict[str, dict[str, str]] = {}
    for key in ("agents", "models"):
        value = table.get(key, {})
        if not isinstance(value, dict):
            raise refused(key, "must be a table of name -> 'module:attr'")
        for name, target in value.items():
            if not AGENT_NAME.fullmatch(name):
                raise refused(f"{key}.{name}", f"{name!r} is not a name")
            if not isinstance(target, str) or not IMPORT_PATH.fullmatch(target):
                raise refused(f"{key}.{name}", f"must map to 'module:attr', not {target!r}")
        named[key] = dict(sorted(value.items()))
    if taken := _builtin_agent(named["agents"]):
        raise refused(f"agents.{taken}", f"{taken!r} is a built-in scenario's name")
    source = table.get("source", ".")
    folders = [source] if isinstance(source, str) else source
    if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
        raise refused("source", "give a folder, or a list of folders, relative to the file")
    paths = []
    for folder in folders:
        path = (config_file.parent / folder).resolve()
        if not path.is_dir():
            raise refused("source", f"{folder!r} is not a folder ({path})")
        paths.append(path)
    return ProjectAgents(config_file, named["agents"], named["models"], tuple(paths))
