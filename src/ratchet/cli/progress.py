"""What `ratchet run`, `ratchet worker` and `ratchet watch` print as a run moves: one line per
step (run, step, tool, an argument summary, a result preview, milliseconds), and one as it
ends. A run that ends done, stopped or cancelled ends after its last step, so that line names
no step (`r1  done -> ...`); a failed run ends at the step that failed, the one after the last
committed (`r1  step 2  failed -> ...`), the step `ratchet status` names.

The functions here are pure: a run's head after a committed step, or a history row, becomes a
`StepLine`; a `StepLine` becomes a plain line (`plain_line`) or a JSON object (`json_object`).
`ProgressPrinter` picks the form: a rich live display on a terminal, plain lines when stdout is
piped, JSON lines with `--json`.

Where a run's length is known, the line carries `done/total`, and a terminal shows a bar. The
rule, the same for every agent:

- params with `steps` (an int): the total is `steps`, the position the step number;
- params with `batches` (an int): the total is `batches`, the position the highest `batch`
  argument a step has passed so far (the migration's `copy_batch(batch=N)`), among the steps
  shown and the run's recent steps (its memory window).

Otherwise there is no bar, only the lines.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, TextIO

from ratchet.summary import argument_summary, shorten
from ratchet.untrusted import for_terminal, json_for_terminal

if TYPE_CHECKING:
    from ratchet.client import Checkpoint
    from ratchet.state import RunState

RESULT_CHARS = 80
ENDED_AFTER_A_STEP = frozenset({"done", "stopped", "cancelled"})
"""The ends that are no step of their own: the line says how the run ended, not a step."""


@dataclass(frozen=True)
class StepLine:
    """One step of a run (or its end), as progress output shows it."""

    run_id: str
    step: int
    status: str
    tool: str | None
    arguments: str
    """`name=value` pairs, cut to `ARGUMENTS_CHARS`."""
    result: str
    """The tool's result (or the run's summary or error when it ended), one line, cut."""
    ms: float | None
    done: int | None = None
    total: int | None = None


def known_total(params: Mapping[str, Any]) -> tuple[str, int] | None:
    """Which param gives the run's length (`steps` or `batches`) and its value, if any."""
    for name in ("steps", "batches"):
        value = params.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return name, value
    return None


def position(
    params: Mapping[str, Any], step: int, arguments: Mapping[str, Any] | None, before: int
) -> tuple[int, int] | None:
    """`(done, total)` after a step with `arguments`, `before` being the position so far."""
    known = known_total(params)
    if known is None:
        return None
    name, total = known
    if name == "steps":
        return min(step, total), total
    batch = (arguments or {}).get("batch")
    done = max(before, batch if isinstance(batch, int) and not isinstance(batch, bool) else 0)
    return min(done, total), total


def line_of_state(state: RunState, *, ms: float | None, before: int = 0) -> StepLine:
    """The line for the step a head just committed (or for the run's end)."""
    message = state.messages[-1] if state.messages else None
    output = state.tool_results[-1] if state.tool_results else None
    own = message is not None and message.step == state.step
    arguments = message.arguments if own and message is not None else None
    if state.is_finished:
        result = state.summary or state.error or ""
        tool = None
    else:
        tool = message.tool if own and message is not None else None
        result = output.text if output is not None and output.step == state.step else ""
        if state.waiting is not None:
            prompt = state.waiting.request.prompt
            # "waiting for a person: Drop ...", "waiting for the event 'x' until ...",
            # "sleeping until ...".
            result = (
                f"waiting for a person: {prompt}"
                if state.waiting.kind == "person"
                else prompt[:1].lower() + prompt[1:]
            )
    # The recent steps' arguments too: a worker that takes over a run mid-way starts from 0.
    params = state.options.params
    for recent in state.messages:
        seen = position(params, recent.step, recent.arguments, before)
        before = seen[0] if seen else before
    where = position(params, state.step, arguments, before)
    return StepLine(
        run_id=state.run_id,
        step=state.next_step if state.status.value == "failed" else state.step,
        status=state.status.value,
        tool=tool,
        arguments=argument_summary(arguments) if tool else "",
        result=shorten(result, RESULT_CHARS),
        ms=ms,
        done=where[0] if where else None,
        total=where[1] if where else None,
    )


def line_of_checkpoint(
    run_id: str, checkpoint: Checkpoint, params: Mapping[str, Any], before: int = 0
) -> StepLine:
    """The line `ratchet watch` prints for one checkpoint of the run's history."""
    where = position(params, checkpoint.step, checkpoint.arguments, before)
    result = checkpoint.result if checkpoint.event == "step" else checkpoint.explanation
    # A failed attempt, or the failure that ends the run, is at the step after the last
    # committed one, which its record is filed under.
    attempted = checkpoint.event == "attempt_failed" or (
        checkpoint.status.value == "failed" and checkpoint.event == "finished"
    )
    return StepLine(
        run_id=run_id,
        step=checkpoint.step + 1 if attempted else checkpoint.step,
        status=checkpoint.status.value,
        tool=checkpoint.tool,
        arguments=argument_summary(checkpoint.arguments) if checkpoint.tool else "",
        result=shorten(result or "", RESULT_CHARS),
        ms=checkpoint.duration_ms,
        done=where[0] if where else None,
        total=where[1] if where else None,
    )


def plain_line(line: StepLine) -> str:
    """`r1  step 3  copy_batch(batch=2) -> Copied batch 2 ...  12 ms  [2/40]`; a run's end
    after its last step without a step: `r1  done -> Copied 2,000 rows ...  3 ms`."""
    what = f"{line.tool}({line.arguments})" if line.tool else line.status
    ended = line.tool is None and line.status in ENDED_AFTER_A_STEP
    parts = [line.run_id, what] if ended else [line.run_id, f"step {line.step}", what]
    if line.result:
        parts[-1] += f" -> {line.result}"
    if line.ms is not None:
        parts.append(f"{line.ms:.0f} ms")
    if line.total is not None:
        parts.append(f"[{line.done}/{line.total}]")
    return for_terminal("  ".join(parts))


def json_object(line: StepLine) -> dict[str, Any]:
    """The `--json` form: every field of the line, `ms` rounded to a tenth."""
    payload = asdict(line)
    if line.ms is not None:
        payload["ms"] = round(line.ms, 1)
    return payload


class ProgressPrinter:
    """Prints step lines to stdout: JSON lines (`as_json`), plain lines when stdout is not a
    terminal or `live` is False (log lines share the terminal), else a rich live display with
    a bar where the run's length is known. Use it as a context manager around the work."""

    def __init__(
        self, *, as_json: bool = False, stream: TextIO | None = None, live: bool = True
    ) -> None:
        self.stream = stream or sys.stdout
        self.as_json = as_json
        self.live = live and not as_json and self.stream.isatty()
        self.positions: dict[str, int] = {}
        self._progress: Any = None
        self._tasks: dict[str, Any] = {}

    def __enter__(self) -> ProgressPrinter:
        if self.live:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

            self._progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                console=Console(file=self.stream, highlight=False, soft_wrap=True, emoji=False),
                transient=True,
            )
            self._progress.start()
        return self

    def __exit__(self, *_: object) -> None:
        if self._progress is not None:
            self._progress.stop()

    def before(self, run_id: str) -> int:
        return self.positions.get(run_id, 0)

    def show(self, line: StepLine) -> None:
        if line.done is not None:
            self.positions[line.run_id] = line.done
        if self.as_json:
            self.stream.write(_json_line(json_object(line)))
            self.stream.flush()
            return
        if self._progress is None:
            self.stream.write(plain_line(line) + "\n")
            self.stream.flush()
            return
        if line.total is not None:
            # The bar moves first, and is drawn again then: printing the line redraws the bar
            # as last drawn, which without this would count the step before until the next
            # tick of rich's refresh (a whole step behind, at a step every few milliseconds).
            task = self._tasks.get(line.run_id)
            if task is None:
                task = self._progress.add_task(line.run_id, total=line.total)
                self._tasks[line.run_id] = task
            self._progress.update(task, completed=line.done, refresh=True)
        self._progress.console.print(plain_line(line), markup=False)

    def say(self, text: str) -> None:
        """A line that is not a step (a lease waited for), in the same output."""
        if self.as_json:
            self.stream.write(_json_line({"note": text}))
        elif self._progress is not None:
            self._progress.console.print(for_terminal(text), markup=False)
            return
        else:
            self.stream.write(for_terminal(text) + "\n")
        self.stream.flush()


def _json_line(payload: dict[str, Any]) -> str:
    return json_for_terminal(json.dumps(payload, ensure_ascii=False)) + "\n"


class _Notices(logging.Handler):
    """Hands a log record's `notice` (a sentence for a person) to `say`."""

    def __init__(self, say: Callable[[str], None]) -> None:
        super().__init__(logging.WARNING)
        self._say = say

    def emit(self, record: logging.LogRecord) -> None:
        notice = getattr(record, "notice", None)
        if isinstance(notice, str):
            self._say(notice)


@contextmanager
def model_retries_said(printer: ProgressPrinter) -> Iterator[None]:
    """While it lasts, each retry of a model call (`ratchet.adapters.anthropic_model`) is a
    line among the step lines: a call retrying for a minute is never a blank screen."""
    retries = logging.getLogger("ratchet.model")
    handler = _Notices(printer.say)
    retries.addHandler(handler)
    try:
        yield
    finally:
        retries.removeHandler(handler)
