"""``bench.cpu_profile`` charges each activity the CPU of its own code (the figure bench/README.md quotes per call)."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput

from bench.cpu_profile import ActivityCpu, Round, report_activity_cpu, report_extra
from bench.server_work import counters, differences


class _Busy(ActivityInboundInterceptor):
    """An activity that spends ``seconds`` of CPU, then waits (a wait is charged nothing)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        end = time.thread_time() + self.seconds
        while time.thread_time() < end:
            pass
        await asyncio.sleep(0.05)
        return "done"


async def test_an_activity_is_charged_its_own_cpu_only_while_the_clock_is_on(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Off, nothing is counted; on, each call is charged the CPU it spent and not the time it waited; the report
    gives calls and CPU per turn and their share of the process's CPU."""
    clock = ActivityCpu()
    timed = clock.intercept_activity(_Busy(0.02))
    call: Any = None  # the interceptor passes its input through untouched
    assert await timed.execute_activity(call) == "done"
    assert not clock.spent
    clock.on = True
    for _ in range(2):
        await timed.execute_activity(call)
    (kind, spent), *others = clock.spent.items()
    assert kind == "outside an activity" and not others  # no Temporal activity is running here
    assert len(spent) == 2 and all(0.02 <= seconds < 0.045 for seconds in spent)
    report_activity_cpu(clock, turns=2, process_per_turn=0.1)
    out = capsys.readouterr().out
    assert "the activities' own code" in out and "of the process's CPU per turn" in out
    assert "outside an activity" in out and "1.0 per turn" in out


def test_what_turnkit_adds_over_bare_temporal_is_median_against_median_by_thread(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The extra per turn is TurnKit's median round against bare Temporal's, in all and for each thread group; the
    dev server's row is named as its own process (it is not in the process's total)."""
    server = "(the dev server process, not in the total)"

    def round_of(cpu: float, loop: float, dev_server: float) -> Round:
        return Round(turns=10, wall=1.0, cpu=cpu, groups={"event loop": loop, server: dev_server})

    turnkit = [round_of(1.0, 0.6, 1.2), round_of(1.2, 0.7, 1.1), round_of(5.0, 4.0, 9.0)]  # one noisy round
    bare = [round_of(0.6, 0.3, 1.0), round_of(0.7, 0.3, 0.9), round_of(0.5, 0.2, 0.8)]
    report_extra(turnkit, bare)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-3].split()[-2:] == ["+60.0", "ms/turn"]  # medians 120 and 60 ms per turn
    assert lines[-2].startswith("  the dev server (its own process)") and lines[-2].split()[-2] == "+30.0"
    assert "event loop" in lines[-1] and lines[-1].split()[-2] == "+40.0"


_EXPOSITION = """\
# HELP service_requests service_requests counter
# TYPE service_requests counter
service_requests{namespace="default",operation="AddWorkflowTask",service_name="matching",taskqueue="bench-bare-1"} 18
service_requests{namespace="default",operation="AddWorkflowTask",service_name="matching",taskqueue="sticky-1"} 2
# HELP persistence_latency persistence_latency histogram
# TYPE persistence_latency histogram
persistence_latency_bucket{operation="CreateTasks",le="0.001"} 7
persistence_latency_count{operation="CreateTasks"} 7
# TYPE new_timer_notifications counter
new_timer_notifications{operation="TimerQueueProcessor",service_name="history"} 11.5
"""


def test_the_dev_servers_counters_are_compared_per_turn_under_the_same_names() -> None:
    """Only counters are read; a system's own task queues are merged into one series; a counter is reported when
    the two systems' per-turn medians differ by more than 5%, and not when they are equal."""
    counted = counters(_EXPOSITION)
    requests = 'service_requests{namespace="default",operation="AddWorkflowTask",service_name="matching"}'
    timers = 'new_timer_notifications{operation="TimerQueueProcessor",service_name="history"}'
    assert counted == {requests: 20.0, timers: 11.5}  # the histogram is left out
    ours = [{requests: 40.0, timers: 90.0}, {requests: 40.0, timers: 80.0}, {requests: 40.0, timers: 10.0}]
    bare = [{requests: 40.0, timers: 45.0}, {requests: 40.0, timers: 40.0}]
    assert differences(ours, bare, turns=2) == [(timers, 40.0, 21.25)]
