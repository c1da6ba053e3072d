"""Application module for the crash tests: imported by real worker processes (``worker.py --app tests.crash_app``).

Tools and the model leave traces in ``$TURNKIT_CRASH_DIR`` (one line per call) so the test process can tell what
ran where, and block forever at the moment the test wants the worker killed.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from pathlib import Path
from typing import Any, ClassVar

import turnkit
from turnkit.events import Event
from turnkit.media_requests import PaintRequest, ViewMediaRequest, analysis_result
from turnkit.media_tools import ImageTool, ViewMediaTool
from turnkit.model import ToolCall
from turnkit.specialists.agents import painter
from turnkit.testing import ScriptedClient, call_tools, image
from turnkit.tools import Recovery

# Crash tests want dead workers noticed quickly.
turnkit.configure(model_heartbeat_timeout=2.0, tool_heartbeat_timeout=2.0)


def crash_dir() -> Path:
    return Path(os.environ["TURNKIT_CRASH_DIR"])


def record(name: str, line: str = "call") -> int:
    """Append a line to ``<crash dir>/<name>`` and return how many lines it now has."""
    path = crash_dir() / name
    with path.open("a") as handle:
        handle.write(line + "\n")
    return len(path.read_text().splitlines())


def lines(name: str) -> list[str]:
    path = crash_dir() / name
    return path.read_text().splitlines() if path.exists() else []


async def _charge(amount: int) -> dict[str, Any]:
    """An external effect that must run at most once. The first call hangs until the worker is killed.

    Args:
        amount: Cents to charge.
    """
    if record("charge_card") == 1:
        await asyncio.sleep(3600)
    return {"charged": amount}


charge_card = turnkit.tool(name="charge_card", timeout=4)(_charge)
#: The same tool as a local one: it runs inside the turn's workflow task when the worker is killed.
charge_card_local = turnkit.tool(name="charge_card", timeout=4, local=True)(_charge)


@turnkit.tool(recovery="replay_safe", timeout=4, max_attempts=5, initial_retry_interval=0.2)
async def sync_inventory(sku: str, context: turnkit.ToolContext) -> dict[str, Any]:
    """A replay-safe effect keyed by its idempotency key. The first call hangs until the worker is killed.

    Args:
        sku: The item.
    """
    if record("sync_inventory", context.idempotency_key) == 1:
        await asyncio.sleep(3600)
    return {"synced": sku, "key": context.idempotency_key}


def _scripted(tool_call: tuple[str, dict[str, Any]]) -> ScriptedClient:
    def script(request: turnkit.ModelRequest) -> turnkit.Result:
        record("model", str(request.metadata.get("request_id")))
        if any(m["role"] == "tool" for m in request.messages):
            return turnkit.Result.build(text="finished")
        return call_tools(tool_call)

    return ScriptedClient(script)


at_most_once = turnkit.register(
    turnkit.Agent(
        "at_most_once", model="scripted", tools=[charge_card], client=_scripted(("charge_card", {"amount": 500}))
    )
)
at_most_once_local = turnkit.register(
    turnkit.Agent(
        "at_most_once_local",
        model="scripted",
        tools=[charge_card_local],
        client=_scripted(("charge_card", {"amount": 500})),
    )
)
replay_safe = turnkit.register(
    turnkit.Agent(
        "replay_safe", model="scripted", tools=[sync_inventory], client=_scripted(("sync_inventory", {"sku": "A-1"}))
    )
)
model_commit = turnkit.register(
    turnkit.Agent(
        "model_commit", model="scripted", tools=[sync_inventory], client=_scripted(("sync_inventory", {"sku": "B-2"}))
    )
)


class _HangInFirstRequest:
    """Traces each request id; the first request hangs (its reservation is committed) until the worker is killed."""

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        if record("steered_model", str(request.metadata.get("request_id"))) == 1:
            await asyncio.sleep(3600)
        return turnkit.Result.build(text="steered answer")


steered = turnkit.register(turnkit.Agent("steered", model="scripted", client=_HangInFirstRequest()))


@turnkit.tool
def file_note(text: str) -> dict[str, Any]:
    """An at-most-once effect that returns at once (it never hangs), so a test can count its runs.

    Args:
        text: The note.
    """
    record("file_note", text)
    return {"filed": text}


noted = turnkit.register(
    turnkit.Agent("noted", model="scripted", tools=[file_note], client=_scripted(("file_note", {"text": "memo"})))
)

#: Which committed event freezes the worker: ``TURNKIT_CRASH_AFTER=model.completed`` (or the older
#: ``TURNKIT_CRASH_AFTER_MODEL_COMMIT=1``) or ``TURNKIT_CRASH_AFTER=tool_call.completed``.
_CRASH_POINTS = {"model.completed": "TURNKIT_CRASH_AFTER_MODEL_COMMIT"}


def _hang_after_commit(event: Event) -> None:
    """Freeze the worker right after the first event of the chosen kind, i.e. after that write committed."""
    chosen = os.environ.get("TURNKIT_CRASH_AFTER") == event.type or bool(
        os.environ.get(_CRASH_POINTS.get(event.type, "-"))
    )
    if chosen and not lines("hung"):
        record("hung", event.turn_id)
        time.sleep(3600)  # blocks this activity (the callback runs in a thread): it never reports, as if dead


turnkit.configure(on_event=_hang_after_commit)


async def _hold_until_released() -> None:
    while not (crash_dir() / "release").exists():
        await asyncio.sleep(0.05)


@turnkit.tool(timeout=4)
async def child_charge(amount: int) -> dict[str, Any]:
    """At most once; blocks until the test releases it.

    Args:
        amount: Cents.
    """
    record("child_charge")
    await _hold_until_released()
    return {"charged": amount}


@turnkit.tool(recovery="replay_safe", timeout=4, max_attempts=5, initial_retry_interval=0.2)
async def child_sync(sku: str, context: turnkit.ToolContext) -> dict[str, Any]:
    """Replay-safe; blocks until the test releases it.

    Args:
        sku: The item.
    """
    record("child_sync", context.idempotency_key)
    await _hold_until_released()
    return {"synced": sku}


charger = turnkit.Agent(
    "charger", model="scripted", tools=[child_charge], client=_scripted(("child_charge", {"amount": 1}))
)
syncer = turnkit.Agent("syncer", model="scripted", tools=[child_sync], client=_scripted(("child_sync", {"sku": "C"})))


def _orchestrate(request: turnkit.ModelRequest) -> turnkit.Result:
    record("orchestrator_model")
    if any(m["role"] == "tool" for m in request.messages):
        return turnkit.Result.build(text="orchestrated")
    return call_tools(("charger", {"task": "charge"}), ("syncer", {"task": "sync"}))


orchestrator = turnkit.register(
    turnkit.Agent("orchestrator", model="scripted", sub_agents=[charger, syncer], client=ScriptedClient(_orchestrate))
)


# -- paid calls: the worker killed during each kind of paid call -------------------------------------------------------

#: What one call of each kind costs: distinct magnitudes, so a tree's cost says how many calls of each kind it paid.
PAID_COSTS = {"main": 0.00001, "summary": 0.0001, "judge": 0.001, "paint": 0.01, "view_media": 0.1}
#: An image the viewing agent's turn is asked about (its id is derived from its bytes).
CRASH_PNG = b"\x89PNG\r\n\x1a\n" + b"IHDR crash test image" + bytes(range(64))
CRASH_MEDIA_ID = "media_" + hashlib.sha256(CRASH_PNG).hexdigest()[:24]


async def _paid(kind: str, answer: turnkit.Result) -> turnkit.Result:
    """A provider's side of one paid call: traced in ``asked``; the first call of the kind named by
    ``TURNKIT_CRASH_HANG`` hangs until the worker is killed (traced in ``paid_hung``); an answered call is traced in
    ``answered``, the provider's own count of the calls it is paid for."""
    record("asked", kind)
    if os.environ.get("TURNKIT_CRASH_HANG") == kind and not lines("paid_hung"):
        record("paid_hung", kind)
        await asyncio.sleep(3600)
    record("answered", kind)
    return answer.model_copy(update={"usage": turnkit.Usage(input_tokens=1, cost=PAID_COSTS[kind])})


class PaidProvider:
    """Every kind of paid call: the turn's own (``main``: ``proposal`` first, then "done" once a tool answered), the
    compaction summary, an output-policy judge (approving), ``paint`` and ``view_media``."""

    def __init__(self, proposal: tuple[str, dict[str, Any]] | None = None) -> None:
        self.proposal = proposal

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        if request.metadata.get("compaction"):
            return await _paid("summary", turnkit.Result.build(text="## Active Task\nThe notes."))
        if request.metadata.get("purpose") == "output_policy":
            return await _paid("judge", turnkit.Result.build(text='{"approved": true, "violations": []}'))
        if self.proposal is None or any(m["role"] == "tool" for m in request.messages):
            return await _paid("main", turnkit.Result.build(text="done"))
        name, arguments = self.proposal
        return await _paid("main", call_tools(ToolCall.parse("call_paid", name, dict(arguments))))

    async def paint(self, request: PaintRequest) -> turnkit.Result:
        return await _paid("paint", image(CRASH_PNG))

    async def view_media(self, request: ViewMediaRequest) -> turnkit.Result:
        answer = analysis_result(turnkit.Result.build(text="a test image"), request, provider="paid")
        return await _paid("view_media", answer)


class RetriedViewMedia(ViewMediaTool):
    """``view_media`` declared safe to run again: a lost attempt is retried (the analysis is asked again)."""

    name = "view_media"
    recovery: ClassVar[Recovery] = "replay_safe"


def _allow(request: Any, context: Any = None) -> bool:
    return True


paid_main = turnkit.register(turnkit.Agent("paid_main", model="scripted", client=PaidProvider()))
paid_judged = turnkit.register(
    turnkit.Agent(
        "paid_judged", model="scripted", client=PaidProvider(), output_policy=turnkit.OutputPolicy("Be brief.")
    )
)
paid_compacted = turnkit.register(
    turnkit.Agent("paid_compacted", model="scripted", client=PaidProvider(), compaction={"tail_messages": 1})
)
paid_painted = turnkit.register(
    turnkit.Agent(
        "paid_painted",
        model="scripted",
        client=PaidProvider(("paint", {"prompt": "a cat"})),
        tools=[ImageTool(model="paid-image")],
    )
)
paid_viewed = turnkit.register(
    turnkit.Agent(
        "paid_viewed",
        model="scripted",
        client=PaidProvider(("view_media", {"media_id": CRASH_MEDIA_ID, "objective": "what is it"})),
        tools=[RetriedViewMedia()],
    )
)
paid_specialist = turnkit.register(
    painter(
        model="scripted",
        authorization=_allow,
        image_model="paid-image",
        client=PaidProvider(("paint_image", {"prompt": "a cat"})),
        output_policy=turnkit.OutputPolicy("Be brief."),  # its terminal answer is judged in the turn's finish
    )
)
