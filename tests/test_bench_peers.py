"""The peers benchmark's driver runs end to end with what every install has (issue 9; ``bench/peers``).

``make bench-peers`` takes ~15 minutes and the peers' packages, so no test runs it whole. This one runs the driver
on the two systems that need no extra package: bare Temporal (the floor, ``bench/peers/bare_app.py``) and TurnKit,
each in its own process on its own dev server, one turn of each kind, and reads the report it prints.
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
