"""What a run's model calls cost, estimated from their token usage and a price table.

The table below is the providers' list prices on `PRICES_AS_OF`, in US dollars per million
tokens, per model id pattern (`fnmatch` globs, first match wins). It matches Anthropic API ids
(`claude-sonnet-4-5`, `claude-sonnet-4-5-20250929`) and Bedrock ids alike
(`bedrock:us.anthropic.claude-sonnet-4-5-20250929-v1:0`): Bedrock's on-demand prices for
Claude are Anthropic's (regional and cross-region endpoints may add a premium).

Prices change: set `RATCHET_PRICES` to a JSON object, or the path of a JSON file holding one,
mapping patterns to prices, and its entries are matched before the built-in ones:

    {"claude-sonnet-4-5*": {"input": 3, "output": 15, "cache_write": 3.75, "cache_read": 0.3},
     "my_models:*": {"input": 0.5, "output": 1.5}}

`cache_write` defaults to 1.25 x `input` and `cache_read` to 0.1 x `input` (Anthropic's
5-minute cache). `estimate` is None for a model no pattern matches (`scripted`, your own).
"""

from __future__ import annotations

import os
from _collections_abc import Mapping  # what `collections.abc` imports (at startup already)

from ratchet import quickjson as json

# Neither pydantic (until `RATCHET_PRICES` is set) nor `typing`, `dataclasses`, `functools`,
# `fnmatch` (nor the `re` it loads) nor `json` load here: `ratchet status` prices a run on its
# quick path (`ratchet.cli.quick`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from ratchet.state import Usage

PRICES_AS_OF = "2025-11-24"
"""When the built-in prices were the providers' published list prices."""
PRICES_VARIABLE = "RATCHET_PRICES"
MILLION = 1_000_000


class Prices:
    """US dollars per million tokens: `input`, `output`, and for the prompt cache (5-minute
    entries) `cache_write` (default 1.25 x `input`) and `cache_read` (default 0.1 x `input`)."""

    __slots__ = ("cache_read", "cache_write", "input", "output")

    def __init__(
        self,
        input: float,
        output: float,
        cache_write: float | None = None,
        cache_read: float | None = None,
    ) -> None:
        self.input, self.output = input, output
        self.cache_write, self.cache_read = cache_write, cache_read

    def __repr__(self) -> str:
        return (
            f"Prices(input={self.input}, output={self.output}, cache_write={self.cache_write}, "
            f"cache_read={self.cache_read})"
        )

    @property
    def cache_write_rate(self) -> float:
        return self.input * 1.25 if self.cache_write is None else self.cache_write

    @property
    def cache_read_rate(self) -> float:
        return self.input * 0.1 if self.cache_read is None else self.cache_read

    def cost(self, tokens: Mapping[str, int]) -> float:
        """What `tokens` (a `Usage` as a dict: `input_tokens`, `output_tokens`, ...; absent
        counts are 0) cost."""
        dollars = (
            tokens.get("input_tokens", 0) * self.input
            + tokens.get("output_tokens", 0) * self.output
            + tokens.get("cache_write_tokens", 0) * self.cache_write_rate
            + tokens.get("cache_read_tokens", 0) * self.cache_read_rate
        ) / MILLION
        return round(dollars, 6)


def _p(input: float, output: float) -> Prices:
    return Prices(input=input, output=output)


BUILT_IN: Mapping[str, Prices] = {
    # Each family by its own id prefix, so a model this table predates matches nothing and
    # gets no estimate, rather than an older family's price.
    "*claude-opus-4-5*": _p(5, 25),
    "*claude-opus-4-1*": _p(15, 75),
    "*claude-opus-4-0*": _p(15, 75),
    "*claude-opus-4-2025*": _p(15, 75),
    "*claude-3-opus*": _p(15, 75),
    "*claude-sonnet-4-6*": _p(3, 15),  # the same list price as 4.5 (checked 2026-12-01)
    "*claude-sonnet-4-5*": _p(3, 15),
    "*claude-sonnet-4-0*": _p(3, 15),
    "*claude-sonnet-4-2025*": _p(3, 15),
    "*claude-3-7-sonnet*": _p(3, 15),
    "*claude-3-5-sonnet*": _p(3, 15),
    "*claude-haiku-4-5*": _p(1, 5),
    "*claude-3-5-haiku*": _p(0.8, 4),
    "*claude-3-haiku*": _p(0.25, 1.25),
}
"""Anthropic's list prices on `PRICES_AS_OF` (standard context; Sonnet prompts over 200K
tokens cost more and are not modelled). Newer models need a `RATCHET_PRICES` entry."""


def estimate(
    model: str, usage: Usage | Mapping[str, int], environ: Mapping[str, str] | None = None
) -> float | None:
    """The estimated cost of `usage` (a `Usage`, or its counts as a dict) on `model`, in US
    dollars; None when no price is known for the model (a scripted policy, your own model
    without a `RATCHET_PRICES` entry). Raises `InvalidInput` naming `RATCHET_PRICES` if that
    is set and malformed."""
    prices = prices_for(model, environ)
    if prices is None:
        return None
    return prices.cost(usage if isinstance(usage, Mapping) else usage.model_dump())


def prices_for(model: str, environ: Mapping[str, str] | None = None) -> Prices | None:
    found = priced(model, environ)
    return found[0] if found is not None else None


def price_source(model: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Where `estimate` takes `model`'s prices from, in words: `RATCHET_PRICES` when one of
    its entries matches, else the built-in list prices and their date; None for no price."""
    found = priced(model, environ)
    return found[1] if found is not None else None


def priced(model: str, environ: Mapping[str, str] | None = None) -> tuple[Prices, str] | None:
    """`model`'s prices and where they come from (`price_source`), or None."""
    env = os.environ if environ is None else environ
    name = model.removeprefix("bedrock:")
    for pattern, prices in _overrides(env.get(PRICES_VARIABLE) or "").items():
        if matches(name, pattern):
            return prices, f"prices from {PRICES_VARIABLE}"
    for pattern, prices in BUILT_IN.items():
        if matches(name, pattern):
            return prices, f"list prices of {PRICES_AS_OF}"
    return None


def matches(name: str, pattern: str) -> bool:
    """`fnmatch.fnmatchcase(name, pattern)`. A pattern whose only wildcard is `*` (every
    built-in one) is matched here, piece by piece; one with `?` or `[` by `fnmatch`."""
    if "?" in pattern or "[" in pattern:
        from fnmatch import fnmatchcase

        return fnmatchcase(name, pattern)
    first, *middle, last = pattern.split("*") if "*" in pattern else (pattern, None)
    if last is None:
        return name == pattern
    if len(name) < len(first) + len(last) or not name.startswith(first):
        return False
    if not name.endswith(last):
        return False
    start, end = len(first), len(name) - len(last)
    for piece in middle:  # each as early as it comes: later pieces have the most room left
        found = name.find(piece, start, end)
        if found < 0:
            return False
        start = found + len(piece)
    return True


def check_prices(raw: str) -> None:
    """Refuse (`InvalidInput`, naming `RATCHET_PRICES`) a value of it that is malformed."""
    _overrides(raw)


_KEPT_OVERRIDES = 4
_overrides_of: dict[str, dict[str, Prices]] = {}
"""`RATCHET_PRICES` values read, by value (the last `_KEPT_OVERRIDES`): a process prices each
run of a list with the same one."""


def _overrides(raw: str) -> dict[str, Prices]:
    if raw not in _overrides_of:
        if len(_overrides_of) >= _KEPT_OVERRIDES:
            del _overrides_of[next(iter(_overrides_of))]
        _overrides_of[raw] = _read_overrides(raw)
    return _overrides_of[raw]


def _read_overrides(raw: str) -> dict[str, Prices]:
    if not raw.strip():
        return {}
    from ratchet.errors import InvalidInput  # only with prices set: the quick path loads none

    text = raw
    if not raw.lstrip().startswith("{"):
        try:
            with open(raw, encoding="utf-8") as file:
                text = file.read()
        except OSError as error:
            raise InvalidInput(
                f"{PRICES_VARIABLE} is neither a JSON object nor a readable file: "
                f"{error.strerror or error}"
            ) from None
    try:
        parsed = json.loads(text)
    except ValueError as error:
        raise InvalidInput(f"{PRICES_VARIABLE} is not valid JSON: {error}") from None
    if not isinstance(parsed, dict):
        raise InvalidInput(f"{PRICES_VARIABLE} must be a JSON object of pattern -> prices")
    return {pattern: _checked(pattern, prices) for pattern, prices in parsed.items()}


ENTRY_SHAPE = (
    'give an object of US dollars per million tokens, such as {"input": 3, "output": 15} '
    "(cache_write and cache_read optional)"
)
"""What one `RATCHET_PRICES` entry looks like, in the words a refusal of one says it."""


def _checked(pattern: str, prices: object) -> Prices:
    """One entry of `RATCHET_PRICES`, validated (pydantic loads here, only when it is set)."""
    from pydantic import ValidationError

    from ratchet.errors import InvalidInput

    if not isinstance(prices, dict):
        # pydantic would name its model's class here: say what an entry looks like instead.
        raise InvalidInput(
            f"{PRICES_VARIABLE}: bad prices for {pattern!r}: {ENTRY_SHAPE}, not "
            f"{json.dumps(prices)}"
        )
    try:
        given = _prices_input().model_validate(prices)
    except ValidationError as error:
        problem = error.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(p) for p in problem["loc"]) or "(prices)"
        raise InvalidInput(
            f"{PRICES_VARIABLE}: bad prices for {pattern!r}: {where}: {problem['msg']}"
        ) from None
    return Prices(**given.model_dump())


_prices_model: Any = None


def _prices_input() -> Any:
    """The pydantic model of one `RATCHET_PRICES` entry: `Prices`, checked."""
    global _prices_model
    if _prices_model is None:
        _prices_model = _prices_model_class()
    return _prices_model


def _prices_model_class() -> Any:
    from pydantic import BaseModel, ConfigDict, Field

    class PricesInput(BaseModel):
        # Strict: a price is a number ("3" is refused, as the stack refuses it at synth).
        model_config = ConfigDict(extra="forbid", strict=True)

        input: float = Field(ge=0)
        output: float = Field(ge=0)
        cache_write: float | None = Field(default=None, ge=0)
        cache_read: float | None = Field(default=None, ge=0)

    return PricesInput
