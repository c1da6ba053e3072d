"""Application module of the chaos suite (issue 8): the agents of a small multi-agent job, tools that count their
real effects in files, and the worker-side faults. Real worker processes load it (``worker.py --app
tests.chaos_app`` with ``TURNKIT_CHAOS_WORKER=1``); the test process imports it for the same agent definitions.

The job: ``lead`` delegates to two sub-agents in parallel (``scout`` runs a replay-safe ``sync_inventory``, ``clerk``
an at-most-once ``charge_card``), launches ``reporter`` with a completion callback, charges the order itself (at
most once; after a *failed* charge it tries once more, as a model would, but never after an ``interrupted`` one),
and answers. The callback later wakes ``lead``'s conversation for a second turn. ``reporter``'s answer is audited by
an output policy (a judge's call); ``scribe``'s notes are compacted (``Conversation.compact``), then summarised again
before it answers (a turn's compaction summary);
``illustrator`` paints in a prepared turn (a standalone paint); ``designer``, the painter specialist, paints a logo.
Every provider here traces each call it answered (:class:`Priced`), so a seed can hold the store's charges to the
providers' count. ``scout``'s and ``clerk``'s tools are local tool calls (``@tool(local=True)``), ``lead``'s charge
is an activity: the faults reach both kinds (a kill loses a local call's workflow task, a lost completion fails its
local attempt), and the store's bookkeeping must hold the at-most-once line for both.

Effects land in ``$TURNKIT_CHAOS_DIR/effects/<tool>/<effect id>``, one line per run of the body: an at-most-once
effect (a charge of one order) must have at most one line, whatever happened to workers, servers and databases.

Worker-side faults are read from ``$TURNKIT_CHAOS_DIR/faults.json`` at each decision, so one worker process serves
every seed: ``lose`` (probability that an activity's first attempt loses its completion *after* its body
committed: Temporal retries a committed activity), ``hook`` (``slow`` or ``raising`` authorization), and hang
points (``$TURNKIT_CHAOS_DIR/hang/<point>``: the body blocks there until the test kills the worker).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

import turnkit
from turnkit._engine.builtin_tools import launch_agent
from turnkit.media_requests import PaintRequest
from turnkit.model import Client, ModelRequest, Result
from turnkit.specialists.agents import painter
from turnkit.testing import ScriptedClient, call_tools, image

#: Where a worker can be killed: a tool body (``charge``, ``sync``), a model call (``reporter``), an output-policy
#: judge's call (``judge``), a turn's compaction summary (``summary``), ``Conversation.compact``'s (``compaction``), a
#: standalone paint (``paint``) and the painter specialist's paint (``specialist``).
HANG_POINTS = ("charge", "sync", "reporter", "judge", "summary", "compaction", "paint", "specialist")
#: What every answered call of the job costs: a seed's spend in the store says how many calls it charged, and the
#: providers' own trace (``calls/<order>``) says how many they answered.
PRICE = 0.001
_ORDER = re.compile(r"ord-\d+-[0-9a-f]{6}")
_PNG = b"\x89PNG\r\n\x1a\n" + b"chaos label" + bytes(range(32))


def chaos_dir() -> Path:
    return Path(os.environ["TURNKIT_CHAOS_DIR"])


def faults() -> dict[str, Any]:
    """The worker-side fault settings of the current seed."""
    try:
        return json.loads((chaos_dir() / "faults.json").read_text())
    except (OSError, ValueError):
        return {}


def effect(tool: str, effect_id: str, line: str) -> None:
    """Record one real run of a tool body."""
    folder = chaos_dir() / "effects" / tool
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / effect_id).open("a") as handle:
        handle.write(line + "\n")


async def hang_point(point: str) -> None:
    """Block forever (until the worker is killed) if the test armed ``point``; record that it got there."""
    if (chaos_dir() / "hang" / point).exists():
        (chaos_dir() / "hung").mkdir(exist_ok=True)
        (chaos_dir() / "hung" / point).write_text(str(os.getpid()))  # which worker to kill
        while (chaos_dir() / "hang" / point).exists():
            await asyncio.sleep(0.05)


async def _charge(order: str, amount: int, context: turnkit.ToolContext) -> dict[str, Any]:
    """Charge an order (an external effect: at most once).

    Args:
        order: The order id (one charge per order).
        amount: Cents.
    """
    effect("charge_card", order, context.idempotency_key)
    await hang_point("charge")
    return {"charged": amount, "order": order}


#: ``lead`` charges through an activity, ``clerk`` through a local tool call: the same at-most-once line for both.
charge_card = turnkit.tool(name="charge_card", timeout=5)(_charge)
charge_card_local = turnkit.tool(name="charge_card", timeout=5, local=True)(_charge)


@turnkit.tool(recovery="replay_safe", timeout=5, max_attempts=8, initial_retry_interval=0.2, local=True)
async def sync_inventory(sku: str, context: turnkit.ToolContext) -> dict[str, Any]:
    """Sync one item (replay-safe: runs again with the same idempotency key).

    Args:
        sku: The item.
    """
    effect("sync_inventory", context.idempotency_key, sku)
    await hang_point("sync")
    return {"synced": sku}


def _turn_messages(request: ModelRequest) -> list[dict[str, Any]]:
    """The messages of the current turn: everything after the last user message."""
    last_user = max((i for i, m in enumerate(request.messages) if m["role"] == "user"), default=-1)
    return request.messages[last_user + 1 :]


def _results(messages: list[dict[str, Any]], name: str) -> list[str]:
    """The result texts of this turn's calls of tool ``name``."""
    ids = {c["id"] for m in messages for c in m.get("tool_calls") or [] if c["name"] == name}
    return [str(m["content"]) for m in messages if m["role"] == "tool" and m.get("tool_call_id") in ids]


def _order(request: ModelRequest) -> str:
    users = [str(m["content"]) for m in request.messages if m["role"] == "user" and "order " in str(m["content"])]
    return users[-1].split("order ", 1)[1].split()[0] if users else "unknown"


def _lead(request: ModelRequest) -> Result:
    last = request.messages[-1] if request.messages else {}
    if last.get("role") == "user" and '"turn_id"' in str(last.get("content")):
        return Result.build(text="noted the report")  # the completion callback woke this conversation
    turn = _turn_messages(request)
    order = _order(request)
    if not _results(turn, "scout") and not _results(turn, "clerk"):
        return call_tools(("scout", {"task": f"sync stock for order {order}"}), ("clerk", {"task": f"order {order}-c"}))
    if not _results(turn, "launch_agent"):
        return call_tools(
            ("launch_agent", {"agent_name": "reporter", "task": f"report order {order}", "callback": True})
        )
    charges = _results(turn, "charge_card")
    failed = [c for c in charges if '"error": true' in c and "unknown" not in c]
    if not charges or (len(charges) == len(failed) and len(charges) < 2):
        return call_tools(("charge_card", {"order": order, "amount": 100}))
    return Result.build(text=f"order {order} processed")


def _worker(tool: str, arguments: Any, answer: str) -> ScriptedClient:
    """Calls ``tool`` once, then answers; after a *failed* call (not an ``interrupted`` one) it tries once more."""

    def script(request: ModelRequest) -> Result:
        results = _results(_turn_messages(request), tool)
        failed = [r for r in results if '"error": true' in r and "unknown" not in r]
        if results and not (len(failed) == len(results) == 1):
            return Result.build(text=answer)
        args = arguments(request) if callable(arguments) else arguments
        return call_tools((tool, args))

    return ScriptedClient(script)


class _Reporter:
    async def chat(self, request: ModelRequest) -> Result:
        await hang_point("reporter")
        return Result.build(text=f"report ready for order {_order(request)}")  # what its judge reads


@dataclass(frozen=True)
class PaidCall:
    """One call a provider of the job answered: its kind (main, judge, summary, compaction, paint), the worker
    process that got the answer, when (epoch seconds), and the activity attempt that asked."""

    kind: str
    pid: int
    at: float
    asked_by: str
    turn_id: str  #: the turn the request names in its metadata ("-": none)


def paid_calls(order: str) -> list[PaidCall]:
    """The calls the job's providers answered for ``order``."""
    path = chaos_dir() / "effects" / "calls" / order
    lines = path.read_text().splitlines() if path.exists() else []
    fields = (line.split() for line in lines)
    return [PaidCall(kind, int(pid), float(at), asked_by, turn_id) for kind, pid, at, asked_by, turn_id in fields]


class Priced:
    """A job agent's provider: ``inner`` answers the turn's own calls; an output-policy judge approves and a
    compaction summary summarises (each after its hang point); ``paint`` paints. Every answered call costs
    :data:`PRICE` and is traced under the order its request names, after the answer exists and before it is
    returned: the provider's own count of the calls it is paid for."""

    def __init__(self, inner: Client, *, paint_point: str = "paint") -> None:
        self.inner = inner
        self.paint_point = paint_point

    async def chat(self, request: ModelRequest) -> Result:
        if request.metadata.get("purpose") == "output_policy":
            kind = "judge"
            await hang_point(kind)
            answer = Result.build(text='{"approved": true, "violations": []}')
        elif request.metadata.get("compaction"):
            # A turn's automatic summary names its turn; Conversation.compact's (its own workflow) does not.
            kind = "summary" if request.metadata.get("turn_id") else "compaction"
            await hang_point(kind)
            answer = Result.build(text="## Active Task\nThe notes on the order.")
        else:
            kind, answer = "main", await self.inner.chat(request)
        return _paid(kind, json.dumps(request.messages, default=str), answer, request.metadata.get("turn_id"))

    async def paint(self, request: PaintRequest) -> Result:
        await hang_point(self.paint_point)
        return _paid("paint", request.prompt, image(_PNG), request.metadata.get("turn_id"))


def _paid(kind: str, text: str, answer: Result, turn_id: object = None) -> Result:
    found = _ORDER.search(text)
    info = activity.info() if activity.in_activity() else None
    where = f"{info.activity_type}#{info.attempt}" if info is not None else "-"
    # Which process answered, and when: an answer whose worker was killed before its commit is lost with it.
    line = f"{kind} {os.getpid()} {time.time():.3f} {where} {turn_id or '-'}"
    effect("calls", found.group(0) if found else "no-order", line)
    return answer.model_copy(update={"usage": turnkit.Usage(input_tokens=1, cost=PRICE)})


scout = turnkit.Agent(
    "scout",
    model="scripted",
    tools=[sync_inventory],
    client=Priced(_worker("sync_inventory", {"sku": "S-1"}, "synced")),
)
clerk = turnkit.Agent(
    "clerk",
    model="scripted",
    tools=[charge_card_local],
    client=Priced(_worker("charge_card", lambda r: {"order": _order(r), "amount": 5}, "charged")),
)
#: The reporter's answer is audited: its judge's call is a paid call of its own.
reporter = turnkit.Agent(
    "reporter",
    model="scripted",
    client=Priced(_Reporter()),
    output_policy=turnkit.OutputPolicy("Name the order the report is about."),
)
lead = turnkit.Agent(
    "lead",
    model="scripted",
    tools=[charge_card, launch_agent],
    sub_agents=[scout, clerk, reporter],
    client=Priced(ScriptedClient(_lead)),
)
inbox = turnkit.Agent("inbox", model="scripted", client=Priced(ScriptedClient(lambda r: "ack")))
#: Keeps notes on the order: compacted on request, and asked with ``compact=True`` (all but the last message
#: summarised first).
scribe = turnkit.Agent(
    "scribe", model="scripted", client=Priced(ScriptedClient(lambda r: "noted")), compaction={"tail_messages": 1}
)
#: Paints a label for the order as the whole work of a prepared turn (a standalone paint).
illustrator = turnkit.Agent("illustrator", model="scripted", client=Priced(ScriptedClient(lambda r: "never")))


def _design(request: ModelRequest) -> Result:
    if any(m["role"] == "tool" for m in request.messages):
        return Result.build(text="designed")  # not reached: paint_image ends the turn
    return call_tools(("paint_image", {"prompt": f"a logo for order {_order(request)}"}))


def _allow(request: Any, context: Any = None) -> bool:
    return True


#: The painter specialist (its replay-safe ``paint_image`` ends the turn); a kill can strike inside its paint.
designer = painter(
    model="scripted",
    authorization=_allow,
    image_model="chaos-image",
    client=Priced(ScriptedClient(_design), paint_point="specialist"),
)
plain = turnkit.Agent("plain", model="scripted", client=ScriptedClient(lambda r: "fine"))
AGENTS = (lead, scout, clerk, reporter, inbox, scribe, illustrator, designer, plain)


def register_all() -> None:
    """Register the job's agents and its short heartbeats, in every process of the job (the test's and the workers').

    Short heartbeats notice a dead worker fast. They must be set where a turn is submitted, not only in the workers:
    ``ask`` starts a fresh conversation's first turn itself, with the model-call timeouts of its own process
    (docs/design.md, "A fresh conversation's first turn"). Set only in the workers, a model call lost with a killed
    worker or a restarted server waited the default 30 s heartbeat timeout.
    """
    for agent in AGENTS:
        turnkit.register(agent)
    # The workers search for lost submissions every second, not every 10 s: a seed's lost one is run in time.
    turnkit.configure(model_heartbeat_timeout=1.0, tool_heartbeat_timeout=1.0, lost_submit_grace=2.0)


# Worker-side faults ----------------------------------------------------------------------------------------------


def _hook(action: str, principal: Any = None, **resources: Any) -> Any:
    """Authorization: allows everything, but slowly (``slow``: 0.2 s a call) or by raising on the child actions
    (``raising``)."""
    mode = faults().get("hook")
    if mode == "slow":
        time.sleep(0.2)
    elif mode == "raising" and action in ("launch_agent", "callback", "wait"):
        raise RuntimeError(f"chaos: the approval service is down ({action})")
    return True


class LostCompletion(RuntimeError):
    """Raised after an activity body committed: its completion never reaches Temporal, which retries it."""


class _LoseCompletions(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        result = await self.next.execute_activity(input)
        settings = faults()
        info = activity.info()
        chance = float(settings.get("lose") or 0.0)
        if chance and info.attempt == 1:
            draw = random.Random(f"{settings.get('seed')}/{info.workflow_id}/{info.activity_id}").random()
            if draw < chance:
                raise LostCompletion(f"chaos: completion of {info.activity_type} lost after its commit")
        return result


class ChaosInterceptor(Interceptor):
    """Worker interceptor that loses activity completions (see :class:`_LoseCompletions`)."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _LoseCompletions(next)


def install_worker_faults() -> None:
    """In the worker process: the hook and the interceptor (the short heartbeats are :func:`register_all`'s)."""
    from turnkit.plugin import TurnKitPlugin

    turnkit.configure(authorize=_hook)
    original = TurnKitPlugin.__init__

    def with_interceptor(self: TurnKitPlugin, store: Any = None, **options: Any) -> None:
        original(self, store, **options)
        if store is None:
            return
        # The worker's plugin (worker.py builds it after importing this module).
        self.interceptors = [*(self.interceptors or []), ChaosInterceptor()]
        configure = self.configure_worker

        def fast_failover(config: Any) -> Any:
            # Workflow tasks of a killed worker's cached workflows move to the shared queue after 1 s, not 10 s.
            config = configure(config)
            config["sticky_queue_schedule_to_start_timeout"] = timedelta(seconds=1)
            return config

        self.configure_worker = fast_failover  # type: ignore[method-assign]

    TurnKitPlugin.__init__ = with_interceptor  # type: ignore[method-assign]


register_all()
if os.environ.get("TURNKIT_CHAOS_WORKER"):
    install_worker_faults()
