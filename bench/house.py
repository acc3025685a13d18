"""How much of the house a newcomer walks through: the figures issue 15 asks for, before and after.

    python -m bench.house

- one local step: the package's files (and their lines) whose code runs while a worker takes one
  step of a scripted run, from claiming it to committing the checkpoint;
- the largest files and functions of the package, and its top-level modules;
- head reads (`load_head`), approval reads, HMAC checks and answer validations for one click on
  the approval page, and head reads for one `Client.run` of a new run.
"""

from __future__ import annotations

import ast
import contextlib
import logging
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType
from typing import Any
from urllib.parse import urlsplit

import ratchet

PACKAGE = Path(ratchet.__file__).parent
LOG = logging.getLogger("bench.house")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines())


@contextlib.contextmanager
def _code_run() -> Iterator[set[CodeType]]:
    """The package's functions (code objects) that run inside the block."""
    seen: set[CodeType] = set()
    root = str(PACKAGE)

    def profile(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add(frame.f_code)

    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(None)


def _function_lines(code: CodeType) -> int:
    """A function's lines, from its `def` to its last line of code."""
    last = max((line for _, _, line in code.co_lines() if line is not None), default=0)
    return max(last, code.co_firstlineno) - code.co_firstlineno + 1


@contextlib.contextmanager
def _counting(counts: Counter[str], **targets: tuple[type, str]) -> Iterator[None]:
    """Count calls of each `cls.method` in `targets` (by label) inside the block."""
    originals: list[tuple[type, str, Callable[..., Any]]] = []
    for label, (cls, name) in targets.items():
        original = getattr(cls, name)
        originals.append((cls, name, original))

        def counted(*args: Any, _o: Any = original, _l: str = label, **kwargs: Any) -> Any:
            counts[_l] += 1
            return _o(*args, **kwargs)

        setattr(cls, name, counted)
    try:
        yield
    finally:
        for cls, name, original in originals:
            setattr(cls, name, original)


def _largest_functions(count: int) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append((size, f"{path.relative_to(PACKAGE.parent)}:{node.name}"))
    return sorted(found, reverse=True)[:count]


def main() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    total = sum(_lines(p) for p in files)
    print(f"package: {len(files)} files, {total} lines")
    top = [p for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").exists()]
    print(f"top-level modules and packages: {len(top)}")
    print("largest files:")
    for path in sorted(files, key=_lines, reverse=True)[:5]:
        print(f"  {_lines(path):>5}  {path.relative_to(PACKAGE.parent)}")
    print("largest functions:")
    for size, name in _largest_functions(5):
        print(f"  {size:>5}  {name}")
    with tempfile.TemporaryDirectory(prefix="ratchet-house-") as tmp:
        _one_step(Path(tmp))
        _one_click(Path(tmp))


def _one_step(tmp: Path) -> None:
    from bench.scripted_agent import AGENT_REFERENCE
    from ratchet.adapters.sqlite.store import SqliteCheckpointStore
    from ratchet.runtime.local import LocalRuntime, LocalSettings
    from ratchet.worker import Worker

    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp}/step.db"))
    client = ratchet.connect(f"sqlite:///{tmp}/step.db", environ={})
    try:
        counts: Counter[str] = Counter()
        with _counting(counts, head=(SqliteCheckpointStore, "load_head")):
            client.run(run_id="warm", agent=AGENT_REFERENCE, input={"steps": 1}, max_steps=3)
        print(f"Client.run of a new run (one tool call, then done): {counts['head']} head reads")
        client.start(run_id="traced", agent=AGENT_REFERENCE, input={"steps": 1}, max_steps=3)
        worker = Worker(runtime.engine(worker_id="bench", logger=LOG), runtime.leases, LOG)
        with _code_run() as codes:
            worker.run(until_idle=True, run_id="traced")
        seen = {Path(code.co_filename) for code in codes}
        functions = [c for c in codes if not c.co_name.startswith("<")]
        lines = sum(_lines(p) for p in seen)
        body = sum(_function_lines(c) for c in functions)
        print(f"a worker taking a run's steps runs code in {len(seen)} files, {lines} lines;")
        print(f"  the {len(functions)} functions it runs are {body} lines:")
        for path in sorted(seen):
            mine = [c for c in functions if Path(c.co_filename) == path]
            print(
                f"  {_lines(path):>5}  {path.relative_to(PACKAGE.parent)}"
                f"  ({len(mine)} functions, {sum(_function_lines(c) for c in mine)} lines)"
            )
    finally:
        client.close()
        runtime.close()


def _one_click(tmp: Path) -> None:
    from werkzeug.test import Client as HttpClient

    from ratchet.adapters.sqlite.approvals import SqliteApprovalBook
    from ratchet.adapters.sqlite.store import SqliteCheckpointStore
    from ratchet.approvals import answers
    from ratchet.approvals.links import LinkSigner
    from ratchet.runtime.local import LocalRuntime, LocalSettings
    from ratchet.state import RunOptions, RunState
    from ratchet.web.approvals import ApprovalServices, build_app
    from ratchet.web.serve import wsgi_app
    from ratchet.worker import Worker
    from tests.fixtures import refund_agent

    runtime = LocalRuntime.open(LocalSettings(store=f"sqlite:///{tmp}/click.db"))
    try:
        desk = runtime.approval_desk(worker_id="serve", logger=LOG)
        services = ApprovalServices(desk=desk)
        app = build_app(lambda: services)
        http = HttpClient(wsgi_app([("/approvals/", app)]))
        agent = f"{refund_agent.__name__}:agent"
        state = RunState(
            run_id="clicked",
            agent=agent,
            goal=refund_agent.agent.goal,
            options=RunOptions(model="scripted"),
        )
        engine = runtime.engine(worker_id="worker", logger=LOG)
        engine.start(state)
        Worker(engine, runtime.leases, LOG).run(until_idle=True, run_id="clicked")
        opened = desk.open("clicked", timeout_seconds=3600, operator="alice")
        link = urlsplit(desk.link(opened.approval, "alice"))
        counts: Counter[str] = Counter()
        with _counting(
            counts,
            head=(SqliteCheckpointStore, "load_head"),
            approval=(SqliteApprovalBook, "get"),
            hmac=(LinkSigner, "verify"),
        ):
            checked = answers.check_answer
            calls = Counter[str]()

            def counted(*args: Any, **kwargs: Any) -> Any:
                calls["answer"] += 1
                return checked(*args, **kwargs)

            answers.check_answer = counted
            try:
                response = http.post(
                    f"{link.path}?{link.query}",
                    data="decision=approve&answer.amount=5&answer.reason=%22damaged%22",
                    content_type="application/x-www-form-urlencoded",
                )
            finally:
                answers.check_answer = checked
        if response.status_code != 200:
            raise SystemExit(f"the click was refused: {response.get_data(as_text=True)[:2000]}")
        print(
            f"one click on the approval page (HTTP {response.status_code}): "
            f"{counts['head']} head reads, {counts['approval']} approval reads, "
            f"{counts['hmac']} HMAC checks, {calls['answer']} answer validations"
        )
    finally:
        runtime.close()


if __name__ == "__main__":
    main()
