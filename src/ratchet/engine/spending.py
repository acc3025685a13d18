"""A run's budget, held before every model call: reserve the most the call can cost, settle to
what it used.

A step's attempt reserves, before its first model call, the most its model calls can cost: for
each call, its whole `max_tokens` of output and a bound on its input, at the model's prices.
The reservation is its own conditional commit (a `Reserved` checkpoint), made after the attempt
is counted and before the model is called, so a process that dies in the call leaves it on the
run. The step's commit (or its failed attempt's, or the run's end) settles it to what the calls
used; one that never settles, because its process died or its call's usage is unknown, counts
in full: the next reservation, or the next settling, adds it to the spending. So whatever
crashes, a call is made only if what is spent plus what it may cost fits in the budget, and
what it did cost is never more than was reserved for it: no run spends past its budget.

The input bound: a token of the model's input covers at least one byte of its UTF-8 text (the
tokenizers are byte-level), so the call's input is at most the bytes of what is sent (the
prompt, the agent's instructions, the tools' names, descriptions and JSON schemas) plus
`FRAMING_TOKENS` for what the provider adds around them (its tool-use system prompt, the
message framing). It is priced at the dearer of the input and the cache-write rate, since the
adapter may write all of it to the prompt cache.

When the next attempt would not fit, it makes no call: the run waits for a person to raise the
budget (`BudgetAsked`), through the same approvals as `ask_person`.

An agent's daily budget (`Agent.max_cost_usd_per_day`) is held the same way, on a counter
every run and worker of the agent shares (`ratchet.ports.DailySpend`, one per agent and UTC
day): the attempt's bound is added to the day's counter, on the condition that it stays within
the day's budget, before the run's `Reserved` record is written (so the record never names a
hold the counter lacks), and the step's commit is followed by settling it to what the calls
used. A process that dies between the two leaves the bound counted in full. When the day's
counter has no room, the run makes no call and waits for the next UTC day (`day_wait`), or
until a person raises the day's budget, which wakes it.

Pure: the engine passes in the run, its agent and the prices.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, time, timedelta

from ratchet.engine import memory
from ratchet.engine.prompt import render_summary_prompt, step_prompt, view_of
from ratchet.model_names import SCRIPTED
from ratchet.pricing import Prices, prices_for
from ratchet.state import (
    MAX_SUMMARY_CHARS,
    ApprovalRequest,
    Budget,
    RunState,
    TimerWait,
    Usage,
)
from ratchet.tools import Agent, RaiseBudget, RaiseTokens

FRAMING_TOKENS = 1024
"""Tokens a provider may add to a call's input beyond the text it is sent: Anthropic's tool-use
system prompt (346 tokens for Claude 4 models with `auto` tool choice) and the message and
tool-definition framing, with room to spare."""


FREE = Prices(input=0, output=0, cache_write=0, cache_read=0)
"""A scripted policy's price: it runs in the worker and bills nobody."""


def price_of(model: str) -> Prices | None:
    """The prices a budget holds `model`'s calls to: a scripted policy's are nothing, any
    other's are Ratchet's (`ratchet.pricing`; None: none known, and a dollar bound cannot
    hold it, which a start refuses)."""
    return FREE if model == SCRIPTED else prices_for(model)


@dataclass(frozen=True)
class Cost:
    """The most some model calls can cost: dollars (None: the model has no price) and tokens."""

    usd: float | None
    tokens: int


def call_bound(
    prompt: str, instructions: str, tools: Sequence[Mapping[str, object]], max_tokens: int
) -> tuple[int, int]:
    """The most input and output tokens one call can be billed for (see the module's note)."""
    sent = prompt.encode("utf-8") + instructions.encode("utf-8")
    schemas = json.dumps(list(tools), ensure_ascii=False, separators=(",", ":"))
    input_tokens = len(sent) + len(schemas.encode("utf-8")) + FRAMING_TOKENS
    return input_tokens, max_tokens


def attempt_bound(state: RunState, agent: Agent, prices: Prices | None, *, decides: bool) -> Cost:
    """The most the next attempt's model calls can cost: its decision (when `decides`: no
    decision is recorded for the step) and its summary of the window (when one is due)."""
    calls: list[tuple[int, int]] = []
    if decides:
        _, prompt = step_prompt(state)
        specs = [spec.model_dump() for spec in memory.tool_specs(agent)]
        calls.append(call_bound(prompt, agent.instructions, specs, agent.max_tokens))
    through = memory.summarise_through(state)
    if through is not None:
        view = view_of(state).model_copy(update={"task": "summarise", "summarise_through": through})
        prompt = render_summary_prompt(view, limit=MAX_SUMMARY_CHARS)
        calls.append(call_bound(prompt, agent.instructions, [], agent.max_tokens))
    tokens = sum(i + o for i, o in calls)
    if prices is None:
        return Cost(None, tokens)
    input_rate = max(prices.input, prices.cache_write_rate)
    usd = sum(i * input_rate + o * prices.output for i, o in calls) / 1_000_000
    return Cost(round(usd, 6), tokens)


def used(usage: Usage, prices: Prices | None) -> Cost:
    """What a call's recorded usage cost."""
    usd = None if prices is None else prices.cost(usage.model_dump())
    return Cost(usd, usage.prompt_tokens + usage.output_tokens)


def fits(budget: Budget, cost: Cost) -> bool:
    """Whether `cost` fits in what is left of `budget`, counting a reservation still open (an
    attempt whose process died: it settles in full when the next one is made)."""
    if budget.usd is not None:
        if cost.usd is None:
            return False  # a dollar bound and no price: nothing can be shown to fit
        if budget.spent_usd + budget.reserved_usd + cost.usd > budget.usd + 1e-9:
            return False
    if budget.tokens is not None:
        return budget.spent_tokens + budget.reserved_tokens + cost.tokens <= budget.tokens
    return True


def reserved(budget: Budget, cost: Cost) -> Budget:
    """`budget` once `cost` is reserved: a reservation still open is counted in full first."""
    charged = charge_open(budget)
    return charged.model_copy(
        update={"reserved_usd": cost.usd or 0.0, "reserved_tokens": cost.tokens}
    )


def charge_open(budget: Budget) -> Budget:
    """An open reservation counted in full: its calls' usage will never be known."""
    return budget.model_copy(
        update={
            "spent_usd": round(budget.spent_usd + budget.reserved_usd, 6),
            "spent_tokens": budget.spent_tokens + budget.reserved_tokens,
            "reserved_usd": 0.0,
            "reserved_tokens": 0,
        }
    )


def settled(budget: Budget, cost: Cost | None) -> Budget:
    """`budget` once the open reservation settles to `cost`, what the attempt's calls used
    (None: unknown, so the reservation counts in full)."""
    if cost is None:
        return charge_open(budget)
    return budget.model_copy(
        update={
            "spent_usd": round(budget.spent_usd + (cost.usd or 0.0), 6),
            "spent_tokens": budget.spent_tokens + cost.tokens,
            "reserved_usd": 0.0,
            "reserved_tokens": 0,
        }
    )


def raised(budget: Budget, answer: Mapping[str, object] | None) -> Budget:
    """`budget` raised by a person's answer (`RaiseBudget`, `RaiseTokens`)."""
    answer = answer or {}
    update: dict[str, object] = {}
    usd, tokens = answer.get("raise_usd"), answer.get("raise_tokens")
    if isinstance(usd, int | float) and budget.usd is not None:
        update["usd"] = round(budget.usd + float(usd), 6)
    if isinstance(tokens, int) and budget.tokens is not None:
        update["tokens"] = budget.tokens + tokens
    return budget.model_copy(update=update)


def ask_to_raise(state: RunState, budget: Budget, cost: Cost) -> ApprovalRequest:
    """What a person is asked when the next step would not fit: "Spent $4.87 of $5.00 in 37
    steps; the next step may cost up to $0.31. Raise the budget?"."""
    from ratchet.approvals.answers import answer_schema

    steps = f"{state.step} step" + ("" if state.step == 1 else "s")
    in_dollars = budget.usd is not None and (
        cost.usd is None or budget.spent_usd + budget.reserved_usd + cost.usd > budget.usd + 1e-9
    )
    if in_dollars:
        assert budget.usd is not None
        spent = budget.spent_usd + budget.reserved_usd
        next_cost = (
            "an unknown amount (its model has no price)"
            if cost.usd is None
            else (f"up to {dollars(cost.usd)}")
        )
        prompt = (
            f"Spent {dollars(spent)} of {dollars(budget.usd)} in {steps}; "
            f"the next step may cost {next_cost}. Raise the budget?"
        )
        details = {
            "spent_usd": round(spent, 6),
            "budget_usd": budget.usd,
            "next_step_usd": cost.usd,
        }
        schema = answer_schema(RaiseBudget)
    else:
        assert budget.tokens is not None
        spent_tokens = budget.spent_tokens + budget.reserved_tokens
        prompt = (
            f"Spent {spent_tokens:,} of {budget.tokens:,} tokens in {steps}; "
            f"the next step may use up to {cost.tokens:,}. Raise the budget?"
        )
        details = {
            "spent_tokens": spent_tokens,
            "budget_tokens": budget.tokens,
            "next_step_tokens": cost.tokens,
        }
        schema = answer_schema(RaiseTokens)
    return ApprovalRequest(prompt=prompt, details=details, answer_schema=schema, raises_budget=True)


def dollars(amount: float) -> str:
    """`$4.87`; under a cent, `$0.0031`: a small budget's figures stay readable."""
    if amount and abs(amount) < 0.1:
        return f"${amount:.4f}"
    return f"${amount:,.2f}"


MICROS = 1_000_000
"""The daily counter counts millionths of a dollar."""


@dataclass(frozen=True)
class DayHold:
    """What an attempt holds on its agent's counter for `day`, in millionths of a dollar."""

    agent: str
    day: str
    micros: int


def micros(usd: float) -> int:
    """Dollars as the counter counts them, rounded up: a hold never falls short of a bound."""
    return math.ceil(round(usd * MICROS, 3))


def day_of(now: datetime) -> str:
    """The UTC day `now` falls in, as the counter names it (`2026-12-06`)."""
    return now.astimezone(UTC).date().isoformat()


def day_wait(agent: str, budget_usd: float, now: datetime) -> TimerWait:
    """The wait of a run whose agent's daily budget is spent at `now`: until the next UTC
    day's midnight, or a raise."""
    tomorrow = now.astimezone(UTC).date() + timedelta(days=1)
    until = datetime.combine(tomorrow, time(), tzinfo=UTC)
    return TimerWait(until=until, day_budget_of=agent, day_budget_usd=budget_usd)


def day_used(hold: DayHold, usage: Usage, prices: Prices | None) -> int:
    """What the calls of an attempt holding `hold` used, for its settling: at most the hold
    (a call never costs more than its bound; rounding must not make it seem to)."""
    cost = used(usage, prices)
    return min(hold.micros, micros(cost.usd or 0.0))
