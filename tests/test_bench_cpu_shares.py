"""``bench.cpu_shares`` sorts py-spy's samples into the shares bench/README.md reports (issue 9's profile)."""

from __future__ import annotations

from bench.cpu_shares import REST, SHARES, report, shares

STORE, ACTIVITIES, CLIENT, WORKFLOWS, ACTIVITY_WORKER, BRIDGE = (name for name, _ in SHARES)


def test_each_sample_goes_to_the_first_share_its_stack_holds_and_startup_imports_to_none() -> None:
    """A store call inside an activity is the store's; an activity's own code is the activities'; the imports of
    bench.cpu_profile's module level are no turn's; whatever matches no marker is the rest."""
    run = "<module> (bench/cpu_profile.py:410);run (asyncio/runners.py:190)"
    lines = [
        f"{run};execute_activity (temporalio/worker/_activity.py:532);model (activities/model.py:90);"
        "atomic (turnkit/store/store.py:292);_run (turnkit/store/sqlite_inline.py:144) 7",
        f"{run};execute_activity (temporalio/worker/_activity.py:532);model (activities/model.py:112) 3",
        f"{run};_handle_start_activity_task (temporalio/worker/_activity.py:379) 2",
        "Thread._bootstrap (threading.py:1002);_run_code (temporalio/worker/workflow_sandbox/_runner.py:193) 4",
        f"{run};ask (turnkit/handles.py:119) 1",
        f"{run};complete_activity_task (temporalio/bridge/worker.py:248) 2",
        f"{run};_run_once (asyncio/base_events.py:1922) 1",
        "<module> (bench/cpu_profile.py:42);_LoaderBasics.exec_module (<frozen importlib._bootstrap_external>:940) 50",
        "not a sample line",
    ]
    result = shares(lines)
    assert result.total == 20
    assert result.by_share == {STORE: 7, ACTIVITIES: 3, ACTIVITY_WORKER: 2, WORKFLOWS: 4, CLIENT: 1, BRIDGE: 2, REST: 1}
    assert result.by_function["_run (turnkit/store/sqlite_inline.py:144)"] == 7
    table = report(result, top=3)
    assert f"| {STORE} | 35% |" in table
    assert "_run (turnkit/store/sqlite_inline.py:144)" in table.splitlines()[-3]
    assert report(shares([]), top=3).startswith("no samples")
