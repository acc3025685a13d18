"""A reader who follows the README in the clone (issue 36) leaves the project's checks as they
were: their agent module and their store are theirs, not the lint's or the sdist's."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
UV = REPO_ROOT / ".tools" / "bin" / "uv"
RUFF = Path(sys.executable).with_name("ruff")
README_MODULE = re.compile(r"^```python\n(# my_agents\.py\n.*?)^```$", re.MULTILINE | re.DOTALL)


def a_clone_after_the_readme(tmp_path: Path) -> Path:
    """The project's tracked files, and what the README's "Your first agent" makes in
    the clone: `my_agents.py`, as printed, and a store."""
    clone = tmp_path / "clone"
    tracked = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, tracked.split("\0")):
        source = REPO_ROOT / name
        if source.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, clone / name)
    found = README_MODULE.search((REPO_ROOT / "README.md").read_text(encoding="utf-8"))
    assert found is not None, "the README's my_agents.py block is gone"
    (clone / "my_agents.py").write_text(found[1], encoding="utf-8")
    (clone / "runs.db").write_bytes(b"SQLite format 3\0")
    return clone


def test_the_readers_agent_module_and_store_stay_out_of_the_lint_and_the_sdist(tmp_path):
    clone = a_clone_after_the_readme(tmp_path)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}

    linted = subprocess.run(
        [str(RUFF), "check", "."], cwd=clone, capture_output=True, text=True, env=env, check=False
    )
    built = subprocess.run(
        [str(UV), "build", "--quiet", "--sdist", "--out-dir", str(tmp_path / "dist"), "."],
        cwd=clone,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )

    assert linted.returncode == 0, linted.stdout
    assert built.returncode == 0, built.stderr
    [sdist] = (tmp_path / "dist").glob("*.tar.gz")
    with tarfile.open(sdist) as packed:
        names = {name.split("/", 1)[-1] for name in packed.getnames()}
    assert "my_agents.py" not in names
    assert "runs.db" not in names
    assert "src/ratchet/tools.py" in names
    assert "README.md" in names
