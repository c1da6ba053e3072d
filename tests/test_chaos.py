"""The chaos suite (issue 8, "the chaos suite and the checker"): ``pytest -m chaos``.

Each seed runs the multi-agent job of :mod:`tests.chaos_app` under the real faults its ``random.Random(seed)`` draws
from the enabled kinds (see :mod:`tests.chaos`), then requires: every turn it created is terminal, ``turnkit
check`` is clean, no at-most-once effect happened twice, and hostile input left its conversation working.

``TURNKIT_CHAOS_SEEDS`` sets how many seeds run (default 30; ``make chaos SEEDS=300``), ``TURNKIT_CHAOS_FAULTS``
which fault kinds may strike (a comma list, or ``none``; default: all of them), ``TURNKIT_CHAOS_KILL_AT`` the one
hang point where every worker kill strikes (default: drawn per seed). The run ends with one line:
seeds, faults drawn by kind, and violations found.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from tests import chaos_app
from tests.chaos import SUMMARY, ChaosRig, Outcome, chaos_rig, enabled_faults, run_scenario
from tests.faults import postgres_binaries

pytestmark = [
    pytest.mark.chaos,
    pytest.mark.skipif(postgres_binaries() is None, reason="needs PostgreSQL server binaries for a private cluster"),
]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" in metafunc.fixturenames:
        metafunc.parametrize("seed", range(int(os.environ.get("TURNKIT_CHAOS_SEEDS", "30"))))


_OUTCOMES: list[Outcome] = []


@pytest_asyncio.fixture(scope="module")
async def rig() -> AsyncIterator[ChaosRig]:
    async with chaos_rig() as shared:
        yield shared
    faults = Counter(kind for outcome in _OUTCOMES for kind in outcome.faults)
    broken = sum(1 for outcome in _OUTCOMES if outcome.problems or outcome.findings)
    drawn = ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items()))
    local = sum(1 for outcome in _OUTCOMES if outcome.local_model)
    kills = Counter(outcome.killed_at for outcome in _OUTCOMES if outcome.killed_at)
    where = ", ".join(f"{point} {count}" for point, count in sorted(kills.items()))
    SUMMARY.append(
        f"chaos: {len(_OUTCOMES)} seeds, {sum(faults.values())} faults drawn ({drawn}; worker kills at: "
        f"{where or 'none'}), {local} seeds with local model calls, {broken} seeds with violations"
    )


async def test_chaos_seed(rig: ChaosRig, seed: int) -> None:
    """issue 8: a seeded multi-agent job under real faults keeps every promise (see the module docstring)."""
    chaos_app.register_all()
    outcome = await run_scenario(rig, seed, enabled_faults())
    _OUTCOMES.append(outcome)
    if (outcome.problems or outcome.findings) and os.environ.get("TURNKIT_CHAOS_FAILURES"):
        with open(os.environ["TURNKIT_CHAOS_FAILURES"], "a") as failures:
            failures.write(f"seed {seed}\n{outcome.describe()}\n\n")
    assert not outcome.problems and not outcome.findings, outcome.describe()
