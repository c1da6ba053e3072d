"""The workflows a TurnKit worker (and the replayer) registers.

A worker with Worker Versioning (``Worker(deployment_config=WorkerDeploymentConfig(…, use_worker_versioning=True))``,
``turnkit worker --deployment NAME --build-id ID``) registers the same workflows with their versioning behaviour
(:data:`VERSIONED_WORKFLOWS`; the server refuses a behaviour from an unversioned worker, so the plain classes carry
none):

* a turn is PINNED: it finishes on the build that started it. Turns last minutes, or as long as a human takes to
  resume one, so the old build's workers drain them, and a change to ``TurnWorkflow`` needs no patch for them.
* a lane AUTO_UPGRADEs: it moves to the current build at its next workflow task. It lives as long as its conversation
  and would pin an old build forever, so a change to ``ConversationWorkflow`` goes through ``workflow.patched``.
* a client's request (a cancel, a manual compaction, a standalone media call) is PINNED: it lasts one request.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import VersioningBehavior

from turnkit._workflows.lane import ConversationWorkflow
from turnkit._workflows.requests import CancelWorkflow, CompactionWorkflow, StandaloneMediaWorkflow
from turnkit._workflows.turn import TurnWorkflow
from turnkit.kernel.names import (
    CANCEL_WORKFLOW,
    COMPACTION_WORKFLOW,
    LANE_WORKFLOW,
    STANDALONE_MEDIA_WORKFLOW,
    TURN_WORKFLOW,
)
from turnkit.kernel.payloads import LaneInput, TurnInput, TurnOutcome
from turnkit.kernel.requests import CancelPlan, CancelRequest, CompactRequest, StandaloneMedia, StandaloneOutcome

__all__ = [
    "ALL_WORKFLOWS",
    "VERSIONED_WORKFLOWS",
    "PinnedCancelWorkflow",
    "PinnedCompactionWorkflow",
    "PinnedStandaloneMediaWorkflow",
    "PinnedTurnWorkflow",
    "UpgradingConversationWorkflow",
]

#: Every workflow a TurnKit worker (and the replayer) registers.
ALL_WORKFLOWS: list[type] = [
    ConversationWorkflow,
    TurnWorkflow,
    CancelWorkflow,
    CompactionWorkflow,
    StandaloneMediaWorkflow,
]


@workflow.defn(name=TURN_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class PinnedTurnWorkflow(TurnWorkflow):
    """``TurnWorkflow`` on a worker with Worker Versioning: pinned to the build that started it."""

    @workflow.run
    async def run(self, turn: TurnInput) -> TurnOutcome:
        return await super().run(turn)


@workflow.defn(name=LANE_WORKFLOW, versioning_behavior=VersioningBehavior.AUTO_UPGRADE)
class UpgradingConversationWorkflow(ConversationWorkflow):
    """``ConversationWorkflow`` on a worker with Worker Versioning: moves to the current build."""

    @workflow.run
    async def run(self, lane: LaneInput) -> None:
        await super().run(lane)


@workflow.defn(name=CANCEL_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class PinnedCancelWorkflow(CancelWorkflow):
    """``CancelWorkflow`` on a worker with Worker Versioning: pinned to the build that started it."""

    @workflow.run
    async def run(self, request: CancelRequest) -> CancelPlan:
        return await super().run(request)


@workflow.defn(name=COMPACTION_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class PinnedCompactionWorkflow(CompactionWorkflow):
    """``CompactionWorkflow`` on a worker with Worker Versioning: pinned to the build that started it."""

    @workflow.run
    async def run(self, request: CompactRequest) -> str:
        return await super().run(request)


@workflow.defn(name=STANDALONE_MEDIA_WORKFLOW, versioning_behavior=VersioningBehavior.PINNED)
class PinnedStandaloneMediaWorkflow(StandaloneMediaWorkflow):
    """``StandaloneMediaWorkflow`` on a worker with Worker Versioning: pinned to the build that started it."""

    @workflow.run
    async def run(self, request: StandaloneMedia) -> StandaloneOutcome:
        return await super().run(request)


#: What a versioned worker registers instead of each of :data:`ALL_WORKFLOWS`.
VERSIONED_WORKFLOWS: dict[type, type] = {
    TurnWorkflow: PinnedTurnWorkflow,
    ConversationWorkflow: UpgradingConversationWorkflow,
    CancelWorkflow: PinnedCancelWorkflow,
    CompactionWorkflow: PinnedCompactionWorkflow,
    StandaloneMediaWorkflow: PinnedStandaloneMediaWorkflow,
}
