"""``bench.store_cpu --compare-plans`` alternates this build's store with the arguments and copies made as before."""

from __future__ import annotations

import argparse

import pytest

from bench.store_cpu import as_before_plans, compare_plans
from turnkit.store import storable as storable_module
from turnkit.store.direct import CompiledStatement


def test_the_rounds_before_the_plans_use_sqlalchemys_construction_and_the_json_copy() -> None:
    """Inside ``as_before_plans(True)`` a statement's arguments come from SQLAlchemy's construction and no value is
    walked; outside it, and after it (an error included), this build's own paths are back."""
    planned, walked = CompiledStatement.arguments, storable_module._plain_copy  # pyright: ignore[reportPrivateUsage]
    with as_before_plans(True):
        assert CompiledStatement.arguments is CompiledStatement._constructed  # pyright: ignore[reportPrivateUsage]
        with pytest.raises(storable_module._NotPlain):  # pyright: ignore[reportPrivateUsage]
            storable_module._plain_copy({}, [24])  # pyright: ignore[reportPrivateUsage]
        assert storable_module.storable({"b": 1, "a": None}) == {"a": None, "b": 1}  # the JSON copy still copies
    with pytest.raises(RuntimeError), as_before_plans(True):
        raise RuntimeError("a failed round")
    with as_before_plans(False):
        assert CompiledStatement.arguments is planned
    assert CompiledStatement.arguments is planned
    assert storable_module._plain_copy is walked  # pyright: ignore[reportPrivateUsage]


async def test_compare_plans_reports_both_builds_and_their_ratio(capsys: pytest.CaptureFixture[str]) -> None:
    """A short run on SQLite prints each side's CPU per turn and the median of the rounds' ratios."""
    args = argparse.Namespace(k=1, rounds=2, turns=2, warmup=1, database_url=None)
    await compare_plans(args)
    printed = capsys.readouterr().out
    assert "before the plans:" in printed and "this build:" in printed
    assert "this build / before:" in printed and printed.count("x (median") == 1
