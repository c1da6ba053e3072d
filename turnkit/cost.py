"""Cost of model calls in USD (behaviour §6.5).

A :class:`Cost` has optional per-component amounts and an optional explicit total. :func:`cost_from_usage` prices
a :class:`~turnkit.model.Usage` with the first rule that applies: the provider's own figure, the application's
``cost_calculator``, the configured ``cost_rates``, or the known prices of ``genai-prices`` (``pip install
'turnkit[prices]'``). An unpriced call gives an empty cost (total None), which adds nothing to budgets.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Mapping
from typing import Any, Final

from turnkit.config import settings
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.records import TurnRecord
from turnkit.model import Usage

__all__ = ["COMPONENTS", "Cost", "cost_from_usage", "known_price", "total_cost", "total_usage"]

logger = logging.getLogger("turnkit.cost")

#: Cost components, in display order.
COMPONENTS: Final = ("input", "output", "cache_read", "cache_write", "thinking")

#: How long a model that genai-prices does not know is taken as unpriced without asking it again (s). Its lookup of an
#: unknown name walks every provider's patterns, and it would run on every model call of such a model (a scripted
#: one, a local server's, a fine-tune); a while, not for ever, so that prices an application updates at run time
#: (``genai_prices.UpdatePrices``) are seen.
UNPRICED_FOR: Final = 300.0
#: Model names genai-prices did not know, with when that expires (``time.monotonic``); bounded.
_unpriced: dict[str, float] = {}
_UNPRICED_KEPT: Final = 256

# Which usage bucket each rate component prices.
_TOKENS_FOR: Final = {
    "input": "input_tokens",
    "output": "output_tokens",
    "cache_read": "cached_tokens",
    "cache_write": "cache_write_tokens",
    "thinking": "thinking_tokens",
}


class Cost:
    """A cost in USD, by component, with an optional explicit total.

    ``total`` is the explicit total if one was given; otherwise the sum of the known components, or None when none
    is known. A *strict* cost (built from rates) has no total as soon as one component is unknown, because a partial
    sum would understate the spend.
    """

    __slots__ = ("_strict", "_total", "cache_read", "cache_write", "input", "output", "thinking")

    def __init__(
        self,
        *,
        input: float | None = None,
        output: float | None = None,
        cache_read: float | None = None,
        cache_write: float | None = None,
        thinking: float | None = None,
        total: float | None = None,
        strict: bool = False,
    ) -> None:
        """Create a cost.

        Args:
            input: Cost of uncached input tokens.
            output: Cost of output tokens.
            cache_read: Cost of cached input tokens.
            cache_write: Cost of cache-write tokens.
            thinking: Cost of thinking tokens.
            total: An explicit total, e.g. reported by the provider.
            strict: When no explicit total is given, report no total if any component is unknown.
        """
        self.input = input
        self.output = output
        self.cache_read = cache_read
        self.cache_write = cache_write
        self.thinking = thinking
        self._total = total
        self._strict = strict

    @property
    def components(self) -> dict[str, float | None]:
        """The five components by name (None when unknown)."""
        return {name: getattr(self, name) for name in COMPONENTS}

    @property
    def total(self) -> float | None:
        """The explicit total, else the sum of the known components, else None."""
        if self._total is not None:
            return self._total
        values = list(self.components.values())
        if self._strict and any(v is None for v in values):
            return None
        known = [v for v in values if v is not None]
        return math.fsum(known) if known else None

    @property
    def empty(self) -> bool:
        """True when nothing is known about this cost."""
        return self.total is None and all(v is None for v in self.components.values())

    def to_dict(self) -> dict[str, float]:
        """The known components and the total, omitting unknown values (the ``cost_details`` shape)."""
        data = {name: value for name, value in self.components.items() if value is not None}
        total = self.total
        if total is not None:
            data["total"] = total
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cost:
        """Read a cost from a mapping of components and/or ``total``.

        Args:
            data: Keys among ``input``, ``output``, ``cache_read``, ``cache_write``, ``thinking`` and ``total``.

        Returns:
            The cost.

        Raises:
            ConfigError: The mapping has other keys (a typo would otherwise silently price a call at zero).
        """
        unknown = [str(k) for k in data if str(k) not in (*COMPONENTS, "total")]
        if unknown:
            raise ConfigError(f"unknown cost keys: {', '.join(unknown)}")
        values: dict[str, float | None] = {str(k): None if v is None else float(v) for k, v in data.items()}
        return cls.from_components(values, total=values.get("total"))

    @classmethod
    def from_components(
        cls, values: Mapping[str, float | None], *, total: float | None = None, strict: bool = False
    ) -> Cost:
        """Build a cost from a mapping of component amounts (missing components are unknown).

        Args:
            values: Amounts by component name (other keys are ignored).
            total: An explicit total, e.g. reported by the provider.
            strict: Report no total when any component is unknown.

        Returns:
            The cost.
        """
        return cls(
            input=values.get("input"),
            output=values.get("output"),
            cache_read=values.get("cache_read"),
            cache_write=values.get("cache_write"),
            thinking=values.get("thinking"),
            total=total,
            strict=strict,
        )

    @classmethod
    def aggregate(cls, costs: Iterable[Cost]) -> Cost:
        """Sum costs (behaviour §6.5).

        Per component when any cost carries components; else the totals, when none of them is None; else an
        empty cost.

        Args:
            costs: The costs to sum.

        Returns:
            The summed cost.
        """
        items = list(costs)
        if any(any(v is not None for v in c.components.values()) for c in items):
            sums: dict[str, float | None] = {}
            for name in COMPONENTS:
                known = [v for c in items if (v := getattr(c, name)) is not None]
                sums[name] = math.fsum(known) if known else None
            return cls.from_components(sums)
        totals = [c.total for c in items]
        if items and all(t is not None for t in totals):
            return cls(total=math.fsum(t for t in totals if t is not None))
        return cls()

    @classmethod
    def from_record(cls, turn: TurnRecord) -> Cost:
        """The cost of one stored turn (behaviour §6.5): its ``usage.cost_details``, else its ``cost``, else its usage
        priced now (:func:`cost_from_usage` with the turn's model). The turn's own calls only, not its children's.

        Args:
            turn: The turn's record.

        Returns:
            The cost; empty (total None) when nothing prices it.
        """
        details = turn.usage.get("cost_details")
        if isinstance(details, Mapping) and details:
            known = {str(k): v for k, v in details.items() if str(k) in (*COMPONENTS, "total") and _is_number(v)}
            cost = cls.from_dict(known)
            # The recorded total is what budgets counted: it wins over a sum of the details' components.
            return cost if turn.cost is None else cls.from_components(cost.components, total=turn.cost)
        if turn.cost is not None:
            return cls(total=turn.cost)
        usage = Usage.from_dict(turn.usage)
        if usage.total_tokens == 0:
            return cls()  # nothing used (a pending turn, say): unknown, not a priced 0.0
        return cost_from_usage(usage, turn.model)

    @classmethod
    def of_turns(cls, turns: Iterable[TurnRecord]) -> Cost:
        """The cost of ``turns`` (a conversation's, a tree's, an agent's): components summed over the turns that know
        them, and the total summed over the turns whose total is known (None when none is). A turn priced only by its
        provider's total adds to the total and to no component, so the total is the spend, never less."""
        costs = [cls.from_record(turn) for turn in turns]
        totals = [total for cost in costs if (total := cost.total) is not None]
        components = cls.aggregate(cost for cost in costs if cost.total is not None).components
        return cls.from_components(components, total=math.fsum(totals) if totals else None)

    def __eq__(self, other: object) -> bool:
        """Costs are equal when their components and totals are."""
        if not isinstance(other, Cost):
            return NotImplemented
        return self.components == other.components and self.total == other.total

    def __hash__(self) -> int:
        """Hash consistent with equality."""
        return hash((tuple(self.components.values()), self.total))

    def __repr__(self) -> str:
        """Show the known values."""
        return f"Cost({', '.join(f'{k}={v!r}' for k, v in self.to_dict().items())})"


def _is_number(value: object) -> bool:
    # bool is an int subclass, but True is not a price.
    return isinstance(value, int | float) and not isinstance(value, bool)


def _cost_from_rates(usage: Usage, rates: Mapping[str, Any]) -> Cost:
    unknown = [str(k) for k in rates if str(k) not in COMPONENTS]
    if unknown:
        raise ConfigError(f"unknown cost rate keys: {', '.join(unknown)}")
    by_name = {str(k): v for k, v in rates.items()}
    amounts: dict[str, float | None] = {}
    for component, bucket in _TOKENS_FOR.items():
        tokens: int = getattr(usage, bucket)
        rate = by_name.get(component)
        if tokens == 0:
            amounts[component] = 0.0
        elif rate is None:
            amounts[component] = None
        else:
            amounts[component] = tokens * float(rate) / 1_000_000
    return Cost.from_components(amounts, strict=True)


def cost_from_usage(usage: Usage, model: str | None) -> Cost:
    """Price one model call (behaviour §6.5 rules 1-5).

    1. A provider-reported ``usage.cost`` becomes the total.
    2. ``settings.cost_calculator(usage, model)``, when set and not returning None: a :class:`Cost` is used as-is,
       a mapping is read with :meth:`Cost.from_dict`, and a number becomes the total.
    3. ``settings.cost_rates[model]``: USD per million tokens per component; strict, so the total is None when a
       bucket with tokens has no rate.
    4. The model's known prices, from the ``genai-prices`` package when it is installed (the gem's rule 4, its
       model registry): the total only, for the prices may be tiered. Its data is the snapshot bundled with the
       package; TurnKit never fetches newer prices (``genai_prices.UpdatePrices`` is never started), so pricing
       never reaches the network.
    5. Otherwise an empty cost.

    Args:
        usage: The call's usage.
        model: The model that answered, used to look up rates.

    Returns:
        The cost; possibly empty.

    Raises:
        ConfigError: The rates have unknown keys, or the calculator returned an unsupported value.
    """
    if usage.cost is not None:
        return Cost(total=float(usage.cost))
    calculator = settings.cost_calculator
    if calculator is not None:
        computed = calculator(usage, model)
        if computed is not None:
            if isinstance(computed, Cost):
                return computed
            if isinstance(computed, Mapping):
                return Cost.from_dict(computed)
            if _is_number(computed):
                return Cost(total=float(computed))
            raise ConfigError("cost_calculator must return a Cost, a mapping, a number or None")
    if model is not None:
        rates = settings.cost_rates.get(model)
        if rates is not None:
            return _cost_from_rates(usage, rates)
        known = known_price(usage, model)
        if known is not None:
            return Cost(total=known)
    return Cost()


def known_price(usage: Usage, model: str) -> float | None:
    """The USD price of ``usage`` on ``model`` from ``genai-prices``; None when it is not installed or has no price.

    genai-prices counts overlapping totals: its ``input_tokens`` includes cache reads and writes, and its
    ``output_tokens`` includes reasoning, while our buckets are exclusive. The totals are rebuilt here, with the
    cache and reasoning counts given as the parts of them that are priced differently.

    Args:
        usage: The call's usage.
        model: The model that answered (``gpt-4o``, ``claude-sonnet-4-20250514``, …).

    Returns:
        The price, or None.
    """
    now = time.monotonic()
    if _unpriced.get(model, 0.0) > now:
        return None
    try:
        from genai_prices import Usage as PricedUsage
        from genai_prices import calc_price
    except ImportError:
        return None
    counts = {
        "input_tokens": usage.input_tokens + usage.cached_tokens + usage.cache_write_tokens,
        "cache_read_tokens": usage.cached_tokens,
        "cache_write_tokens": usage.cache_write_tokens,
        "output_tokens": usage.output_tokens + usage.thinking_tokens,
        "output_reasoning_tokens": usage.thinking_tokens,
    }
    try:
        # The bundled data: calc_price only uses fetched prices if the application started UpdatePrices itself.
        price = calc_price(PricedUsage(**{k: v for k, v in counts.items() if v}), model)
    except LookupError:  # an unknown model or provider
        if len(_unpriced) >= _UNPRICED_KEPT:
            _unpriced.clear()
        _unpriced[model] = now + UNPRICED_FOR
        return None
    except ValueError as err:  # usage it cannot price: the call is paid for, so it is recorded unpriced, not failed
        logger.warning("genai-prices could not price %s: %s", model, err)
        return None
    return float(price.total_price)


def total_usage(turns: Iterable[TurnRecord]) -> Usage:
    """The tokens used by ``turns``, summed (each turn's own usage: a conversation's, an agent's, a tree's)."""
    total = Usage()
    for turn in turns:
        total = total + Usage.from_dict(turn.usage)
    return total


def total_cost(turns: Iterable[TurnRecord]) -> float | None:
    """The observed cost of ``turns`` in USD as a number (:meth:`Cost.of_turns`'s total, from the recorded costs
    alone); None when none of them has a known cost."""
    costs = [turn.cost for turn in turns if turn.cost is not None]
    return math.fsum(costs) if costs else None
