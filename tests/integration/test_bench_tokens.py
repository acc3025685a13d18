"""`python -m bench.tokens`: what a step sends the model, Ratchet's step prompt against a loop
that resends the whole transcript. Its figures come from a real run and the Anthropic adapter's
own request builder, so a change to either shows in them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scripted_agent import ARGUMENT_BYTES, RESULT_BYTES, TOOL_NAME
from bench.tokens import (
    Comparison,
    cacheable_share,
    compare,
    main,
    record_run,
    report,
)
from ratchet.adapters.anthropic_model import AnthropicModel, anthropic_client
from ratchet.engine.prompt import step_prompt_template

DOCS = Path(__file__).resolve().parents[2] / "docs"
STEPS = 60
STEP_BYTES = ARGUMENT_BYTES + RESULT_BYTES
"""What a step of the scripted agent adds to a transcript, before JSON escaping."""


@pytest.fixture(scope="module")
def window_5() -> Comparison:
    return compare(steps=STEPS, window=5)


@pytest.fixture(scope="module")
def window_10() -> Comparison:
    return compare(steps=STEPS, window=10)


def ratchet_bound(comparison: Comparison) -> int:
    """The most Ratchet may send at any step: what it sends at step 1 (no step yet), plus for
    each step of the window, the digest's line and the last result, twice a step's data (its
    arguments and result, JSON-escaped inside the request, with the line's own words)."""
    return comparison.ratchet[0].bytes + (comparison.window + 1) * 2 * STEP_BYTES


def test_the_measured_requests_are_what_the_anthropic_adapter_builds(tmp_path: Path) -> None:
    # Given the bench's dump of step 10's request, beside the adapter's own rendering of the
    # request the engine asked at step 10 of the same run
    main(["--steps", "10", "--window", "3", "--dump", str(tmp_path)])
    recorded = record_run(steps=10, window=3)
    request = recorded.requests[9]
    adapter = AnthropicModel(anthropic_client("not-used"), "claude-sonnet-4-6")

    dumped = json.loads((tmp_path / "ratchet-step-10.json").read_text())

    # Then the bench measured exactly that body: the step prompt is the single user turn,
    # rendered from the template with the window of 3 steps and the digest of the 6 before
    assert dumped == adapter.body(request)
    prompt = dumped["messages"][0]["content"]
    assert prompt == request.prompt
    assert prompt.startswith(step_prompt_template().split("{{", 1)[0])
    assert f"Steps 1-6, summarised:\n- {TOOL_NAME}: 6 calls (steps 1-6)" in prompt
    assert [line.split(".", 1)[0] for line in prompt.splitlines() if " -> " in line] == [
        "7",
        "8",
        "9",
    ]
    # And the transcript loop sends the same tools, then every earlier call and its whole
    # output: 9 steps as 18 messages after the goal
    transcript = json.loads((tmp_path / "transcript-step-10.json").read_text())
    assert transcript["tools"] == dumped["tools"]
    assert len(transcript["messages"]) == 1 + 2 * 9
    outputs = [m["content"][0]["content"] for m in transcript["messages"][2::2]]
    assert outputs == [recorded.outputs[step] for step in range(1, 10)]
    assert {len(output) for output in outputs} == {RESULT_BYTES}


def test_the_window_size_changes_ratchets_figures_and_not_the_transcripts(
    window_5: Comparison, window_10: Comparison
) -> None:
    at_60 = STEPS - 1

    assert window_10.ratchet[at_60].bytes > window_5.ratchet[at_60].bytes
    assert window_10.ratchet[at_60].bytes - window_5.ratchet[at_60].bytes >= 5 * ARGUMENT_BYTES
    assert window_10.transcript == window_5.transcript
    print(
        f"step 60, Ratchet: {window_5.ratchet[at_60].bytes:,} B with a window of 5, "
        f"{window_10.ratchet[at_60].bytes:,} B with 10; transcript "
        f"{window_5.transcript[at_60].bytes:,} B"
    )


@pytest.mark.parametrize("window", [5, 10])
def test_the_transcript_grows_with_the_step_while_ratchet_stays_under_its_windows_bound(
    window: int, window_5: Comparison, window_10: Comparison
) -> None:
    comparison = window_5 if window == 5 else window_10
    bound = ratchet_bound(comparison)
    ratchet = [s.bytes for s in comparison.ratchet]
    transcript = [s.bytes for s in comparison.transcript]

    # Ratchet: bounded at every step, and flat once the window is full
    assert max(ratchet) < bound
    assert max(ratchet[window + 1 :]) - min(ratchet[window + 1 :]) <= 64
    # The transcript: each step adds at least its call and its whole result
    for step in range(1, STEPS):
        assert transcript[step] - transcript[step - 1] >= STEP_BYTES
    assert transcript[STEPS - 1] > ratchet[STEPS - 1]
    assert transcript[STEPS - 1] > bound
    print(
        f"window {window}: Ratchet at step 60 {ratchet[-1]:,} B (bound {bound:,} B), "
        f"transcript {transcript[-1]:,} B"
    )


def test_a_cache_could_serve_most_of_the_transcript_and_the_stable_head_of_ratchets(
    window_5: Comparison,
) -> None:
    assert window_5.ratchet[0].cacheable == window_5.transcript[0].cacheable == 0.0
    # The transcript's previous request is its prefix; Ratchet's window moves every step, so
    # only the tools and the step prompt's head stay the same.
    assert window_5.transcript[STEPS - 1].cacheable > 0.95
    assert 0.0 < window_5.ratchet[STEPS - 1].cacheable < 0.5


def test_the_cacheable_share_is_the_longest_identical_prefix_without_the_markers() -> None:
    tools = [{"name": "t", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]
    before = {"tools": tools, "messages": [{"role": "user", "content": "aaaa"}]}
    unmarked = {"tools": [{"name": "t", "input_schema": {}}], "messages": before["messages"]}
    changed = {"tools": tools, "messages": [{"role": "user", "content": "aabb"}]}

    assert cacheable_share(None, before) == 0.0
    assert cacheable_share(before, unmarked) == 1.0
    assert 0.5 < cacheable_share(before, changed) < 1.0


def test_the_table_prints_the_columns_said_with_totals_over_every_step(
    window_5: Comparison, capsys: pytest.CaptureFixture[str]
) -> None:
    main([])
    printed = capsys.readouterr().out

    # The command's run is the fixture's: the figures do not move between runs
    assert printed.strip() == report(window_5).strip()
    lines = printed.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("step"))
    assert [cell.strip() for cell in header.split("  ") if cell] == [
        "step",
        "Ratchet bytes",
        "Ratchet ~tokens",
        "Ratchet cacheable",
        "transcript bytes",
        "transcript ~tokens",
        "transcript cacheable",
        "transcript/Ratchet",
    ]
    rows = {line.split()[0]: line.split() for line in lines[lines.index(header) + 1 :] if line}
    assert {"10", "30", "60", "1-60"} <= rows.keys()
    total = rows["1-60"]
    assert total[1] == f"{sum(s.bytes for s in window_5.ratchet):,}"
    assert total[2] == f"{sum(s.tokens for s in window_5.ratchet):,}"
    assert total[4] == f"{sum(s.bytes for s in window_5.transcript):,}"
    assert rows["60"][1] == f"{window_5.ratchet[STEPS - 1].bytes:,}"
    assert rows["60"][2] == f"{round(window_5.ratchet[STEPS - 1].bytes / 4):,}"
    ratio = sum(s.bytes for s in window_5.transcript) / sum(s.bytes for s in window_5.ratchet)
    assert total[7] == f"{ratio:.2f}x"
    print(printed)


def test_the_docs_quote_the_bench_as_it_prints(window_5: Comparison) -> None:
    performance = (DOCS / "performance.md").read_text(encoding="utf-8")
    section = performance.split("## What a step sends the model", 1)[1].split("\n## ", 1)[0]
    quoted = section.split("```\n", 2)[1].removesuffix("\n")
    limits = " ".join((DOCS / "limits.md").read_text(encoding="utf-8").split())
    ratio_60 = window_5.transcript[STEPS - 1].bytes / window_5.ratchet[STEPS - 1].bytes
    ratio_run = sum(s.bytes for s in window_5.transcript) / sum(s.bytes for s in window_5.ratchet)

    assert quoted == report(window_5)
    assert f"sends {ratio_60:.2f}x that at step 60 and {ratio_run:.2f}x over 60 steps" in limits
