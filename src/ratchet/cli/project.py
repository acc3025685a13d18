"""A project of the user's own, worked from its folder: `init` makes one, `synth` builds its
stack with this Python, `deploy` deploys it with the CDK CLI.

`synth` runs the project's CDK app (`cdk.json`'s `app`, a Python command) with the interpreter
that runs `ratchet`, as the CDK CLI would run it: the output folder and the context (cdk.json's,
cdk.context.json's, then each `--context`) go to the app in `CDK_OUTDIR` and
`CDK_CONTEXT_JSON`. No CDK CLI is needed; the CDK's Python library is (the `cdk` extra), and it
runs on Node.js through jsii. `deploy` hands the same app to the CDK CLI (`--app`), so both
synthesize with the same Python whatever `python` is on PATH.

Each refuses, in one line and before it writes anything, what it cannot work with: a folder
with no CDK app, no Node.js (or one older than the CDK supports), no CDK CLI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from ratchet.cli.context import err, installed_version, out, say
from ratchet.cli.options import not_empty
from ratchet.errors import InvalidInput

MIN_NODE_MAJOR = 20
"""The oldest Node.js the CDK (the library's jsii runtime and the CLI) supports."""
CDK_CLI_PACKAGE = "aws-cdk@2"
"""What `npx` runs when no `cdk` is on PATH: the CLI's major version, which reads the cloud
assemblies of aws-cdk-lib 2 (the CLI's own versions are 2.1xxx)."""
OUTPUT = "cdk.out"
REQUIRE_APPROVAL = ("never", "any-change", "broadening")
_PYTHON = re.compile(r"^python(?:3(?:\.\d+)?)?$")
_QUIET_JSII = {
    # jsii warns about Node 20's end of life on every start; the CDK still runs on it.
    "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
    "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
}

FolderArgument = Annotated[
    Path,
    typer.Argument(
        metavar="DIR",
        help="The project's folder (the one holding cdk.json). Default: this one.",
        show_default=False,
    ),
]
ContextOption = Annotated[
    list[str] | None,
    typer.Option(
        "--context",
        "-c",
        metavar="KEY=VALUE",
        callback=not_empty,
        help="Context for the CDK app, over cdk.json's; repeatable.",
    ),
]


def init(
    folder: Annotated[
        Path,
        typer.Argument(
            metavar="DIR",
            help="The new project's folder, made if missing. Default: this one.",
            show_default=False,
        ),
    ] = Path("."),
    name: Annotated[
        str | None,
        typer.Option(
            "--name",
            metavar="NAME",
            callback=not_empty,
            help="The project's name (lowercase letters, digits, '-', '_'); its package is this "
            "with '_' for '-'. Default: the folder's name.",
            show_default=False,
        ),
    ] = None,
    template: Annotated[
        str,
        typer.Option(
            "--template",
            metavar="NAME",
            help="aws: the agent, its tests, a CDK app on Ratchet's construct and a GitHub "
            "deploy workflow; local: the agent and its tests only.",
        ),
    ] = "aws",
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Write into a folder that holds files already. No file is ever overwritten: "
            "those already there are kept as they are.",
        ),
    ] = False,
) -> None:
    """Make a new project: a package with a small agent (a tool applied once per step key, an
    approval, a scripted policy), its tests and, with the aws template, a CDK app and a deploy
    workflow."""
    from ratchet import scaffold

    target = folder.absolute()
    project = scaffold.ProjectName.of(
        name if name is not None else Path(os.path.normpath(target)).name, given=name is not None
    )
    planned = scaffold.plan(
        target,
        project,
        template=template,
        version=_pinnable(installed_version()),
        force=force,
    )
    made = scaffold.write(planned)
    shown = _shown(folder)
    say(f"Made the project {project.name} in {shown} (package {project.package}):")
    for relative in made:
        say(f"  {relative}")
    for relative in planned.kept:
        say(f"  {relative} (already there: kept as it was)")
    out.print("Next:", markup=False)
    enter = f"cd {shlex.quote(shown)} && " if shown != "." else ""
    if template == "aws":
        say(f"  {enter}pytest && ratchet synth    # the tests, then the stack, in cdk.out/")
    else:
        say(f"  {enter}pytest    # the agent's tests, offline")


def synth(folder: FolderArgument = Path("."), context: ContextOption = None) -> None:
    """Synthesize the project's stack into DIR/cdk.out, running its CDK app with this Python
    (no CDK CLI needed; the CDK's library needs Node.js 20+). Prints each template and its
    resource count."""
    app = cdk_app(folder)
    given = parse_context(context or [])
    require_cdk_library("synth")
    require_node("synth")
    output = app.folder / OUTPUT
    environment = {
        **os.environ,
        **_QUIET_JSII,
        "CDK_OUTDIR": str(output),
        "CDK_CONTEXT_JSON": json.dumps({**app.context, **given}),
    }
    done = subprocess.run(app.argv, cwd=app.folder, env=environment, check=False)
    if done.returncode != 0:
        say(f"ratchet: the CDK app failed (exit code {done.returncode}): see above", console=err)
        raise typer.Exit(1)
    stacks = synthesized_stacks(output)
    if not stacks:
        raise InvalidInput(f"the CDK app in {app.folder} made no stack")
    for stack, template, resources in stacks:
        say(f"Synthesized {stack}: {_shown(template)} ({resources} resources)")


def deploy(
    folder: FolderArgument = Path("."),
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            metavar="PROFILE",
            callback=not_empty,
            help="The AWS profile to deploy with (default: the usual AWS_* variables and files).",
            show_default=False,
        ),
    ] = None,
    context: ContextOption = None,
    require_approval: Annotated[
        str | None,
        typer.Option(
            "--require-approval",
            metavar="never|any-change|broadening",
            help="When the CDK CLI asks before deploying (its default: broadening, a change "
            "that widens a permission).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Deploy the project's stack with the CDK CLI (a cdk on PATH, else npx aws-cdk), which
    runs its CDK app with this Python. Needs AWS credentials and a bootstrapped account."""
    app = cdk_app(folder)
    given = parse_context(context or [])
    if require_approval is not None and require_approval not in REQUIRE_APPROVAL:
        raise InvalidInput(
            f"--require-approval {require_approval!r}: use one of {', '.join(REQUIRE_APPROVAL)}"
        )
    require_cdk_library("deploy")
    require_node("deploy")
    command = [
        *cdk_cli(),
        "deploy",
        "--app",
        shlex.join(app.argv),
        "--output",
        OUTPUT,
        *(["--profile", profile] if profile else []),
        *(arg for key, value in given.items() for arg in ("--context", f"{key}={value}")),
        *(["--require-approval", require_approval] if require_approval else []),
    ]
    done = subprocess.run(command, cwd=app.folder, env={**os.environ, **_QUIET_JSII}, check=False)
    raise typer.Exit(done.returncode)


@dataclass(frozen=True)
class CdkApp:
    """A project's CDK app: where it is, the command that runs it with this Python, and the
    context its cdk.json (and cdk.context.json, the CLI's cache of lookups) gives it."""

    folder: Path
    argv: list[str]
    context: dict[str, Any]


def cdk_app(folder: Path) -> CdkApp:
    """The CDK app in `folder`; `InvalidInput` if there is none, or not a Python one."""
    if not folder.is_dir():
        raise InvalidInput(f"{folder.absolute()} is not a folder")
    config = folder / "cdk.json"
    if not config.is_file():
        raise InvalidInput(
            f"{folder.absolute()} has no CDK app (no cdk.json): give your project's folder, "
            "or make a project with ratchet init"
        )
    try:
        document = json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InvalidInput(f"{config} cannot be read as JSON: {error}") from None
    command = document.get("app") if isinstance(document, dict) else None
    if not isinstance(command, str) or not command.strip():
        raise InvalidInput(f'{config} says no app to run (its "app" key)')
    words = shlex.split(command)
    if not _PYTHON.fullmatch(Path(words[0]).name):
        raise InvalidInput(
            f"{config}: its app {command!r} is not run by Python: ratchet synth and deploy run "
            "a Python CDK app, with the Python that runs ratchet"
        )
    script = words[1] if len(words) > 1 and not words[1].startswith("-") else None
    if script is not None and not (folder / script).is_file():
        raise InvalidInput(
            f"{folder.absolute()} has no CDK app: its cdk.json runs {script}, which is not there"
        )
    context: dict[str, Any] = {}
    for source in (document.get("context"), _json_object(folder / "cdk.context.json")):
        if isinstance(source, dict):
            context.update(source)
    return CdkApp(folder.absolute(), [sys.executable, *words[1:]], context)


def _json_object(path: Path) -> Any:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InvalidInput(f"{path} cannot be read as JSON: {error}") from None


def parse_context(pairs: list[str]) -> dict[str, str]:
    given: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key.strip():
            raise InvalidInput(f"--context {pair!r}: use --context KEY=VALUE")
        given[key] = value
    return given


def require_cdk_library(command: str) -> None:
    if importlib.util.find_spec("aws_cdk") is None:
        raise InvalidInput(
            f"ratchet {command} needs the CDK's library, which this Python lacks: "
            "pip install 'ratchet-agents[cdk]'"
        )


def require_node(command: str) -> None:
    """Node.js at `MIN_NODE_MAJOR` or later on PATH: the CDK's Python library runs its
    JavaScript through it (jsii), and so does the CDK CLI."""
    wanted = (
        f"ratchet {command} needs Node.js {MIN_NODE_MAJOR}+ (the AWS CDK runs on it): install "
        "it from https://nodejs.org or your package manager"
    )
    node = shutil.which("node")
    if node is None:
        raise InvalidInput(f"{wanted}; there is no node on PATH")
    try:
        said = subprocess.run(
            [node, "--version"], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        said = ""
    found = re.fullmatch(r"v(\d+)\.\d+\.\d+\S*", said)
    if found is None:
        raise InvalidInput(f"{wanted}; {node} does not say its version")
    if int(found.group(1)) < MIN_NODE_MAJOR:
        raise InvalidInput(f"{wanted}; this is Node.js {said}")


def cdk_cli() -> list[str]:
    """The CDK CLI's command: a `cdk` on PATH, else the pinned major version through npx."""
    cdk = shutil.which("cdk")
    if cdk is not None:
        return [cdk]
    npx = shutil.which("npx")
    if npx is not None:
        return [npx, "--yes", CDK_CLI_PACKAGE]
    raise InvalidInput(
        "ratchet deploy needs the AWS CDK CLI: there is neither a cdk nor an npx on PATH "
        f"(Node.js {MIN_NODE_MAJOR}+ brings npx; or npm install -g aws-cdk)"
    )


def synthesized_stacks(output: Path) -> list[tuple[str, Path, int]]:
    """Each stack of the cloud assembly in `output`: its name, template and resource count."""
    manifest = json.loads((output / "manifest.json").read_text(encoding="utf-8"))
    stacks = []
    for artifact, spec in sorted(manifest.get("artifacts", {}).items()):
        if spec.get("type") != "aws:cloudformation:stack":
            continue
        template = output / spec["properties"]["templateFile"]
        resources = json.loads(template.read_text(encoding="utf-8")).get("Resources", {})
        stacks.append((spec.get("displayName", artifact), template, len(resources)))
    return stacks


def _pinnable(found: str) -> str:
    """The version a new project pins Ratchet to: this one, if it is one."""
    return found if re.fullmatch(r"\d+(\.\d+)*\S*", found) else "0.1.0"


def _shown(path: Path) -> str:
    """`path` as the user would type it from here: relative when it is under this folder."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd())) or "."
    except ValueError:
        return str(absolute)
