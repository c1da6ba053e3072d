"""Cost computation (behaviour §6.5; T35, T36; known prices from genai-prices, issue 11), settings (§9) and error names
(§8)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import genai_prices
import pytest

from turnkit.config import TASK_QUEUE, configure, reset_settings, settings
from turnkit.cost import COMPONENTS, Cost, cost_from_usage, known_price
from turnkit.kernel.errors import (
    BudgetError,
    ConfigError,
    Error,
    LostClaim,
    ModelAccessError,
    RecordNotFound,
    StoreError,
    ToolError,
    ToolValidationError,
    error_class_name,
)
from turnkit.kernel.records import TurnRecord
from turnkit.model import Usage


@pytest.fixture(autouse=True)
def _isolated() -> Iterator[None]:
    reset_settings()
    yield
    reset_settings()


def test_worked_example_from_rates() -> None:
    """T35: §6.5's worked example: rates input 1, output 2, cache_read 0.1, cache_write 1.25 and usage
    1M/500k/100k/200k give input 1.0, output 1.0, cache_read 0.01, cache_write 0.25 and a total of 2.26."""
    configure(cost_rates={"model-a": {"input": 1.00, "output": 2.00, "cache_read": 0.10, "cache_write": 1.25}})
    usage = Usage(input_tokens=1_000_000, output_tokens=500_000, cached_tokens=100_000, cache_write_tokens=200_000)
    cost = cost_from_usage(usage, "model-a")
    assert cost.to_dict() == pytest.approx(
        {"input": 1.0, "output": 1.0, "cache_read": 0.01, "cache_write": 0.25, "thinking": 0.0, "total": 2.26}
    )
    assert cost.total == pytest.approx(2.26)
    assert usage.total_tokens == 1_800_000


def test_provider_cost_wins() -> None:
    configure(cost_rates={"m": {"input": 100.0}}, cost_calculator=lambda u, m: 99.0)
    cost = cost_from_usage(Usage(input_tokens=10, cost=0.02), "m")
    assert cost.total == 0.02
    assert cost.to_dict() == {"total": 0.02}


def test_cost_calculator_hash_number_cost_and_none() -> None:
    """T36: a ``cost_calculator`` returning ``{input: tokens * 0.001, output: 0.25}`` prices 2 input tokens at 0.252;
    a number or a ``Cost`` is used as is, None falls through to the rates, and any other value is a ``ConfigError``."""
    configure(cost_calculator=lambda u, m: {"input": u.input_tokens * 0.001, "output": 0.25})
    assert cost_from_usage(Usage(input_tokens=2), "m").total == pytest.approx(0.252)

    configure(cost_calculator=lambda u, m: 0.5)
    assert cost_from_usage(Usage(input_tokens=2), "m").total == 0.5

    fixed = Cost(input=0.1)
    configure(cost_calculator=lambda u, m: fixed)
    assert cost_from_usage(Usage(), "m") is fixed

    # None falls through to the rates.
    configure(cost_calculator=lambda u, m: None, cost_rates={"m": {"input": 2.0}})
    assert cost_from_usage(Usage(input_tokens=500_000), "m").total == pytest.approx(1.0)

    configure(cost_calculator=lambda u, m: "free")
    with pytest.raises(ConfigError, match="cost_calculator must return"):
        cost_from_usage(Usage(), "m")


def test_rates_are_strict_and_keys_checked() -> None:
    configure(cost_rates={"m": {"input": 1.0}})
    partial = cost_from_usage(Usage(input_tokens=1_000_000, output_tokens=10), "m")
    assert partial.input == pytest.approx(1.0)
    assert partial.output is None
    assert partial.total is None  # strict: an unpriced bucket with tokens means the total is unknown
    assert cost_from_usage(Usage(input_tokens=1_000_000), "m").total == pytest.approx(1.0)
    assert cost_from_usage(Usage(), "m").total == 0.0  # zero tokens cost zero

    configure(cost_rates={"m": {"input": 1.0, "prompt": 2.0}})
    with pytest.raises(ConfigError, match=r"^unknown cost rate keys: prompt$"):
        cost_from_usage(Usage(input_tokens=1), "m")


def test_unpriced_calls_give_an_empty_cost() -> None:
    cost = cost_from_usage(Usage(input_tokens=10), "unknown-model")
    assert cost.total is None
    assert cost.empty
    assert cost.to_dict() == {}
    assert cost_from_usage(Usage(input_tokens=10), None).empty


def test_cost_totals_and_aggregate() -> None:
    assert Cost(input=0.1, output=0.2).total == pytest.approx(0.3)
    assert Cost(input=0.1, total=5.0).total == 5.0
    assert Cost().total is None
    assert Cost(input=0.1, output=None).to_dict() == {"input": 0.1, "total": 0.1}
    assert Cost.from_dict({"total": 1}).total == 1.0
    with pytest.raises(ConfigError, match="unknown cost keys: usd"):
        Cost.from_dict({"usd": 1})

    by_component = Cost.aggregate([Cost(input=0.1), Cost(input=0.2, output=0.3), Cost(total=9.0)])
    assert by_component.input == pytest.approx(0.3)
    assert by_component.output == pytest.approx(0.3)
    assert Cost.aggregate([Cost(total=0.01), Cost(total=0.02)]).total == pytest.approx(0.03)
    assert Cost.aggregate([Cost(total=0.01), Cost()]).total is None
    assert Cost.aggregate([]).total is None


def test_a_turns_cost_from_its_record() -> None:
    """§6.5 ``Cost.from_record``: the turn's ``usage.cost_details`` first (the recorded total wins over their sum),
    then its ``cost``, then its usage priced now; a turn that used nothing has an unknown cost, not 0.0."""
    configure(cost_rates={"rated": {"input": 1, "output": 2}})
    details = {"input": 0.5, "output": 0.25, "total": 0.75}
    detailed = TurnRecord(
        id="turn_a",
        conversation_id="conv_a",
        agent_name="a",
        root_turn_id="turn_a",
        usage={"input_tokens": 5, "cost_details": details},
        cost=0.8,
        created_at=datetime(2026, 12, 5, tzinfo=UTC),
        updated_at=datetime(2026, 12, 5, tzinfo=UTC),
    )
    assert Cost.from_record(detailed).to_dict() == {"input": 0.5, "output": 0.25, "total": 0.8}
    total_only = detailed.model_copy(update={"usage": {"input_tokens": 5}, "cost": 0.3})
    assert Cost.from_record(total_only) == Cost(total=0.3)
    unpriced = detailed.model_copy(
        update={"usage": {"input_tokens": 1_000_000, "output_tokens": 1_000_000}, "cost": None, "model": "rated"}
    )
    assert Cost.from_record(unpriced).to_dict() == {
        **dict.fromkeys(COMPONENTS, 0.0),
        "input": 1.0,
        "output": 2.0,
        "total": 3.0,
    }
    pending = detailed.model_copy(update={"usage": {}, "cost": None, "model": "rated"})
    assert Cost.from_record(pending).empty

    summed = Cost.of_turns([detailed, total_only, pending])
    assert summed.total == pytest.approx(1.1)  # every known total counts, the provider-priced one too
    assert (summed.input, summed.output) == (0.5, 0.25)
    assert Cost.of_turns([pending]).total is None and Cost.of_turns([]).total is None


# -- known prices (genai-prices) --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    ["gpt-4o", "gpt-4o-mini", "claude-sonnet-4-20250514", "claude-sonnet-4", "o3-mini", "gemini-2.5-pro"],
)
def test_known_models_are_priced_as_genai_prices_prices_their_total_usage(model: str) -> None:
    """issue 11: our buckets are exclusive, genai-prices' input and output counts are totals; the mapping agrees."""
    usage = Usage(input_tokens=12_000, cached_tokens=3_000, cache_write_tokens=2_000, output_tokens=800)
    totals = genai_prices.Usage(
        input_tokens=12_000 + 3_000 + 2_000, cache_read_tokens=3_000, cache_write_tokens=2_000, output_tokens=800
    )
    expected = float(genai_prices.calc_price(totals, model).total_price)
    cost = cost_from_usage(usage, model)
    assert cost.total == pytest.approx(expected, rel=1e-12)
    assert cost.to_dict() == {"total": cost.total}  # tiered prices: no per-bucket split is claimed

    # Reasoning is part of genai-prices' output count, like the provider bills it.
    thinking = Usage(input_tokens=1_000, output_tokens=300, thinking_tokens=700)
    billed = genai_prices.Usage(input_tokens=1_000, output_tokens=1_000, output_reasoning_tokens=700)
    assert known_price(thinking, model) == pytest.approx(float(genai_prices.calc_price(billed, model).total_price))


def test_known_price_counts_cache_tokens_once() -> None:
    """issue 11: Claude Sonnet 4 at $3 input, $0.30 cache read, $3.75 cache write, $15 output per million tokens."""
    usage = Usage(input_tokens=1_000, cached_tokens=200, cache_write_tokens=300, output_tokens=500)
    # 1000 x 3 + 200 x 0.30 + 300 x 3.75 + 500 x 15 = 11,685 USD per million tokens. Passing our uncached input as
    # genai-prices' input total would give 0.010185 (the cache tokens taken out of it), and pricing every input
    # token as input 0.012.
    assert cost_from_usage(usage, "claude-sonnet-4-20250514").total == pytest.approx(0.011685)
    # GPT-4o has no cache-write price: cache writes are priced as input (2.5), cache reads at 1.25.
    assert cost_from_usage(usage, "gpt-4o").total == pytest.approx((1_300 * 2.5 + 200 * 1.25 + 500 * 10) / 1e6)


def test_known_prices_come_after_provider_calculator_and_rates() -> None:
    """issue 11: genai-prices is the rule after ``cost_rates`` (behaviour §6.5), and unknown models stay unpriced."""
    usage = Usage(input_tokens=1_000_000)
    assert cost_from_usage(usage, "gpt-4o").total == pytest.approx(2.5)
    configure(cost_rates={"gpt-4o": {"input": 1.0}})
    assert cost_from_usage(usage, "gpt-4o").total == pytest.approx(1.0)
    configure(cost_rates={}, cost_calculator=lambda u, m: 0.25)
    assert cost_from_usage(usage, "gpt-4o").total == 0.25
    assert cost_from_usage(Usage(input_tokens=1, cost=0.5), "gpt-4o").total == 0.5
    configure(cost_calculator=None)
    assert cost_from_usage(usage, "scripted").empty
    assert known_price(usage, "no-such-model-xyz") is None


def test_an_unknown_model_is_looked_up_once_in_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A model genai-prices does not know is asked about once per ``UNPRICED_FOR`` (its lookup walks every provider's
    patterns), then again: prices updated at run time are seen; a known model is priced on every call."""
    import turnkit.cost as cost_module

    asked: list[str] = []
    real = genai_prices.calc_price

    def counting(usage: Any, model_ref: str, **kwargs: Any) -> Any:
        asked.append(model_ref)
        return real(usage, model_ref, **kwargs)

    clock = [1_000.0]
    monkeypatch.setattr(genai_prices, "calc_price", counting)
    monkeypatch.setattr(cost_module, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    monkeypatch.setattr(cost_module, "_unpriced", {})
    usage = Usage(input_tokens=1_000_000)
    name = f"unknown-{uuid.uuid4().hex[:8]}"
    assert [known_price(usage, name) for _ in range(3)] == [None, None, None]
    assert asked == [name]
    clock[0] += cost_module.UNPRICED_FOR + 1
    assert known_price(usage, name) is None
    assert asked == [name, name]
    assert known_price(usage, "gpt-4o") == known_price(usage, "gpt-4o") == pytest.approx(2.5)
    assert asked == [name, name, "gpt-4o", "gpt-4o"]


def test_pricing_never_reaches_the_network() -> None:
    """issue 11: prices come from the data bundled with genai-prices; no socket is opened, at import or at call."""
    script = textwrap.dedent(
        """
        import socket

        def refuse(*args, **kwargs):
            raise AssertionError(f"network access: {args!r}")

        socket.socket.connect = refuse
        socket.socket.connect_ex = refuse
        socket.getaddrinfo = refuse
        socket.create_connection = refuse

        import threading
        from turnkit.cost import cost_from_usage
        from turnkit.model import Usage

        cost = cost_from_usage(Usage(input_tokens=1_000_000, output_tokens=1_000_000), "gpt-4o")
        print(cost.total, sorted(t.name for t in threading.enumerate()))
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    total, threads = done.stdout.split(" ", 1)
    assert float(total) == pytest.approx(12.5)
    assert threads.strip() == "['MainThread']"  # no background price updater was started


# -- settings -------------------------------------------------------------------------------------------------------


def test_configure_and_reset() -> None:
    assert TASK_QUEUE == "turnkit"
    assert settings.default_model == "claude-sonnet-4-5"
    assert configure(max_iterations=3, max_tool_executions_by_name={1: 2}) is settings
    assert settings.max_iterations == 3
    assert settings.max_tool_executions_by_name == {"1": 2}
    with pytest.raises(ConfigError, match=r"^unknown setting: max_iteration$"):
        configure(max_depth=9, max_iteration=3)
    assert settings.max_depth == 3  # nothing applied when one name is unknown
    reset_settings()
    assert settings.max_iterations == 25
    assert settings.max_tool_executions_by_name == {}
    assert settings.timeout == 300.0
    assert settings.maintenance_batch_size == 100


# -- errors ---------------------------------------------------------------------------------------------------------


def test_error_hierarchy_and_names() -> None:
    assert issubclass(ModelAccessError, ConfigError)
    assert issubclass(ToolValidationError, ToolError)
    assert issubclass(RecordNotFound, StoreError) and issubclass(RecordNotFound, LookupError)
    assert all(issubclass(cls, Error) for cls in (BudgetError, LostClaim, RecordNotFound))
    assert error_class_name(BudgetError("maximum iterations reached")) == "TurnKit::BudgetError"
    assert error_class_name(ToolValidationError("x")) == "TurnKit::ToolValidationError"
    assert error_class_name(Error("x")) == "TurnKit::Error"
    assert error_class_name(ValueError("x")) == "ValueError"

    class AppError(ToolError):
        pass

    assert error_class_name(AppError("x")) == "AppError"
    missing = RecordNotFound.of("turn", "turn_123")
    assert str(missing) == "turn not found: turn_123"
    with pytest.raises(LookupError):
        raise missing
