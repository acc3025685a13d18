"""`python -m bench.mutants` on a tiny project of its own (a module, its tests, a mutant of each
kind, in a git repository), so the runner's verdicts are proven, and so is its promise to put
every file back."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATIENCE = 60.0
# The runner's pytest processes load only the plugin its flags need (`-n 0`): a second to start
# instead of several with every plugin of this environment.
FAST_PYTEST = {
    **os.environ,
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTEST_PLUGINS": "xdist.plugin",
}

CALC = """\
def add(a, b):
    return a + b


def double(a):
    return a * 2


def wait():
    return None
"""

TESTS = """\
from calc import add, double, wait


def test_add():
    assert add(2, 3) == 5


def test_double_of_zero():
    assert double(0) == 0


def test_wait():
    wait()


def test_known_red():
    assert add(1, 1) == 3
"""

HANG = "    import pathlib, time\\n    pathlib.Path('hanging').touch()\\n    time.sleep(120)\\n"

MUTANTS = {
    "adds": ("return a + b", "return a - b", "tests/test_calc.py::test_add"),
    "doubles": ("return a * 2", "return a * 3", "tests/test_calc.py::test_double_of_zero"),
    "gone": ("return a / b", "return a // b", "tests/test_calc.py::test_add"),
    "breaks-import": ("def wait():", "def wait(:", "tests/test_calc.py::test_wait"),
    "hangs": ("    return None\\n", HANG, "tests/test_calc.py::test_wait"),
    "red-already": ("return a + b", "return b + a", "tests/test_calc.py::test_known_red"),
    "missing-test": ("return a * 2", "return a + a", "tests/test_calc.py::test_gone"),
}


def _git(project: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=project, check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "calc.py").write_text(CALC)
    (tmp_path / "tests" / "test_calc.py").write_text(TESTS)
    (tmp_path / "pyproject.toml").write_text('[tool.pytest.ini_options]\npythonpath = ["."]\n')
    (tmp_path / "mutants").mkdir()
    for name, (find, replace, test) in MUTANTS.items():
        (tmp_path / "mutants" / f"{name}.toml").write_text(
            f'guarantee = "{name}"\nfile = "calc.py"\nfind = "{find}"\n'
            f'replace = "{replace}"\ntests = ["{test}"]\n'
        )
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "calc")
    return tmp_path


def _runner(project: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.mutants", "--root", str(project), *args],
        cwd=ROOT,
        env=FAST_PYTEST,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _run(project: Path, *args: str) -> tuple[int, str, str]:
    with _runner(project, *args) as process:
        out, err = process.communicate(timeout=PATIENCE)
    return process.returncode, out, err


def _verdicts(out: str) -> dict[str, str]:
    return {
        line.split()[1]: line.split()[0] for line in out.splitlines() if line.split()[0].isupper()
    }


@pytest.mark.slow
def test_each_kind_of_mutant_gets_its_verdict_and_every_file_is_put_back(project):
    calc = (project / "calc.py").read_bytes()
    mtime = (project / "calc.py").stat().st_mtime_ns

    names = sorted(set(MUTANTS) - {"hangs"})
    code, out, err = _run(project, *names)

    assert _verdicts(out) == {
        "adds": "KILLED",
        "breaks-import": "ERROR",
        "doubles": "SURVIVED",
        "gone": "STALE",
        "missing-test": "STALE",
        "red-already": "BASELINE-RED",
    }, out + err
    summary = out.splitlines()[-1]
    assert summary.startswith("mutants: 1 killed, 1 survived, 2 stale, 2 errors (20"), summary
    assert code == 1
    assert "collection error (broken import?)" in out, out
    assert "test_calc.py has no test test_gone" in out
    assert (project / "calc.py").read_bytes() == calc
    assert (project / "calc.py").stat().st_mtime_ns == mtime
    assert _git(project, "status", "--porcelain") == ""


@pytest.mark.slow
def test_a_mutant_whose_tests_hang_times_out_and_its_file_is_put_back(project):
    calc = (project / "calc.py").read_bytes()

    # Long enough for pytest to start on a busy machine, short enough to keep the test quick.
    code, out, _ = _run(project, "hangs", "--no-baseline", "--timeout", "6")

    assert _verdicts(out) == {"hangs": "TIMEOUT"}
    assert "tests still running after 6 s" in out
    assert out.splitlines()[-1].startswith("mutants: 0 killed, 0 survived, 0 stale, 1 errors")
    assert code == 1
    assert (project / "hanging").exists(), "the mutated code did run"
    assert (project / "calc.py").read_bytes() == calc


@pytest.mark.slow
def test_only_the_named_mutants_run_and_all_killed_exits_zero(project):
    code, out, _ = _run(project, "adds", "--no-baseline")

    assert code == 0
    assert _verdicts(out) == {"adds": "KILLED"}
    assert out.splitlines()[-1].startswith("mutants: 1 killed, 0 survived, 0 stale, 0 errors")


@pytest.mark.slow
def test_it_refuses_to_start_on_uncommitted_changes_or_unknown_names(project):
    (project / "calc.py").write_text(CALC + "\n# work in progress\n")

    dirty = _run(project, "adds")
    unknown = _run(project, "no-such-mutant")

    assert dirty[0] == 2
    assert "refusing to start: uncommitted changes in calc.py" in dirty[2]
    assert dirty[1] == ""
    assert (project / "calc.py").read_text().endswith("# work in progress\n")
    assert unknown[0] == 2
    assert "no mutant named no-such-mutant" in unknown[2]


@pytest.mark.slow
def test_a_bad_mutant_file_is_named_in_one_line_and_nothing_runs(project):
    (project / "mutants" / "adds.toml").write_text('guarantee = "g"\n')
    _git(project, "add", ".")

    code, out, err = _run(project)

    assert code == 2
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"mutants: {project / 'mutants' / 'adds.toml'}: ")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_runner_stopped_mid_mutant_puts_the_file_back(project, signum):
    calc = (project / "calc.py").read_bytes()

    with _runner(project, "hangs", "--no-baseline") as process:
        # Given the runner's pytest hanging inside the mutated code
        deadline = time.monotonic() + PATIENCE
        while not (project / "hanging").exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the mutated test never started"
            time.sleep(0.05)
        assert (project / "calc.py").read_bytes() != calc

        # When it is asked to stop
        os.kill(process.pid, signum)
        _, err = process.communicate(timeout=PATIENCE)

    # Then it put the file back and says so
    assert process.returncode == 128 + signum
    assert f"interrupted ({signal.Signals(signum).name}), files restored" in err
    assert (project / "calc.py").read_bytes() == calc
