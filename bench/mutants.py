"""The mutation check: is each guarantee's test able to fail? `make mutants` (`python -m
bench.mutants [NAME ...]`) breaks the guarantee's code on purpose, one committed mutation at a
time, runs the few tests that guard it, and says whether they went red.

Each `mutants/<name>.toml` holds one mutation (the format is in `Mutant`): the guarantee in a
line, a file, the exact text to `find` there (it must occur once), its `replace`ment, and the
`tests` that must kill it. For each mutant, in name order (or only those named):

1. STALE if `find` no longer occurs exactly once, or a named test file (or test) is gone;
2. BASELINE-RED if its tests fail with the code as committed (`--no-baseline` skips this);
3. the mutation is applied in place and `pytest -x -q -p no:cacheprovider -n 0 <tests>` runs
   with a time limit; then the file gets back its original bytes (always: a finally, and
   SIGINT/SIGTERM/SIGHUP end the run through it);
4. KILLED if pytest reports failed tests (exit 1), SURVIVED if they pass (exit 0), TIMEOUT if
   they run out of time, ERROR on any other exit (a collection error, exit 2 or 4, says the
   mutation broke an import or the syntax, which proves nothing about the tests).

It refuses to start while a file it would mutate has uncommitted changes, so that even a
SIGKILL mid-mutation loses no work: `git checkout -- <file>` brings the committed text back.
Exits 1 if any mutant was not killed, 2 on a bad mutant file or a refusal. Not run in CI (each
mutant costs a pytest process or two); `tests/unit/test_mutants.py` checks in CI that every
committed mutant still applies.
"""

from __future__ import annotations

import argparse
import enum
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

ROOT = Path(__file__).resolve().parents[1]
FOLDER = "mutants"
NAME = re.compile(r"^[a-z0-9][a-z0-9-]*$")
DEFAULT_TIMEOUT_SECONDS = 300.0
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-n", "0"]


class MutantFileError(ValueError):
    """A mutant file that cannot be read as one; its message is one line naming the file."""


class Mutant(BaseModel):
    """One committed mutation, `mutants/<name>.toml`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    guarantee: str = Field(min_length=1)
    """The guarantee the mutation breaks, in one line."""
    file: str = Field(min_length=1)
    """The file to mutate, relative to the repository's root."""
    find: str = Field(min_length=1)
    """The exact text to replace; it must occur exactly once in `file`."""
    replace: str
    tests: list[str] = Field(min_length=1)
    """pytest ids or paths, relative to the root: the few fast tests that must go red."""

    @field_validator("guarantee")
    @classmethod
    def _one_line(cls, value: str) -> str:
        if "\n" in value.strip():
            raise ValueError("must be one line")
        return value.strip()

    @field_validator("file")
    @classmethod
    def _relative(cls, value: str) -> str:
        path = Path(value)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError("must be a path inside the repository, from its root")
        return value

    @field_validator("tests")
    @classmethod
    def _test_ids(cls, value: list[str]) -> list[str]:
        for test in value:
            if not test.strip() or test.startswith("-"):
                raise ValueError(f"{test!r} is not a pytest id or path")
        return value

    def mutated(self, text: str) -> str:
        return text.replace(self.find, self.replace, 1)


def load(path: Path) -> Mutant:
    """The mutant in `path`; `MutantFileError` (one line, naming the file) if it is not one."""
    if not NAME.match(path.stem):
        raise MutantFileError(f"{path}: the name must be lowercase letters, digits and dashes")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise MutantFileError(f"{path}: not a readable TOML file: {error}") from None
    try:
        mutant = Mutant.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in e['loc']) or 'file'}: {e['msg']}"
            for e in error.errors()
        )
        raise MutantFileError(f"{path}: {problems}") from None
    if mutant.find == mutant.replace:
        raise MutantFileError(f"{path}: replace is the same text as find")
    return mutant


def load_all(root: Path = ROOT) -> dict[str, Mutant]:
    """Every mutant of `root/mutants`, by name, in name order."""
    return {path.stem: load(path) for path in sorted((root / FOLDER).glob("*.toml"))}


def problems(mutant: Mutant, root: Path = ROOT) -> list[str]:
    """Why `mutant` no longer applies to the code in `root` (empty: it does)."""
    found: list[str] = []
    target = root / mutant.file
    if not target.is_file():
        found.append(f"{mutant.file} does not exist")
    else:
        count = target.read_text(encoding="utf-8").count(mutant.find)
        if count != 1:
            found.append(f"find occurs {count} times in {mutant.file}, not once")
    for test in mutant.tests:
        path, _, rest = test.partition("::")
        if not (root / path).exists():
            found.append(f"test file {path} does not exist")
        elif rest:
            function = re.sub(r"\[.*\]$", "", rest.split("::")[-1])
            source = (root / path).read_text(encoding="utf-8")
            if not re.search(rf"^\s*(async\s+)?def {re.escape(function)}\(", source, re.M):
                found.append(f"{path} has no test {function}")
    return found


class Status(enum.StrEnum):
    KILLED = "KILLED"
    SURVIVED = "SURVIVED"
    STALE = "STALE"
    BASELINE_RED = "BASELINE-RED"
    ERROR = "ERROR"
    TIMEOUT = "TIMEOUT"


@dataclass(frozen=True)
class Verdict:
    name: str
    status: Status
    seconds: float
    detail: str

    def line(self) -> str:
        return f"{self.status:<12} {self.name:<40} {self.seconds:6.1f} s  {self.detail}"


@dataclass(frozen=True)
class PytestRun:
    exit_code: int | None
    """None: the tests ran out of time."""
    output: str

    def collection_failed(self) -> bool:
        """Whether pytest could not even import the tests (exit 2 for paths, 4 for ids)."""
        return "ERROR collecting " in self.output or "during collection" in self.output

    def failed_test(self) -> str:
        """The first test pytest reports failed, or its last line when none is named."""
        for line in self.output.splitlines():
            if line.startswith(("FAILED ", "ERROR ")):
                return line.split(" - ")[0]
        lines = [line for line in self.output.splitlines() if line.strip()]
        return lines[-1] if lines else "(no output)"


def run_tests(root: Path, tests: Sequence[str], timeout: float) -> PytestRun:
    """`tests` in a pytest process of their own, in `root`, killed with its children after
    `timeout` seconds. It writes no bytecode, so no .pyc of mutated code outlives the run."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    with subprocess.Popen(
        [sys.executable, *PYTEST, *tests],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, so a timeout ends its children too
    ) as process:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            return PytestRun(None, process.communicate()[0])
        except BaseException:
            _kill_group(process)
            raise
        return PytestRun(process.returncode, output)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A signal asked the runner to stop; raised where it was, so every finally runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_raise() -> Iterator[None]:
    def stop(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(signum)

    before = {signum: signal.signal(signum, stop) for signum in STOPS}
    try:
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@contextmanager
def applied(mutant: Mutant, root: Path) -> Iterator[None]:
    """`mutant` written into its file, and the original bytes (and times) put back after,
    whatever happens inside."""
    target = root / mutant.file
    original = target.read_bytes()
    times = target.stat()
    try:
        target.write_text(mutant.mutated(original.decode("utf-8")), encoding="utf-8")
        yield
    finally:
        # A second signal must not cut the restore short: it waits until the bytes are back.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
        try:
            target.write_bytes(original)
            os.utime(target, ns=(times.st_atime_ns, times.st_mtime_ns))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def uncommitted(root: Path, files: Sequence[str]) -> list[str]:
    """Those of `files` that git does not hold as committed (changed, staged or untracked)."""
    if not files:
        return []  # no pathspec would mean the whole tree
    listed = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all", "--", *sorted(set(files))],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if listed.returncode != 0:
        raise MutantFileError(f"{root}: git cannot say what is committed: {listed.stderr.strip()}")
    return [line[3:] for line in listed.stdout.splitlines()]


def check(
    name: str,
    mutant: Mutant,
    *,
    root: Path,
    timeout: float,
    baseline: bool,
    baselines: dict[tuple[str, ...], PytestRun],
) -> Verdict:
    """One mutant's verdict. `baselines` caches the unmutated runs of each set of tests."""
    started = time.monotonic()

    def verdict(status: Status, detail: str) -> Verdict:
        return Verdict(name, status, time.monotonic() - started, detail)

    stale = problems(mutant, root)
    if stale:
        return verdict(Status.STALE, "; ".join(stale))
    if baseline:
        key = tuple(mutant.tests)
        if key not in baselines:
            baselines[key] = run_tests(root, mutant.tests, timeout)
        unmutated = baselines[key]
        if unmutated.exit_code != 0:
            why = "timed out" if unmutated.exit_code is None else unmutated.failed_test()
            return verdict(Status.BASELINE_RED, f"unmutated: {why}")
    with applied(mutant, root):
        run = run_tests(root, mutant.tests, timeout)
    match run.exit_code:
        case 1 if not run.collection_failed():
            return verdict(Status.KILLED, run.failed_test())
        case 0:
            return verdict(Status.SURVIVED, mutant.guarantee)
        case None:
            return verdict(Status.TIMEOUT, f"tests still running after {timeout:g} s")
        case code if run.collection_failed():
            return verdict(
                Status.ERROR, f"collection error (broken import?), exit {code}: {run.failed_test()}"
            )
        case code:
            return verdict(Status.ERROR, f"pytest exit {code}: {run.failed_test()}")


def summary(verdicts: Sequence[Verdict], day: str) -> str:
    counts = {status: sum(v.status is status for v in verdicts) for status in Status}
    errors = counts[Status.ERROR] + counts[Status.TIMEOUT] + counts[Status.BASELINE_RED]
    return (
        f"mutants: {counts[Status.KILLED]} killed, {counts[Status.SURVIVED]} survived, "
        f"{counts[Status.STALE]} stale, {errors} errors ({day})"
    )


def _say(line: str) -> None:
    print(line, flush=True)  # a line as each mutant ends, even into a pipe


def main(argv: Sequence[str] | None = None, *, out: Callable[[str], None] = _say) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="Mutants to run (default: every one).")
    parser.add_argument(
        "--no-baseline", action="store_true", help="Skip running each mutant's tests unmutated."
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        help=f"Seconds one pytest run may take (default {DEFAULT_TIMEOUT_SECONDS:g}).",
    )
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    root: Path = options.root.resolve()
    try:
        mutants = load_all(root)
    except MutantFileError as error:
        print(f"mutants: {error}", file=sys.stderr)
        return 2
    unknown = [name for name in options.names if name not in mutants]
    if unknown:
        print(f"mutants: no mutant named {', '.join(unknown)} in {root / FOLDER}", file=sys.stderr)
        return 2
    chosen = {n: m for n, m in mutants.items() if not options.names or n in options.names}
    try:
        dirty = uncommitted(root, [m.file for m in chosen.values()])
    except MutantFileError as error:
        print(f"mutants: {error}", file=sys.stderr)
        return 2
    if dirty:
        print(
            f"mutants: refusing to start: uncommitted changes in {', '.join(dirty)} (commit "
            "them first, so that no mutation can ever be left in place of your work)",
            file=sys.stderr,
        )
        return 2
    verdicts: list[Verdict] = []
    baselines: dict[tuple[str, ...], PytestRun] = {}
    try:
        with _signals_raise():
            for name, mutant in chosen.items():
                verdicts.append(
                    check(
                        name,
                        mutant,
                        root=root,
                        timeout=options.timeout,
                        baseline=not options.no_baseline,
                        baselines=baselines,
                    )
                )
                out(verdicts[-1].line())
    except (Interrupted, KeyboardInterrupt) as stop:
        signum = stop.signum if isinstance(stop, Interrupted) else signal.SIGINT
        name = signal.Signals(signum).name
        print(f"mutants: interrupted ({name}), files restored", file=sys.stderr)
        return 128 + signum
    out(summary(verdicts, datetime.now(UTC).date().isoformat()))
    return 0 if all(v.status is Status.KILLED for v in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
