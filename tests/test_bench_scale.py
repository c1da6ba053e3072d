"""bench.scale (issue 37 target 7) at a tiny size: worker and client processes on one PostgreSQL database.

The bench creates its own database on the server of ``TURNKIT_TEST_POSTGRES_URL`` (the ``postgres_admin_url``
fixture: the test skips when that server is unreachable) and drops it at the end.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_a_tiny_run_ends_every_turn_and_checks_clean(postgres_admin_url: str, tmp_path: Path) -> None:
    """2 workers, 1 client, 3 conversations x 2 turns: every turn terminal, check clean, throughput and counts."""
    report_file = tmp_path / "scale.json"
    command = [sys.executable, "-m", "bench.scale", "--workers", "2", "--clients", "1", "--conversations", "3"]
    command += ["--turns", "2", "--postgres", postgres_admin_url, "--timeout", "60", "--json", str(report_file)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_file.read_text())
    assert report["passed"]
    assert report["store"]["not_terminal"] == 0
    assert report["store"]["by_status"] == {"root completed": 6, "sub-agent completed": 12}
    assert report["check"]["clean"], report["check"]["output"]
    assert report["root_turns_completed"] == 6
    assert report["iterations"] == report["store"]["model_responses"] == 24  # 4 model calls per root turn
    assert report["turns_per_second"] > 0 and report["iterations_per_second"] > 0
    assert report["transactions_per_iteration"] > 0
    assert report["round_trips_per_iteration"] > report["transactions_per_iteration"]
    assert "PASSED" in done.stdout
