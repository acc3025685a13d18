"""Where the construct finds what it deploys besides the user's project: the state machine's
definition, the library and the functions' entry points, and how their dependencies are pinned.

Two places, one layout. In Ratchet's own checkout, `statemachine/` and `lambdas/` are the
repository's folders (the single source of both) and `uv.lock` pins the dependencies. In an
installed wheel (`pip install 'ratchet-agents[cdk]'` in a user's project) the same two files
ship as package data under `ratchet/cdk/_assets/` (pyproject.toml's `force-include`), and the
dependencies are pinned to what the synthesizing environment has installed (`bundling.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

LIBRARY = "ratchet"
"""The library's import name: always in the bundle."""
ENTRY_POINTS = "ratchet_functions"
"""The functions' entry points (`lambdas/ratchet_functions`), each calling `ratchet.handlers`."""
CONSTRUCT = "cdk"
"""This subpackage of the library: it builds the stack and never ships to Lambda."""
ASSETS = "_assets"
"""Where the wheel keeps the state machine and the entry points, inside this subpackage."""
ASL_FILE = Path("statemachine") / "agent_run.asl.json"
ENTRY_POINTS_FOLDER = Path("lambdas") / ENTRY_POINTS

_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class RatchetCode:
    """Ratchet's own part of a deployment, found in a checkout or in the installed wheel."""

    library: Path
    """The `ratchet` package folder (its `cdk` subpackage is left out of the bundle)."""
    entry_points: Path
    """The `ratchet_functions` folder, which the functions' handlers name."""
    state_machine: Path
    """`agent_run.asl.json`."""
    lock: Path | None
    """`uv.lock` of Ratchet's checkout; None for an installed wheel, whose dependencies are
    pinned to the versions installed where it synthesizes."""

    @property
    def repo_root(self) -> Path | None:
        return self.lock.parent if self.lock is not None else None

    @classmethod
    def checkout(cls, repo_root: Path) -> RatchetCode:
        return cls(
            library=repo_root / "src" / LIBRARY,
            entry_points=repo_root / ENTRY_POINTS_FOLDER,
            state_machine=repo_root / ASL_FILE,
            lock=repo_root / "uv.lock",
        )

    @classmethod
    def installed(cls, library: Path) -> RatchetCode:
        assets = library / CONSTRUCT / ASSETS
        return cls(
            library=library,
            entry_points=assets / ENTRY_POINTS_FOLDER,
            state_machine=assets / ASL_FILE,
            lock=None,
        )

    @classmethod
    def find(cls) -> RatchetCode:
        """The installed wheel's assets when this package has them, else the checkout this
        package sits in (`src/ratchet/cdk`, as an editable install or `PYTHONPATH=src` runs
        it). Neither: the wheel was built without its assets, said in one line."""
        library = _HERE.parent
        if (_HERE / ASSETS).is_dir():
            return cls.installed(library)
        repo_root = library.parent.parent
        checkout = cls.checkout(repo_root)
        if library.parent.name == "src" and checkout.lock is not None and checkout.lock.exists():
            return checkout
        raise FileNotFoundError(
            f"{_HERE / ASSETS} is missing: this installation of ratchet-agents has neither the "
            "construct's assets (the state machine, the functions' entry points) nor Ratchet's "
            "checkout around it; reinstall the wheel (`pip install 'ratchet-agents[cdk]'`)"
        )
