"""``bench.instructions`` reads callgrind's count of a run and turns two runs into instructions per turn."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from bench.instructions import Count, collected, per_turn


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_the_count_of_a_real_run_is_read_and_the_start_up_cancels_out() -> None:
    """Two runs of the same program under callgrind, one looping 100,000 times more: the difference per loop is the
    loop's own few dozen instructions, whatever the interpreter's start-up cost (tens of millions)."""

    def run(loops: int) -> Count:
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-S", "-c"]
        finished = subprocess.run(
            [*command, f"for _ in range({loops}): pass"], capture_output=True, text=True, check=True, timeout=300
        )
        return Count(loops, collected(finished.stderr))

    small, large = run(0), run(100_000)
    assert small.instructions > 10_000_000  # the start-up, in both runs
    assert 5 < per_turn(small, large) < 500


def test_a_run_without_callgrinds_summary_is_refused() -> None:
    """Output without the summary line (valgrind missing, the program killed) raises, naming what was read."""
    with pytest.raises(ValueError, match="callgrind's summary not found"):
        collected("==1== Events    : Ir\n")
    with pytest.raises(ValueError, match="must measure more turns"):
        per_turn(Count(5, 100), Count(5, 200))
    assert per_turn(Count(5, 1_000), Count(25, 3_000)) == 100
