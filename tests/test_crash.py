"""Crash tests: worker processes are SIGKILLed mid-turn and replaced; the turn completes on the new worker."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

import turnkit
from tests import crash_app
from tests.engine import Engine, eventually
from tests.history_scenarios import history_events, local_activity_types
from tests.workers import WorkerProcess
from turnkit.agent import register
from turnkit.kernel.records import INTERRUPTED_MESSAGE

pytestmark = pytest.mark.crash


async def start_worker(engine: Engine, *args: str, **env: str) -> WorkerProcess:
    return await WorkerProcess.for_engine(engine, app="tests.crash_app", env=env, extra_args=args)


async def crash_and_recover(
    engine: Engine,
    agent: turnkit.Agent,
    text: str,
    *,
    killed_when: tuple[str, ...],
    on_release: Callable[[], None] | None = None,
    while_down: Callable[[turnkit.Turn], Awaitable[None]] | None = None,
    worker_args: tuple[str, ...] = (),
    **first_env: str,
) -> tuple[turnkit.Conversation, turnkit.Turn]:
    """Ask on a first worker, SIGKILL it once every trace in ``killed_when`` has a line, finish on a second worker."""
    register(agent)
    first = await start_worker(engine, *worker_args, **first_env)
    if "--no-sandbox" in worker_args:  # the worker says how it runs the workflows
        assert first.ready_line.endswith("(workflows unsandboxed)"), first.ready_line
    # ... and on which event loop: uvloop (installed with the test extra) unless asked for asyncio's.
    on_uvloop = "(uvloop)" in first.ready_line
    assert on_uvloop != ("asyncio" in worker_args), first.ready_line
    conversation = await engine.tk.conversation(agent)
    turn = await conversation.ask(text, wait=False)

    async def ready() -> bool:
        return all(crash_app.lines(name) for name in killed_when)

    await eventually(ready, what=f"{', '.join(killed_when)} on the first worker")
    await first.kill()
    if on_release is not None:
        on_release()
    if while_down is not None:
        await while_down(turn)  # what the store says with no worker running
    second = await start_worker(engine, *worker_args)
    try:
        done = await turn.result(timeout=120)
    finally:
        assert await second.stop() == 0  # SIGTERM: a graceful shutdown
    assert done.status == "completed", done.error
    return conversation, done


@pytest.mark.parametrize("agent", [crash_app.at_most_once, crash_app.at_most_once_local], ids=["activity", "local"])
async def test_at_most_once_tool_runs_once_and_is_interrupted(
    engine: Engine, crash_dir: Path, agent: turnkit.Agent
) -> None:
    """T45, T47: the worker dies while an at-most-once call runs (as an activity, or as a local activity inside the
    turn's workflow task); the new worker records it "interrupted" and never runs it again."""
    conversation, done = await crash_and_recover(engine, agent, "charge it", killed_when=("charge_card",))
    assert crash_app.lines("charge_card") == ["call"]  # the body ran exactly once, never again
    [execution] = await done.tool_executions()
    assert execution.status == "interrupted"
    assert execution.error == {"message": INTERRUPTED_MESSAGE}
    results = [m for m in await conversation.messages() if m.kind == "tool_result"]
    assert len(results) == 1 and "unknown" in results[0].content[0]["text"]
    assert results[0].metadata.get("interrupted") is True


async def test_replay_safe_tool_runs_again_with_the_same_key(engine: Engine, crash_dir: Path) -> None:
    _, done = await crash_and_recover(engine, crash_app.replay_safe, "sync", killed_when=("sync_inventory",))
    keys = crash_app.lines("sync_inventory")
    assert len(keys) == 2 and keys[0] == keys[1]  # ran again, with the same idempotency key
    [execution] = await done.tool_executions()
    assert execution.status == "completed"
    assert execution.result == {"synced": "A-1", "key": keys[0]}
    assert keys[0] == f"turnkit:tool:{execution.id}"


async def test_unsandboxed_workers_finish_a_turn_after_a_crash(engine: Engine, crash_dir: Path) -> None:
    """``worker.py --no-sandbox``: workers that run the workflows unsandboxed survive a kill like sandboxed ones (the
    new worker replays the turn's history and retries the tool with the same key)."""
    _, done = await crash_and_recover(
        engine, crash_app.replay_safe, "sync", killed_when=("sync_inventory",), worker_args=("--no-sandbox",)
    )
    keys = crash_app.lines("sync_inventory")
    assert len(keys) == 2 and keys[0] == keys[1]
    [execution] = await done.tool_executions()
    assert execution.status == "completed"


async def test_workers_on_asyncios_loop_finish_a_turn_after_a_crash(engine: Engine, crash_dir: Path) -> None:
    """``worker.py --loop asyncio``: workers on asyncio's own loop (the other tests' workers run on uvloop) survive a
    kill alike."""
    _, done = await crash_and_recover(
        engine, crash_app.replay_safe, "sync", killed_when=("sync_inventory",), worker_args=("--loop", "asyncio")
    )
    keys = crash_app.lines("sync_inventory")
    assert len(keys) == 2 and keys[0] == keys[1]
    [execution] = await done.tool_executions()
    assert execution.status == "completed"


@pytest.mark.parametrize("local_model", [False, True], ids=["activity", "local"])
async def test_committed_model_response_is_not_requested_again(
    engine: Engine, crash_dir: Path, local_model: bool
) -> None:
    """The worker dies after a model call committed its response (a regular activity, or a local one inside the
    turn's workflow task: the next worker replays that task and runs the call again with the same request id)."""
    turnkit.configure(model_local_activity=local_model)  # read by ask, which creates the turn
    conversation, done = await crash_and_recover(
        engine, crash_app.model_commit, "go", killed_when=("hung",), TURNKIT_CRASH_AFTER_MODEL_COMMIT="1"
    )
    requests = crash_app.lines("model")
    assert len(requests) == 2, requests  # one per iteration: the committed first response was reused
    assert len(set(requests)) == 2
    assert done.record.options.state.iterations == 2
    assistant = [m for m in await conversation.messages() if m.role == "assistant"]
    assert len(assistant) == 2  # no duplicate assistant message from the retried activity
    events = await history_events(engine.tk, done.id)
    assert ("turnkit.model" in local_activity_types(events)) == local_model


async def test_killing_the_worker_while_children_run(engine: Engine, crash_dir: Path) -> None:
    _, done = await crash_and_recover(
        engine,
        crash_app.orchestrator,
        "delegate",
        killed_when=("child_charge", "child_sync"),  # both children inside their tools
        on_release=(crash_dir / "release").touch,
    )
    assert done.output_text == "orchestrated"
    tree = await engine.tk.store.list_turns(root_turn_id=done.id)
    assert len(tree) == 3 and all(t.status == "completed" for t in tree)
    assert crash_app.lines("child_charge") == ["call"]  # at most once: never re-run
    synced = crash_app.lines("child_sync")
    assert len(synced) == 2 and synced[0] == synced[1]  # replay-safe: ran again with the same key
    executions = {e.tool_name: e for e in await engine.tk.store.list_tool_executions(root_turn_id=done.id)}
    assert executions["child_charge"].status == "interrupted"
    assert executions["child_sync"].status == "completed"
    assert executions["charger"].status == executions["syncer"].status == "completed"
    assert len(crash_app.lines("orchestrator_model")) == 2


async def test_steering_survives_a_crash_after_the_request_was_reserved(engine: Engine, crash_dir: Path) -> None:
    """T93: steer before the first run; the worker dies inside the model call the steering went into."""
    register(crash_app.steered)
    first = await start_worker(engine)
    conversation = await engine.tk.conversation(crash_app.steered)
    turn = await conversation.ask("draft the memo", paused=True)
    [receipt] = await turn.steer("use filings", key="s")
    await turn.resume()

    async def requested() -> bool:
        return bool(crash_app.lines("steered_model"))

    await eventually(requested, what="the first model request on the first worker")
    await first.kill()
    second = await start_worker(engine)
    try:
        done = await turn.result(timeout=120)
    finally:
        assert await second.stop() == 0
    assert done.status == "completed" and done.output_text == "steered answer", done.error
    request_ids = crash_app.lines("steered_model")
    assert len(request_ids) == 2 and request_ids[0] == request_ids[1]  # the reserved request, asked again
    steering = [m for m in await conversation.messages() if m.metadata.get("steering_id")]
    assert [m.text for m in steering] == ["use filings"]  # exactly one steering message
    [applied] = (await done.control_state())["controls"]["inputs"]
    assert applied["id"] == receipt["id"] and applied["message_id"] == steering[0].id
    assert applied["request_id"] == request_ids[0]  # the first request id is kept
    assert await done.steer("use filings", key="s") == [applied]  # same key and text: the identical receipt
    with pytest.raises(turnkit.Error, match="cannot steer a completed turn; post next-turn input instead"):
        await done.steer("more", key="s2")


async def test_killed_after_the_model_response_committed(engine: Engine, crash_dir: Path) -> None:
    """T43 / T52: the worker dies right after the tool-call response was committed."""

    async def phase_is_tools(turn: turnkit.Turn) -> None:
        assert (await turn.refresh()).record.options.state.phase == "tools"

    conversation, done = await crash_and_recover(
        engine,
        crash_app.noted,
        "note it",
        killed_when=("hung",),
        while_down=phase_is_tools,
        TURNKIT_CRASH_AFTER="model.completed",
    )
    assert len(crash_app.lines("model")) == 2  # the committed response was reused, not requested again
    assert crash_app.lines("file_note") == ["memo"]  # the tool ran exactly once
    assert done.record.options.state.iterations == 2
    results = [m for m in await conversation.messages() if m.kind == "tool_result"]
    assert len(results) == 1


async def test_killed_after_the_tool_result_committed(engine: Engine, crash_dir: Path) -> None:
    """T44: the worker dies right after the tool's result was committed, before the next model call."""
    conversation, done = await crash_and_recover(
        engine, crash_app.noted, "note it", killed_when=("hung",), TURNKIT_CRASH_AFTER="tool_call.completed"
    )
    assert crash_app.lines("file_note") == ["memo"]  # the tool count stays 1
    assert len(crash_app.lines("model")) == 2
    [execution] = await done.tool_executions()
    assert execution.status == "completed" and execution.result == {"filed": "memo"}
    results = [m for m in await conversation.messages() if m.kind == "tool_result"]
    assert len(results) == 1  # exactly one tool result


# -- every paid call once: the worker killed during each kind of paid call ---------------------------------------------


async def _ask_plainly(conversation: turnkit.Conversation) -> turnkit.Turn:
    return await conversation.ask("go", wait=False)


async def _ask_to_compact(conversation: turnkit.Conversation) -> turnkit.Turn:
    for i in range(3):
        await conversation.say(f"note {i}")
    return await conversation.ask("go", compact=True, wait=False)


async def _ask_about_the_image(conversation: turnkit.Conversation) -> turnkit.Turn:
    image = turnkit.MediaInput.bytes(crash_app.CRASH_PNG, mime_type="image/png")
    return await conversation.ask("what is it?", media=[image], wait=False)


PAID_KINDS = {
    # kind hung on the first worker: (agent, how its turn is asked, calls the provider answers in all)
    "main": (crash_app.paid_main, _ask_plainly, {"main": 1}),
    "judge": (crash_app.paid_judged, _ask_plainly, {"main": 1, "judge": 1}),
    "summary": (crash_app.paid_compacted, _ask_to_compact, {"summary": 1, "main": 1}),
    # ImageTool is at most once: the lost paint is "interrupted", never asked again, and the model is told.
    "paint": (crash_app.paid_painted, _ask_plainly, {"main": 2}),
    "view_media": (crash_app.paid_viewed, _ask_about_the_image, {"main": 2, "view_media": 1}),
    # The painter specialist's paint_image is replay-safe, and ends the turn; its answer is judged in the finish,
    # whose attempt on the killed worker must be retried within the heartbeat timeout, not the model call's timeout.
    "specialist": (crash_app.paid_specialist, _ask_plainly, {"main": 1, "paint": 1, "judge": 1}),
    "specialist_judge": (crash_app.paid_specialist, _ask_plainly, {"main": 1, "paint": 1, "judge": 1}),
}
#: The provider's kind of call each case holds when the worker dies.
HUNG_KIND = {"specialist": "paint", "specialist_judge": "judge"}


@pytest.mark.parametrize("hung", list(PAID_KINDS))
async def test_a_worker_killed_during_a_paid_call_pays_each_call_once(
    engine: Engine, crash_dir: Path, hung: str
) -> None:
    """Every paid call once (behaviour §3.9, §6.2; docs/design.md "Every paid call once"): the worker is SIGKILLed
    while the provider holds a call of each kind (the turn's model, an output-policy judge, the compaction summary,
    a tool's paint, a tool's view_media, the painter specialist's paint and its judge, asked in the turn's finish).
    The new worker finishes the turn; only the call that was in flight is asked again (a replay-safe one) or settled
    "interrupted" (an at-most-once one), never a call whose answer was committed; and the provider's own count of
    the calls it answered equals what the store charged: the tree's cost is exactly the sum of the answered calls'
    prices."""
    agent, ask, answered = PAID_KINDS[hung]
    kind = HUNG_KIND.get(hung, hung)
    turnkit.configure(model_heartbeat_timeout=2.0, tool_heartbeat_timeout=2.0)  # the turn's policy, set by ask
    register(agent)
    first = await start_worker(engine, TURNKIT_CRASH_HANG=kind)
    turn = await ask(await engine.tk.conversation(agent))

    async def holding() -> bool:
        return bool(crash_app.lines("paid_hung"))

    await eventually(holding, what=f"the first worker inside its {kind} call")
    await first.kill()
    second = await start_worker(engine)
    try:
        done = await turn.result(timeout=120)
    finally:
        assert await second.stop() == 0
    assert done.status == "completed", done.error
    asked, paid = crash_app.lines("asked"), crash_app.lines("answered")
    assert {k: paid.count(k) for k in set(paid)} == answered  # the one in flight was lost, never answered
    for other in set(asked) - {kind}:
        assert asked.count(other) == paid.count(other), f"a committed {other} call was asked again"
    assert asked.count(kind) == paid.count(kind) + 1  # the call held when the worker died
    assert done.cost.total == pytest.approx(sum(crash_app.PAID_COSTS[k] for k in paid))  # provider's count == store's
