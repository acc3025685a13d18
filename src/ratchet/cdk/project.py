"""A user's Ratchet project: the agents a deployment registers, and the code and requirements
the Lambda bundle ships for them.

It is read from a `[tool.ratchet]` table in the project's `pyproject.toml`, or from the top
level of a `ratchet.toml` (the same keys)::

    [tool.ratchet]
    agents = { billing = "billing_agent.agent:agent" }   # name -> module:attr
    source = "src"                    # folder(s) holding the packages to ship; default "."
    requirements = ["httpx==0.28.1"]  # what the agents need beyond Ratchet (PEP 508)
    secrets = { PAYMENTS_API_KEY = "secretsmanager:payments/api-key" }   # or ssm:/a/b, an ARN
    environment = { PAYMENTS_URL = "https://pay.example.com" }           # plain values

    [[tool.ratchet.permissions]]      # IAM statements for the step function, Allow only
    actions = ["execute-api:Invoke"]
    resources = ["arn:aws:execute-api:eu-west-1:123456789012:a1b2c3/prod/POST/refunds"]
    reason = "..."                    # required when an action or a resource has a *

    [[tool.ratchet.schedules]]        # one EventBridge Scheduler schedule each (docs/schedules.md)
    name = "nightly"
    agent = "billing"                 # an agent the deployment registers
    cron = "0 2 * * *"                # or every = "15m"; as `ratchet schedule add` takes them
    timezone = "Europe/Berlin"        # optional, default UTC
    input = { account = "eu" }        # optional

A schedule is checked by `ratchet.schedules.ScheduleSpec`, the model `ratchet schedule add`
checks a local schedule with, and its rule must have an EventBridge Scheduler form
(`schedule_expressions.py`).

`secrets` and `environment` reach the step function only (where the tools run); each secret
is readable by it alone, fetched once per container and given to the agent as
`RunContext.secrets`, never logged and never in a run's state.

Every mistake is reported with the file and the key it is in, before anything is built.

What ships from `source`: every top-level package (a folder with an `__init__.py`) and module
(a `.py` file) in each source folder, whole, as `pip install .` of a src layout would ship it,
so an agent that imports a sibling package of its own (shared clients, helpers) works on
Lambda as it does on the laptop. Tests (`tests/`, `test_*.py`, `conftest.py`), virtual
environments, bytecode caches and dotfiles never ship. Each project agent's top-level module
must be among what ships, which catches a wrong `source` at synth rather than at cold start.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name
from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from ratchet.cdk.schedule_expressions import NotExpressible, eventbridge_cron, eventbridge_rate
from ratchet.errors import InvalidInput
from ratchet.schedules import ScheduleSpec, parse_every

AGENT_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""`ratchet.agents.AGENT_NAME`: a name the API may start."""
IMPORT_PATH_PATTERN = r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$"
"""`ratchet.imports.IMPORT_PATH`: `module:attr`."""
BUILT_IN_AGENTS = ("migration", "notebook")
"""`ratchet.agents.SCENARIOS`: names a deployment cannot take over."""

RATCHET_TOML = "ratchet.toml"
PYPROJECT_TOML = "pyproject.toml"
RATCHET_PACKAGE = "ratchet"
"""Always in the bundle: neither a requirement nor a package of the project may take its name."""
RATCHET_DISTRIBUTIONS = frozenset({"ratchet-agents", RATCHET_PACKAGE})
"""Requirements a project may not name: Ratchet's own distribution (the bundle has it, the very
package that synthesizes), and the project on PyPI named `ratchet`, whose package would shadow
it."""

_TEST_FOLDERS = {"tests", "test"}
_NEVER_SHIPPED_MODULES = {"conftest.py", "setup.py", "noxfile.py"}
"""Files at a source folder's top that belong to tooling, not to the agents."""


class ProjectError(ValueError):
    """The project's configuration is wrong; the message names the file and the key."""


def check_agent(name: str, target: object) -> str | None:
    """Why `name -> target` cannot be registered, or None: the rules of `ratchet:agents`."""
    if not re.fullmatch(AGENT_NAME_PATTERN, name):
        return f"{name!r} is not an agent name (letters, digits, '.', '_', '-'; at most 64)"
    if name in BUILT_IN_AGENTS:
        return f"{name!r} is a built-in scenario's name"
    if not isinstance(target, str) or not re.fullmatch(IMPORT_PATH_PATTERN, target):
        return f"{name!r} must map to 'module:attr', not {target!r}"
    return None


SETTING_NAME_PATTERN = r"^[A-Z][A-Z0-9_]{0,63}$"
"""A secret's or an environment variable's name, as the agent reads it."""
RESERVED_PREFIXES = ("AWS_", "RATCHET_", "POWERTOOLS_", "LAMBDA_", "_X_AMZN", "OTEL_")
RESERVED_NAMES = frozenset({"PATH", "PYTHONPATH", "HOME", "LANG", "TZ", "ANTHROPIC_API_KEY"})
SECRET_REFERENCE = re.compile(
    r"^(secretsmanager:[A-Za-z0-9/_+=.@-]{1,512}"
    r"|ssm:/?[A-Za-z0-9/_.-]{1,1011}"
    r"|arn:aws[a-z-]*:secretsmanager:[a-z0-9-]+:\d{12}:secret:[A-Za-z0-9/_+=.@-]+"
    r"|arn:aws[a-z-]*:ssm:[a-z0-9-]+:\d{12}:parameter/[A-Za-z0-9/_.-]+)$"
)
IAM_ACTION = re.compile(r"^[a-z0-9-]+:[A-Za-z0-9*?]+$")
IAM_RESOURCE = re.compile(r"^(\*|arn:[^\s]+)$")


def check_setting_name(name: str) -> str | None:
    """Why `name` cannot be a secret's or environment variable's name, or None."""
    if not re.fullmatch(SETTING_NAME_PATTERN, name):
        return f"{name!r} is not a name (capital letters, digits and '_', starting with a letter)"
    if name in RESERVED_NAMES or name.startswith(RESERVED_PREFIXES):
        return f"{name!r} is Lambda's, Ratchet's or Python's own: choose another name"
    return None


class Permission(BaseModel):
    """One IAM statement the step function is given, for the agent's tools: Allow only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    actions: list[str] = Field(min_length=1, max_length=50)
    resources: list[str] = Field(min_length=1, max_length=50)
    reason: str | None = Field(default=None, min_length=10, max_length=1000)
    """Why a wildcard is needed: required when an action or a resource holds a `*`, and
    recorded as the cdk-nag acknowledgement of that wildcard."""

    @field_validator("actions")
    @classmethod
    def _actions(cls, value: list[str]) -> list[str]:
        for action in value:
            if not IAM_ACTION.fullmatch(action):
                raise ValueError(f"{action!r} is not an IAM action (service:Action)")
            if action.split(":", 1)[1] == "*":
                raise ValueError(f"{action!r} allows every action of a service: name them")
        return value

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: list[str]) -> list[str]:
        for resource in value:
            if not IAM_RESOURCE.fullmatch(resource):
                raise ValueError(f"{resource!r} is not an ARN (or '*')")
        return value

    @property
    def wildcards(self) -> list[str]:
        """The cdk-nag findings this statement raises: each action and resource with a `*`."""
        return [f"Action::{a}" for a in self.actions if "*" in a] + [
            f"Resource::{r}" for r in self.resources if "*" in r
        ]

    def model_post_init(self, _context: Any) -> None:
        if self.wildcards and self.reason is None:
            raise ValueError(
                f"{', '.join(w.split('::', 1)[1] for w in self.wildcards)} holds a wildcard: "
                "say why in reason (at least 10 characters), or name what the tools use"
            )


MAX_PROJECT_SCHEDULES = 100
"""Each schedule is one resource of the stack, which CloudFormation caps at 500 in all."""


class _ScheduleTable(BaseModel):
    """A `[[tool.ratchet.schedules]]` entry as written; `Project.load` checks it as a
    `ScheduleSpec`, which spells the interval in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    agent: str
    cron: str | None = None
    every: str | None = None
    input: dict[str, JsonValue] = Field(default_factory=dict)
    timezone: str = "UTC"


class _Table(BaseModel):
    """The keys as written; paths are checked against the file's folder afterwards."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    agents: dict[str, str] = Field(default_factory=dict)
    source: list[str] = Field(default_factory=lambda: ["."], min_length=1)
    requirements: list[str] = Field(default_factory=list)
    models: dict[str, str] = Field(default_factory=dict)
    secrets: dict[str, str] = Field(default_factory=dict, max_length=50)
    environment: dict[str, str] = Field(default_factory=dict, max_length=50)
    permissions: list[Permission] = Field(default_factory=list, max_length=20)
    schedules: list[_ScheduleTable] = Field(default_factory=list, max_length=MAX_PROJECT_SCHEDULES)

    @field_validator("models", mode="before")
    @classmethod
    def _models(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, target in value.items():
                if not re.fullmatch(AGENT_NAME_PATTERN, str(name)):
                    raise ValueError(
                        f"{name!r} is not a model name (letters, digits, '.', '_', '-')"
                    )
                if name == "scripted" or str(name).startswith("claude-"):
                    raise ValueError(f"{name!r} is a built-in model's name")
                if not isinstance(target, str) or not re.fullmatch(IMPORT_PATH_PATTERN, target):
                    raise ValueError(f"{name!r} must map to 'module:attr', not {target!r}")
        return value

    @field_validator("secrets")
    @classmethod
    def _secrets(cls, value: dict[str, str]) -> dict[str, str]:
        for name, reference in value.items():
            problem = check_setting_name(name)
            if problem:
                raise ValueError(problem)
            if not SECRET_REFERENCE.fullmatch(reference):
                raise ValueError(
                    f"{name}: {reference!r} names no secret: give secretsmanager:NAME, "
                    "ssm:/PARAMETER, or the ARN of either"
                )
        return value

    @field_validator("environment")
    @classmethod
    def _environment(cls, value: dict[str, str]) -> dict[str, str]:
        for name, text in value.items():
            problem = check_setting_name(name)
            if problem:
                raise ValueError(problem)
            if len(text.encode("utf-8")) > 4096:
                raise ValueError(f"{name}: a value is at most 4 KB (Lambda's whole environment)")
        return value

    @field_validator("agents", mode="before")
    @classmethod
    def _agents(cls, value: Any) -> Any:
        if isinstance(value, dict):
            for name, target in value.items():
                problem = check_agent(str(name), target)
                if problem:
                    raise ValueError(problem)
        return value

    @field_validator("source", mode="before")
    @classmethod
    def _one_or_more(cls, value: Any) -> Any:
        return [value] if isinstance(value, str) else value

    @field_validator("source")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for folder in value:
            if not folder.strip() or Path(folder).is_absolute():
                raise ValueError(f"{folder!r}: give a folder relative to the file")
        return value

    @field_validator("requirements")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for text in value:
            try:
                requirement = Requirement(text)
            except InvalidRequirement as error:
                raise ValueError(f"{text!r} is not a PEP 508 requirement: {error}") from None
            if requirement.url:
                # The bundle installs wheels from the index, hashed by what the file says: a
                # URL's content could change under an unchanged hash.
                raise ValueError(f"{text!r} is a direct reference; name a version from the index")
            if canonicalize_name(requirement.name) in RATCHET_DISTRIBUTIONS:
                raise ValueError(
                    f"{text!r}: Ratchet itself is always in the bundle, as it synthesizes"
                )
        return value


@dataclass(frozen=True)
class ShippedFile:
    """One file of the project in the bundle: `path` (relative, posix) <- `source`."""

    path: str
    source: Path


@dataclass(frozen=True)
class Project:
    """A parsed, checked project configuration."""

    config_file: Path
    key_prefix: str
    """How its keys are named in messages: `[tool.ratchet] ` in a pyproject.toml, else empty."""
    agents: Mapping[str, str]
    source: tuple[Path, ...]
    """Absolute folders."""
    requirements: tuple[str, ...]
    models: Mapping[str, str] = field(default_factory=dict)
    """Models of the project's own: name a run gives as its `model` -> `module:attr`."""
    secrets: Mapping[str, str] = field(default_factory=dict)
    """Name the agent reads (`RunContext.secrets[NAME]`) -> `secretsmanager:NAME`,
    `ssm:/PARAMETER` or an ARN of either."""
    environment: Mapping[str, str] = field(default_factory=dict)
    permissions: tuple[Permission, ...] = ()
    schedules: tuple[ScheduleSpec, ...] = ()
    """Each deployed as one EventBridge Scheduler schedule, in the order written."""

    @classmethod
    def load(cls, location: Path) -> Project:
        """Read the configuration at `location`: a `ratchet.toml` or `pyproject.toml` file, or
        a folder holding one (`ratchet.toml` first)."""
        config_file = _config_file(location.resolve())
        try:
            document = tomllib.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
            raise ProjectError(f"{config_file}: cannot read it as TOML: {error}") from None
        if config_file.name == PYPROJECT_TOML:
            table = document.get("tool", {}).get("ratchet")
            if not isinstance(table, dict):
                raise ProjectError(f"{config_file}: has no [tool.ratchet] table")
            prefix = "[tool.ratchet] "
        else:
            table, prefix = document, ""
        try:
            parsed = _Table.model_validate(table)
        except ValidationError as error:
            raise ProjectError(_describe(error, config_file, prefix)) from None
        project = cls(
            config_file=config_file,
            key_prefix=prefix,
            agents=dict(sorted(parsed.agents.items())),
            source=tuple(_folders(parsed.source, config_file, prefix)),
            requirements=tuple(parsed.requirements),
            models=dict(sorted(parsed.models.items())),
            secrets=dict(sorted(parsed.secrets.items())),
            environment=dict(sorted(parsed.environment.items())),
            permissions=tuple(parsed.permissions),
        )
        project = replace(project, schedules=tuple(project._schedules(parsed.schedules)))
        twice = sorted(set(project.secrets) & set(project.environment))
        if twice:
            raise project.error(
                f"environment.{twice[0]}", "is a secret's name too: name each setting once"
            )
        project._check_agents_ship()
        return project

    def _schedules(self, entries: list[_ScheduleTable]) -> Iterator[ScheduleSpec]:
        """Each entry checked as `ratchet schedule add` checks it, and as Scheduler will take
        it: the first problem of each, in one line naming its key."""
        named: dict[str, int] = {}
        for index, entry in enumerate(entries):
            key = f"schedules.{index}"
            spec = self._schedule(key, entry)
            if spec.name in named:
                raise self.error(
                    f"{key}.name",
                    f"{spec.name!r} names schedules.{named[spec.name]} too: name each once",
                )
            named[spec.name] = index
            try:
                if spec.cron is not None:
                    eventbridge_cron(spec.cron)
                else:
                    eventbridge_rate(spec.every_seconds or 0)
            except NotExpressible as error:
                raise self.error(f"{key}.{'cron' if spec.cron else 'every'}", str(error)) from None
            yield spec

    def _schedule(self, key: str, entry: _ScheduleTable) -> ScheduleSpec:
        fields = entry.model_dump(exclude={"every"}, exclude_none=True)
        if entry.every is not None:
            try:
                fields["every_seconds"] = parse_every(entry.every)
            except InvalidInput as error:
                raise self.error(f"{key}.every", str(error).removeprefix("every: ")) from None
        try:
            return ScheduleSpec.model_validate(fields)
        except ValidationError as error:
            first = error.errors(include_url=False)[0]
            field = ".".join(str(part) for part in first["loc"])
            message = str(first["msg"]).removeprefix("Value error, ")
            if not field:  # the check of the whole entry: neither rule, or both
                field = "cron"
            raise self.error(f"{key}.{field}", message) from None

    def error(self, key: str, message: str) -> ProjectError:
        return ProjectError(f"{self.config_file}: {self.key_prefix}{key}: {message}")

    def top_level(self) -> dict[str, Path]:
        """The packages and modules that ship, by import name -> their path in a source folder."""
        found: dict[str, Path] = {}
        for folder in self.source:
            for entry in sorted(folder.iterdir()):
                name = _importable(entry)
                if name is None:
                    continue
                if name in found:
                    raise self.error(
                        "source", f"{name!r} is in {found[name].parent} and in {folder}"
                    )
                if name == RATCHET_PACKAGE:
                    raise self.error(
                        "source", f"{entry} would replace Ratchet's own package in the bundle"
                    )
                found[name] = entry
        return found

    def shipped_files(self) -> list[ShippedFile]:
        """Every file that goes into the bundle, in a stable order (the asset hash reads it)."""
        files: list[ShippedFile] = []
        for name, entry in sorted(self.top_level().items()):
            if entry.is_file():
                files.append(ShippedFile(f"{name}.py", entry))
                continue
            files.extend(
                ShippedFile(f"{name}/{path.relative_to(entry).as_posix()}", path)
                for path in _package_files(entry)
            )
        return files

    def _check_agents_ship(self) -> None:
        shipped = self.top_level()
        folders = ", ".join(repr(str(f)) for f in self.source)
        named = [("agents", n, t) for n, t in self.agents.items()]
        named += [("models", n, t) for n, t in self.models.items()]
        for key, name, target in named:
            top = target.split(":", 1)[0].split(".", 1)[0]
            if top not in shipped:
                raise self.error(
                    f"{key}.{name}",
                    f"{target!r} needs the package or module {top!r}, which is in no source "
                    f"folder ({folders})",
                )


def _config_file(location: Path) -> Path:
    if location.is_dir():
        for name in (RATCHET_TOML, PYPROJECT_TOML):
            if (location / name).is_file():
                return location / name
        raise ProjectError(f"{location}: holds neither {RATCHET_TOML} nor {PYPROJECT_TOML}")
    if location.is_file():
        return location
    raise ProjectError(f"{location}: no such file or folder")


def _folders(source: list[str], config_file: Path, prefix: str) -> Iterator[Path]:
    for folder in source:
        path = (config_file.parent / folder).resolve()
        if not path.is_dir():
            raise ProjectError(
                f"{config_file}: {prefix}source: {folder!r} is not a folder ({path})"
            )
        yield path


def _describe(error: ValidationError, config_file: Path, prefix: str) -> str:
    problems = []
    for item in error.errors(include_url=False):
        key = ".".join(str(part) for part in item["loc"]) or "(table)"
        if item["type"] == "extra_forbidden" and item["loc"][0] == "schedules":
            message = "unknown key (a schedule's are name, agent, cron, every, input, timezone)"
        elif item["type"] == "extra_forbidden":
            message = (
                "unknown key (the keys are agents, source, requirements, models, secrets, "
                "environment, permissions, schedules)"
            )
        else:
            message = str(item["msg"]).removeprefix("Value error, ")
        problems.append(f"{config_file}: {prefix}{key}: {message}")
    return "\n".join(problems)


def _importable(entry: Path) -> str | None:
    """The import name of a top-level package or module that ships, or None."""
    if entry.is_dir():
        if _never_shipped(entry) or not (entry / "__init__.py").is_file():
            return None
        return entry.name if entry.name.isidentifier() else None
    if entry.suffix != ".py" or entry.name in _NEVER_SHIPPED_MODULES or _is_test(entry):
        return None
    return entry.stem if entry.stem.isidentifier() else None


def _package_files(package: Path) -> Iterator[Path]:
    for path in sorted(package.iterdir()):
        if path.is_dir():
            if not _never_shipped(path):
                yield from _package_files(path)
        elif not (path.name.startswith(".") or path.suffix == ".pyc" or _is_test(path)):
            yield path


def _never_shipped(folder: Path) -> bool:
    return (
        folder.name.startswith(".")
        or folder.name in ("__pycache__", "node_modules", *_TEST_FOLDERS)
        or (folder / "pyvenv.cfg").exists()
    )


def _is_test(path: Path) -> bool:
    return path.suffix == ".py" and (
        path.name.startswith("test_") or path.stem.endswith("_test") or path.name == "conftest.py"
    )
