"""The peers benchmark's driver runs end to end with what every install has (issue 9; ``bench/peers``).

``make bench-peers`` takes ~15 minutes and the peers' packages, so no test runs it whole. This one runs the driver
on the two systems that need no extra package: bare Temporal (the floor, ``bench/peers/bare_app.py``) and TurnKit,
each in its own process on its own dev server, one turn of each kind, and reads the report it prints.
On PostgreSQL (the ``postgres_url`` fixture) it also runs the second floor, bare Temporal with a PostgreSQL row per
step (``bench/peers/bare_pg_app.py``), and counts its rows.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_driver_measures_turnkit_and_the_floor_and_ranks_only_turnkit() -> None:
    """One command measures both systems at K = 1 (latency, throughput, CPU, history), TurnKit's turn both as a
    fresh conversation's first and as an idle conversation's next, and the floor is a column of its own that no
    ratio uses: with no peer measured, the report has no ratio column, and the next turn is set against the first."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.peers",
            *("--systems", "bare,turnkit", "--k", "1", "--turns", "1", "--warmup", "0", "--burst", "2"),
            *("--rounds", "1", "--history-k", "1,2", "--settings", "default", "--tool-kinds", "activity"),
            *("--turn-kinds", "first,next"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout
    header = next(line for line in report.splitlines() if line.startswith("| K |"))
    # No "÷ faster peer" column.
    assert header == "| K | bare Temporal (floor) | TurnKit (SQLite) | TurnKit (SQLite, next turn) |"
    row = next(line for line in report.splitlines() if line.startswith("| 1 |"))
    latencies = [int(m) for m in re.findall(r"(\d+) ms, [\d.]+ turns/s", row)]
    assert len(latencies) == 3 and all(ms > 0 for ms in latencies), row
    cpu = next(line for line in report.splitlines() if line.startswith("| 1 |") and "=" in line)
    assert len(re.findall(r"\d+ \+ \d+ = \d+ ms", cpu)) == 3, cpu
    ratios = next(line for line in report.splitlines() if line.startswith("| 1 |") and "x /" in line)
    assert len(re.findall(r"[\d.]+x / [\d.]+x / [\d.]+x", ratios)) == 1, ratios
    # The history of a turn: 3 activities at K = 1 and 5 at K = 2 for all (K + 1 model calls, K tool calls); an
    # idle conversation's next turn runs without its lane, in its own workflow only.
    for system in ("bare Temporal (floor)", "TurnKit (SQLite)", "TurnKit (SQLite, next turn)"):
        line = next(line for line in report.splitlines() if line.startswith(f"| {system} |") and "act." in line)
        assert re.findall(r"(\d+) act\.", line) == ["3", "5"], line


def test_the_postgres_floor_runs_only_with_a_postgres_url_and_keeps_turnkits_pool_size() -> None:
    """The second floor (issue 37, target 1: what bounds TurnKit on PostgreSQL) is a column only when the driver has
    a PostgreSQL database to write to, and its pool has the size of TurnKit's store's, which it copies rather than
    import (its process holds no TurnKit module)."""
    from bench.peers import __main__ as driver
    from bench.peers import bare_pg_app
    from turnkit.store import engine

    assert (bare_pg_app.POOL_SIZE, bare_pg_app.MAX_OVERFLOW) == (engine.POOL_SIZE, engine.MAX_OVERFLOW)
    assert [s.key for s in driver.specs_for(driver.parse_args(["--systems", "bare,bare_pg"]))] == ["bare"]
    url = "postgresql+asyncpg://postgres@127.0.0.1:5432/x"
    specs = driver.specs_for(driver.parse_args(["--systems", "bare,bare_pg", "--postgres-url", url]))
    assert [(s.key, s.reference, s.peer, s.database_url) for s in specs] == [
        ("bare", True, False, None),
        ("bare_pg", True, False, url),
    ]
    assert bare_pg_app.libpq_url(url) == "postgresql://postgres@127.0.0.1:5432/x"


def test_the_postgres_floor_records_one_row_per_activity(postgres_url: str) -> None:
    """Issue 37, target 1's second floor: bare Temporal's workflow and activities, each ``model`` and ``lookup``
    writing one row to the database of ``--postgres-url``; a column of its own in no ratio, the same K + 1 model and
    K tool activities per turn as bare Temporal, and one row per activity of every turn it ran (a step's row keyed
    by the turn's workflow id and the activity's id)."""
    import asyncio

    import asyncpg

    from bench.peers import bare_pg_app

    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.peers",
            *("--systems", "bare_pg", "--k", "1", "--turns", "1", "--warmup", "0", "--burst", "2"),
            *("--rounds", "1", "--history-k", "1,2", "--settings", "default", "--postgres-url", postgres_url),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    report = run.stdout
    header = next(line for line in report.splitlines() if line.startswith("| K |"))
    assert header == "| K | bare Temporal + PostgreSQL record (floor) |"
    line = next(line for line in report.splitlines() if line.startswith("| bare Temporal +") and "act." in line)
    assert re.findall(r"(\d+) act\.", line) == ["3", "5"], line

    async def counts() -> list[tuple[str, int, int]]:
        connection = await asyncpg.connect(bare_pg_app.libpq_url(postgres_url))
        try:
            rows = await connection.fetch(
                f"SELECT kind, count(*), count(DISTINCT workflow_id) FROM {bare_pg_app.TABLE} GROUP BY kind "
                "ORDER BY kind"
            )
        finally:
            await connection.close()
        return [(r[0], r[1], r[2]) for r in rows]

    # 4 turns at K = 1 (1 sequential, 2 in the burst, 1 for the history) and 1 at K = 2 (the history's): K + 1
    # model rows each, 4 x 2 + 3, and K lookup rows each, 4 x 1 + 2.
    assert asyncio.run(counts()) == [("lookup", 6, 5), ("model", 11, 5)]
