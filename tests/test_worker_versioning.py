"""Deploying a new build of TurnKit's workers with Worker Versioning (Worker Deployments and build ids).

A versioned worker registers TurnKit's workflows with their versioning behaviour: a turn stays on the build that
started it, a lane moves to the current build. So a team rolls out a build by starting its workers beside the old
ones and making it current; the old build's workers drain the turns pinned to them.
"""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from temporalio.api.enums.v1 import VersioningBehavior
from temporalio.api.workflowservice.v1 import SetWorkerDeploymentCurrentVersionRequest
from temporalio.client import Client
from temporalio.common import WorkerDeploymentVersion
from temporalio.service import RPCError
from temporalio.worker import Worker, WorkerDeploymentConfig

import turnkit
from tests.engine import eventually
from turnkit._temporal.worker import deployment_config
from turnkit.plugin import TurnKitPlugin
from turnkit.runtime import TurnKit
from turnkit.store import Store
from turnkit.testing import ScriptedClient


@asynccontextmanager
async def _build(address: str, store: Store, deployment: str, build_id: str, queue: str) -> AsyncIterator[TurnKit]:
    """A worker of one build of ``deployment``, whose model client says which build answered, made current."""
    answer = f"answered by {build_id}"
    plugin = TurnKitPlugin(store, settings={"client": ScriptedClient(lambda request: answer)})
    client = await Client.connect(address, plugins=[plugin])
    version = WorkerDeploymentVersion(deployment_name=deployment, build_id=build_id)
    config = WorkerDeploymentConfig(version=version, use_worker_versioning=True)
    async with Worker(client, task_queue=queue, deployment_config=config):
        request = SetWorkerDeploymentCurrentVersionRequest(
            namespace=client.namespace, deployment_name=deployment, build_id=build_id
        )

        async def made_current() -> bool:
            try:
                await client.workflow_service.set_worker_deployment_current_version(request)
            except RPCError:  # the server has not seen this version's pollers yet
                return False
            return True

        await eventually(made_current, what=f"build {build_id} to become current")
        yield TurnKit(client, store, task_queue=queue)


async def _pinned_build(tk: TurnKit, workflow_id: str) -> str | None:
    """The build a workflow is pinned to (None: not pinned)."""
    info = (await tk.client.get_workflow_handle(workflow_id).describe()).raw_description.workflow_execution_info
    versioning = info.versioning_info
    if versioning.behavior != VersioningBehavior.VERSIONING_BEHAVIOR_PINNED:
        return None
    return versioning.deployment_version.build_id


async def test_a_new_build_takes_new_turns_while_a_pinned_turn_finishes_on_the_old_one(
    temporal_address: str, database_url: str
) -> None:
    """A turn started on build v1 (paused, waiting for a human) stays pinned to v1 after v2 becomes current and
    finishes there once resumed; a new turn runs on v2; the conversation's lane moved to v2."""
    turnkit.register(turnkit.Agent("versioned", model="scripted"))  # no client: each build's plugin carries its own
    deployment, queue = f"turnkit-{uuid.uuid4().hex[:8]}", f"versioned-{uuid.uuid4().hex[:8]}"
    store = await Store.open(database_url)
    try:
        async with _build(temporal_address, store, deployment, "v1", queue) as v1:
            conversation = await v1.conversation(turnkit.Agent("versioned", model="scripted"))
            await conversation.ask("first", wait=True)
            held = await conversation.ask("second, after approval", paused=True, wait=False)

            async def started() -> bool:
                return await _pinned_build(v1, held.id) is not None

            await eventually(started, what="the paused turn's workflow on v1")
            async with _build(temporal_address, store, deployment, "v2", queue) as v2:
                fresh = await v2.run(turnkit.Agent("versioned", model="scripted"), "hello")
                assert (fresh.status, fresh.output_text) == ("completed", "answered by v2")
                assert await _pinned_build(v2, fresh.id) == "v2"
                await held.resume()
                done = await held.result(timeout=60)
                assert (done.status, done.output_text) == ("completed", "answered by v1")
                assert await _pinned_build(v2, held.id) == "v1"
                lane = await v2.client.get_workflow_handle(conversation.id).describe()
                lane_info = lane.raw_description.workflow_execution_info.versioning_info
                assert lane_info.behavior == VersioningBehavior.VERSIONING_BEHAVIOR_AUTO_UPGRADE
    finally:
        await store.close()


def test_the_worker_command_takes_a_deployment_and_a_build_id_together() -> None:
    """``turnkit worker --deployment NAME --build-id ID`` runs a versioned worker; one without the other is refused."""
    config = deployment_config(argparse.Namespace(deployment="shop", build_id="2026-12-05.1"))
    assert config is not None and config.use_worker_versioning
    assert (config.version.deployment_name, config.version.build_id) == ("shop", "2026-12-05.1")
    assert deployment_config(argparse.Namespace(deployment=None, build_id=None)) is None
    with pytest.raises(turnkit.ConfigError, match="go together"):
        deployment_config(argparse.Namespace(deployment="shop", build_id=None))
