"""A new project of a user's own, as `ratchet init` writes it: a package with a small agent, its
tests, and (the `aws` template) a CDK app on Ratchet's construct and a deploy workflow.

The files are package data beside this module (`template/`): `common/` for every template,
then the template's own folder, each file ending in `.tmpl`. In their paths `PACKAGE` stands for
the package's name and a leading `dot-` for a dot (`dot-github/` is `.github/`), since dotfiles
are easy to lose in packaging; in their text `{{name}}`, `{{package}}`, `{{stack}}`, `{{agent}}`
and `{{ratchet_version}}` are replaced (GitHub's `${{ ... }}` has spaces inside, and is left as
it is).

Nothing is ever overwritten: every file is made with an exclusive create, so a file that
appears between the check and the write is kept too. `plan` checks everything first (the name,
the folder, what is in the way), so bad input writes nothing.
"""

from __future__ import annotations

import keyword
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from ratchet.errors import InvalidInput

TEMPLATES = ("aws", "local")
"""`aws`: the agent, its tests, the CDK app and the deploy workflow; `local`: the agent and its
tests, for a project that runs on SQLite only."""
DEFAULT_TEMPLATE = "aws"
AGENT = "payout"
"""The name the project registers its agent under (`[tool.ratchet] agents`)."""
SUFFIX = ".tmpl"
PACKAGE_PLACEHOLDER = "PACKAGE"
DOT_PREFIX = "dot-"

NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
MAX_NAME_CHARS = 50
TAKEN = frozenset({"ratchet", "ratchet_functions", "tests", "app", "cdk", "aws_cdk"})
"""Packages a project's own may not be named: Ratchet's, those of the Lambda bundle and the CDK
app (`app.py`, the `cdk` and `aws_cdk` imports), and the tests folder."""


@dataclass(frozen=True)
class ProjectName:
    """A project's names: the distribution (`my-agents`), its package (`my_agents`) and its
    CloudFormation stack (`MyAgents`)."""

    name: str
    package: str
    stack: str

    @classmethod
    def of(cls, text: str, *, given: bool) -> ProjectName:
        """The names a project called `text` gets; `InvalidInput` if it makes no package name
        (`given`: typed as --name, rather than taken from the folder)."""
        where = f"--name {text!r}" if given else f"the folder's name {text!r}"
        remedy = "" if given else " (or give one with --name)"
        if not NAME.fullmatch(text) or len(text) > MAX_NAME_CHARS:
            raise InvalidInput(
                f"{where} makes no package name: use lowercase letters, digits, and '-' or '_' "
                f"between them, starting with a letter, at most {MAX_NAME_CHARS} characters"
                f"{remedy}"
            )
        package = text.replace("-", "_")
        if keyword.iskeyword(package) or package in TAKEN:
            raise InvalidInput(f"{where} makes the package {package!r}, a name taken{remedy}")
        if package in sys.stdlib_module_names:
            raise InvalidInput(
                f"{where} makes the package {package!r}, which would hide Python's own module "
                f"of that name{remedy}"
            )
        stack = "".join(part.capitalize() for part in re.split(r"[-_]", text))
        return cls(text, package, stack)


@dataclass(frozen=True)
class Planned:
    """What `ratchet init` writes: each file by its path under the folder, and the files
    already there that it keeps as they are."""

    folder: Path
    files: Mapping[str, str]
    kept: tuple[str, ...]


def plan(
    folder: Path, project: ProjectName, *, template: str, version: str, force: bool
) -> Planned:
    """Check that the project can be written into `folder` and say what would be: an empty or
    missing folder, or with `force` one whose files are kept; `InvalidInput` otherwise, and
    for anything in the way of a folder the project makes."""
    if template not in TEMPLATES:
        raise InvalidInput(f"--template {template!r}: use one of {', '.join(TEMPLATES)}")
    if folder.exists() and not folder.is_dir():
        raise InvalidInput(f"{folder} is a file: ratchet init makes a project in a folder")
    present = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if present and not force:
        shown = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
        raise InvalidInput(
            f"{folder} is not empty ({shown}): ratchet init writes into an empty folder; "
            "--force writes beside what is there and overwrites no file"
        )
    values = {
        "name": project.name,
        "package": project.package,
        "stack": project.stack,
        "agent": AGENT,
        "ratchet_version": version,
    }
    files = dict(sorted(_rendered(template, values)))
    kept = []
    for relative in files:
        target = folder / relative
        for parent in reversed(target.relative_to(folder).parents[:-1]):
            if (folder / parent).exists() and not (folder / parent).is_dir():
                raise InvalidInput(
                    f"{folder / parent} is a file, where ratchet init makes a folder"
                )
        if target.is_dir():
            raise InvalidInput(f"{target} is a folder, where ratchet init makes a file")
        if target.exists():
            kept.append(relative)
    return Planned(folder, files, tuple(kept))


def write(planned: Planned) -> list[str]:
    """Make every planned file that is not there yet; the paths made, in order."""
    made = []
    for relative, text in planned.files.items():
        target = planned.folder / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            # "x": create, never truncate; a file made since `plan` looked is kept as well.
            with target.open("x", encoding="utf-8", newline="\n") as file:
                file.write(text)
        except FileExistsError:
            continue
        made.append(relative)
    return made


def _rendered(template: str, values: Mapping[str, str]) -> Iterator[tuple[str, str]]:
    root = resources.files(__name__).joinpath("template")
    for part in ("common", template):
        for relative, source in _files(root.joinpath(part), ""):
            path = "/".join(
                values["package"] if piece == PACKAGE_PLACEHOLDER else _undotted(piece)
                for piece in relative.removesuffix(SUFFIX).split("/")
            )
            text = source.read_text(encoding="utf-8")
            for key, value in values.items():
                text = text.replace("{{" + key + "}}", value)
            yield path, text


def _files(folder: Traversable, prefix: str) -> Iterator[tuple[str, Traversable]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _files(entry, f"{prefix}{entry.name}/")
        elif entry.name.endswith(SUFFIX):
            yield f"{prefix}{entry.name}", entry


def _undotted(piece: str) -> str:
    return "." + piece.removeprefix(DOT_PREFIX) if piece.startswith(DOT_PREFIX) else piece
