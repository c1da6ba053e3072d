"""``turnkit replay``: replay recorded workflow histories on today's code, configured exactly like a worker.

The replayer is ``Replayer(workflows=[], plugins=[TurnKitPlugin(strict_sandbox=True)])`` (the plugin registers the
workflows; the strict sandbox re-imports them for every run, so a forbidden call in workflow code fails). Each
history is replayed on its own, bounded by a timeout; a nondeterminism failure is reported with the SDK's own words
(the recorded event and the command the code issued instead). ``TurnWorkflow`` reads tool retry policies from the
agent registry while replaying, so the application's agents must be registered first (``--app``).
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from temporalio import workflow
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.worker import Replayer

from turnkit._temporal.histories import Run

__all__ = ["ReplayOutcome", "describe", "replay_runs", "report", "turnkit_replayer"]

_CORE_MESSAGE = re.compile(r'message: "(.*?)", source:', re.DOTALL)


@dataclass(frozen=True)
class ReplayOutcome:
    """What replaying one run gave: ``ok``, ``nondeterministic`` (the code no longer fits the history), or
    ``failed`` (another replay failure, a timeout included), with a message a person can act on."""

    run: Run
    status: str
    message: str = ""

    @property
    def ok(self) -> bool:
        """Whether the run replayed without failure."""
        return self.status == "ok"


def turnkit_replayer(*, quiet: bool = False) -> Replayer:
    """A replayer configured like a TurnKit worker (converter, sandbox pass-through, workflows), in the strict sandbox.

    ``quiet`` gives it its own SDK runtime that logs errors only: the SDK core warns about every failed workflow task,
    which :func:`report` already describes (for a command; a process needs only one such runtime).
    """
    from turnkit.plugin import TurnKitPlugin

    return Replayer(
        workflows=[], plugins=[TurnKitPlugin(strict_sandbox=True)], runtime=_quiet_runtime() if quiet else None
    )


@functools.cache
def _quiet_runtime() -> Runtime:
    """One SDK runtime per process whose core logs errors only."""
    quiet_logs = LoggingConfig(filter=TelemetryFilter(core_level="ERROR", other_level="ERROR"))
    return Runtime(telemetry=TelemetryConfig(logging=quiet_logs))


async def replay_runs(
    runs: Sequence[Run], *, replayer: Replayer | None = None, timeout: float = 30.0
) -> list[ReplayOutcome]:
    """Replay every run, each within ``timeout`` seconds; one outcome per run, in order.

    A run that cannot be replayed yet (no workflow task completed and not closed) is skipped by the caller; see
    :attr:`Run.replayable`.
    """
    replayer = replayer or turnkit_replayer()
    outcomes: list[ReplayOutcome] = []
    for run in runs:
        replaying = asyncio.create_task(replayer.replay_workflow(run.history, raise_on_replay_failure=False))
        await asyncio.wait([replaying], timeout=timeout)
        if not replaying.done():
            await _abandon(replaying)
            outcomes.append(ReplayOutcome(run, "failed", f"replay did not finish within {timeout:g} s"))
            continue
        result = replaying.result()
        failure = result.replay_failure
        if failure is None:
            outcomes.append(ReplayOutcome(run, "ok"))
        elif isinstance(failure, workflow.NondeterminismError):
            outcomes.append(ReplayOutcome(run, "nondeterministic", _core_message(failure)))
        else:
            outcomes.append(ReplayOutcome(run, "failed", f"{type(failure).__name__}: {_core_message(failure)}"))
    return outcomes


def describe(outcome: ReplayOutcome) -> str:
    """One line for an outcome: ``OK <type> <workflow id> run <run id> (<n> events)`` or the failure in words."""
    run = outcome.run
    where = f"{run.workflow_type} {run.workflow_id} run {run.run_id}"
    if outcome.ok:
        return f"OK  {where} ({len(run.history.events)} events)"
    if outcome.status == "nondeterministic":
        return (
            f"NONDETERMINISM  {where}: {outcome.message}\n"
            "    the history recorded the first thing named, today's code issued the second: a change to this "
            "workflow needs workflow.patched(...) to keep old runs replaying"
        )
    hint = (
        " (pass --app with the module that registers it, as for the worker)"
        if "register agent" in outcome.message
        else ""
    )
    return f"FAILED  {where}: {outcome.message}{hint}"


async def _abandon(task: asyncio.Task[object]) -> None:
    """Cancel a stuck replay. The replayer's clean-up first awaits its worker, which a stuck history never lets
    finish; a second cancellation gets past that to the worker's shutdown, so cancel until the task is done."""
    for _ in range(40):
        task.cancel()
        await asyncio.wait([task], timeout=0.25)
        if task.done():
            return


def _core_message(error: BaseException) -> str:
    """The SDK core's message inside an activation failure (e.g. ``[TMPRL1100] Nondeterminism error: ...``), else
    the error's own text."""
    text = str(error)
    found = _CORE_MESSAGE.search(text)
    return found.group(1).replace('\\"', '"').replace("\\'", "'") if found else text


def report(outcomes: Sequence[ReplayOutcome], skipped: Sequence[Run] = (), *, out: TextIO | None = None) -> int:
    """Print one line per run (and per skipped run) and a summary; the exit status: 0 when every run replayed."""
    stream = out or sys.stdout
    for run in skipped:
        print(
            f"SKIP  {run.workflow_type} {run.workflow_id} run {run.run_id}: no workflow task completed yet", file=stream
        )
    for outcome in outcomes:
        print(describe(outcome), file=stream)
    bad = [outcome for outcome in outcomes if not outcome.ok]
    workflows = len({outcome.run.workflow_id for outcome in outcomes})
    verdict = "all OK" if not bad else f"{len(bad)} FAILED"
    print(f"replayed {len(outcomes)} run(s) of {workflows} workflow(s): {verdict}", file=stream)
    return 1 if bad else 0
