"""Tool DSL, argument validation, invocation and result normalisation (behaviour §4.1, §3.8; T19-T22)."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field

import turnkit
from tests.engine import Gate, eventually, gated_tool
from turnkit._engine.dispatch import call_policy
from turnkit.agent import Agent
from turnkit.handles import Conversation
from turnkit.kernel.errors import LostClaim, RecordNotFound, ToolError, ToolValidationError
from turnkit.model import ToolSpec
from turnkit.runtime import TurnKit
from turnkit.store.rows import media_id_for
from turnkit.store.store import Store
from turnkit.testing import ScriptedClient, call_tools, image
from turnkit.tools import FunctionTool, Tool, ToolContext, as_tool, normalize_result, tool


def make_context(execution_id: str = "tool_abc") -> ToolContext:
    return ToolContext(
        turn_id="turn_1",
        conversation_id="conv_1",
        root_turn_id="turn_1",
        execution_id=execution_id,
        tool_call_id="call_1",
        principal={"user": "u1"},
        agent_name="assistant",
    )


class StatusTool(Tool):
    description = "Look up a status."

    class Arguments(BaseModel):
        id: str = Field(description="Status id")
        verbose: bool = False

    def call(self, context: ToolContext, *, id: str, verbose: bool) -> dict[str, Any]:
        return {"id": id, "verbose": verbose}


# -- declarations ----------------------------------------------------------------------------------------------------


def test_default_name_is_snake_case_class_name() -> None:
    class SaveReport(Tool):
        def call(self, context: ToolContext) -> str:
            return "ok"

    class HTTPFetch(Tool):
        def call(self, context: ToolContext) -> str:
            return "ok"

    assert SaveReport.name == "save_report"
    assert HTTPFetch.name == "http_fetch"
    assert StatusTool().name == "status_tool"


def test_explicit_name_must_match_pattern() -> None:
    with pytest.raises(ValueError, match="invalid tool name"):

        class Bad(Tool):
            name = "bad-name"

    with pytest.raises(ValueError, match="invalid tool name"):
        tool(name="1st")(lambda: None)


def test_context_is_a_reserved_parameter_name() -> None:
    """T21: a ``context`` parameter, in a class tool's ``Arguments`` or an ``@tool`` function's signature, fails at
    definition with ``ValueError`` "context is a reserved parameter name"."""
    with pytest.raises(ValueError, match=r"^context is a reserved parameter name$"):

        class Reserved(Tool):
            class Arguments(BaseModel):
                context: str

    with pytest.raises(ValueError, match=r"^context is a reserved parameter name$"):

        @tool
        def reserved(context: str) -> str:
            return context


def test_recovery_alias_and_validation() -> None:
    class Legacy(Tool):
        recovery = "unknown"  # type: ignore[assignment]  # the gem's spelling

        def call(self, context: ToolContext) -> None:
            return None

    assert Legacy.recovery == "at_most_once"
    assert Legacy().effective_max_attempts == 1

    @tool(recovery="replay_safe", max_attempts=3)
    def idempotent() -> str:
        return "ok"

    assert idempotent.recovery == "replay_safe"
    assert idempotent.effective_max_attempts == 3

    with pytest.raises(ValueError, match="unknown recovery mode"):

        class Wrong(Tool):
            recovery = "sometimes"  # type: ignore[assignment]


def test_a_local_tool_runs_on_the_turns_worker_so_it_cannot_name_a_task_queue() -> None:
    """``@tool(local=True)``: dispatched as a local activity (the model activity's policy says so); with a
    ``task_queue`` the definition fails, naming the tool and the queue."""

    @tool(recovery="replay_safe", local=True)
    def quick(q: str) -> str:
        """Quick.

        Args:
            q: The query.
        """
        return q

    assert quick.local and not StatusTool.local
    policy = call_policy(Agent("local_tools", model="scripted", tools=[quick]), "quick")
    assert (policy.kind, policy.local, policy.at_most_once) == ("tool", True, False)
    with pytest.raises(ValueError, match=r"tool gpu_quick: a local tool .* cannot have a task_queue \('gpu'\)"):

        @tool(local=True, task_queue="gpu")
        def gpu_quick() -> str:
            """On a GPU box."""
            return ""

    with pytest.raises(ValueError, match="a local tool"):

        class Both(Tool):
            local = True
            task_queue = "gpu"


def test_validate_definition() -> None:
    class NoCall(Tool):
        pass

    with pytest.raises(ValueError, match="must implement call"):
        NoCall().validate_definition()

    class BadDefault(Tool):
        class Arguments(BaseModel):
            limit: int = "many"  # type: ignore[assignment]

        def call(self, context: ToolContext, *, limit: int) -> int:
            return limit

    with pytest.raises(ValueError, match="invalid default for parameter limit"):
        BadDefault().validate_definition()

    StatusTool().validate_definition()


# -- schema -----------------------------------------------------------------------------------------------------------


def test_schema_from_decorated_function_with_docstring_args() -> None:
    @tool(usage_hint="the user asks about products")
    async def search_catalogue(
        query: str,
        ctx: ToolContext,
        limit: int = 5,
        sort: Literal["price", "name"] = "name",
        tags: list[str] | None = None,
    ) -> list[str]:
        """Search the product catalogue.

        Matches names and descriptions.

        Args:
            query (str): Words to look for; matched
                case-insensitively.
            limit: Maximum number of hits.
            sort: Sort order.

        Returns:
            Matching product ids.
        """
        return [query]

    assert isinstance(search_catalogue, FunctionTool)
    assert search_catalogue.name == "search_catalogue"
    assert search_catalogue.description == "Search the product catalogue."
    assert search_catalogue.input_schema() == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "Words to look for; matched case-insensitively."},
            "limit": {"type": "integer", "default": 5, "description": "Maximum number of hits."},
            "sort": {"type": "string", "enum": ["price", "name"], "default": "name", "description": "Sort order."},
            "tags": {"anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}], "default": None},
        },
        "required": ["query"],
    }
    spec = search_catalogue.spec()
    assert isinstance(spec, ToolSpec)
    assert spec.name == "search_catalogue"
    assert spec.usage_hint == "the user asks about products"
    assert "ctx" not in spec.parameters["properties"]


class Address(BaseModel):
    title: str
    city: str = Field(description="City name")


class Item(BaseModel):
    sku: str
    qty: int = 1


def test_schema_inlines_nested_models_and_keeps_field_named_title() -> None:
    class Ship(Tool):
        class Arguments(BaseModel):
            title: str
            address: Address

        def call(self, context: ToolContext, *, title: str, address: Address) -> dict[str, str]:
            return {"title": title, "city": address.city}

    schema = Ship().input_schema()
    assert "$defs" not in schema
    assert schema["properties"]["title"] == {"type": "string"}
    assert schema["properties"]["address"] == {
        "type": "object",
        "properties": {"title": {"type": "string"}, "city": {"type": "string", "description": "City name"}},
        "required": ["title", "city"],
    }
    assert schema["required"] == ["title", "address"]


def test_annotated_field_descriptions_are_used() -> None:
    @tool
    def rate(stars: Annotated[int, Field(ge=1, le=5, description="1 to 5")]) -> int:
        """Rate it."""
        return stars

    assert rate.input_schema()["properties"]["stars"] == {
        "type": "integer",
        "minimum": 1,
        "maximum": 5,
        "description": "1 to 5",
    }
    with pytest.raises(ToolValidationError, match="invalid argument stars"):
        rate.validate_arguments({"stars": 9})


# -- validate_arguments (T22) -----------------------------------------------------------------------------------------


def test_validate_arguments_messages() -> None:
    """T22: with required ``id: string``, ``{}``, ``{"id": 1}`` and extra keys each raise ``ToolValidationError``
    (missing, invalid, unknown arguments), and ``{"id": "st_1"}`` comes back normalised with its defaults."""
    status = StatusTool()
    with pytest.raises(ToolValidationError, match=r"^missing required argument: id$"):
        status.validate_arguments({})
    with pytest.raises(ToolValidationError, match=r"^invalid argument id: "):
        status.validate_arguments({"id": 1})
    with pytest.raises(ToolValidationError, match=r"^unknown argument\(s\): extra, more$"):
        status.validate_arguments({"id": "x", "extra": True, "more": 1})
    assert status.validate_arguments({"id": "st_1"}) == {"id": "st_1", "verbose": False}


def test_validate_arguments_null_optional_takes_default_and_required_null_fails() -> None:
    status = StatusTool()
    assert status.validate_arguments({"id": "a", "verbose": None}) == {"id": "a", "verbose": False}
    with pytest.raises(ToolValidationError, match="invalid argument id"):
        status.validate_arguments({"id": None})
    with pytest.raises(ToolValidationError, match="arguments must be an object"):
        status.validate_arguments(["id"])  # type: ignore[arg-type]


def test_validate_arguments_returns_json_compatible_values() -> None:
    @tool
    def schedule(at: datetime, labels: tuple[str, ...] = ()) -> str:
        """Schedule."""
        return at.isoformat()

    assert schedule.validate_arguments({"at": "2026-01-02T03:04:05Z", "labels": ["a"]}) == {
        "at": "2026-01-02T03:04:05Z",
        "labels": ["a"],
    }


# -- invocation -------------------------------------------------------------------------------------------------------


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    seen: dict[str, Any] = {}

    @tool
    def whoami(name: str, ctx: ToolContext) -> dict[str, Any]:
        """Echo."""
        seen["thread"] = threading.get_ident()
        seen["ctx"] = ctx
        return {"name": name, "key": ctx.idempotency_key}

    result = await whoami.invoke({"name": "ada"}, make_context("tool_x"))
    assert result == {"name": "ada", "key": "turnkit:tool:tool_x"}
    assert seen["thread"] != threading.get_ident()
    assert seen["ctx"].principal == {"user": "u1"}


async def test_async_tool_is_awaited_on_the_loop() -> None:
    loop_thread = threading.get_ident()

    @tool
    async def double(value: int) -> list[int]:
        """Double it."""
        await asyncio.sleep(0)
        assert threading.get_ident() == loop_thread
        return [value, value]

    assert await double.invoke({"value": 3}, make_context()) == {"items": [3, 3]}


async def test_class_tool_invocation_receives_typed_values_and_context() -> None:
    class Order(Tool):
        class Arguments(BaseModel):
            items: list[Item]

        async def call(self, context: ToolContext, *, items: list[Item]) -> dict[str, Any]:
            assert all(isinstance(item, Item) for item in items)
            return {"count": sum(item.qty for item in items), "turn": context.turn_id}

    result = await Order().invoke({"items": [{"sku": "a", "qty": 2}, {"sku": "b"}]}, make_context())
    assert result == {"count": 3, "turn": "turn_1"}


async def test_invalid_arguments_never_call_the_tool() -> None:
    calls: list[str] = []

    @tool
    def record(id: str) -> str:
        """Record."""
        calls.append(id)
        return id

    with pytest.raises(ToolValidationError, match="missing required argument: id"):
        await record.invoke({}, make_context())
    assert calls == []


async def test_tool_error_propagates_from_body() -> None:
    @tool
    def boom() -> None:
        """Fail."""
        raise ToolError("boom")

    with pytest.raises(ToolError, match="boom"):
        await boom.invoke({}, make_context())


def test_decorated_function_is_still_callable() -> None:
    @tool
    def add(a: int, b: int = 1) -> int:
        """Add."""
        return a + b

    @tool(description="Async add")
    async def add_async(a: int) -> int:
        return a + 1

    assert add(2, b=3) == 5
    assert add.__name__ == "add"
    assert add.__doc__ == "Add."
    assert add_async.description == "Async add"
    assert asyncio.run(add_async(1)) == 2


def test_tool_context_idempotency_key() -> None:
    context = make_context("tool_42")
    assert context.idempotency_key == "turnkit:tool:tool_42"
    assert context.attempt == 1
    explicit = ToolContext(
        turn_id="t", conversation_id="c", root_turn_id="t", execution_id="tool_42", tool_call_id="x",
        idempotency_key="turnkit:tool:tool_42",
    )  # fmt: skip
    assert explicit.idempotency_key == context.idempotency_key
    with pytest.raises(ValueError, match="idempotency_key"):
        ToolContext(
            turn_id="t", conversation_id="c", root_turn_id="t", execution_id="tool_42", tool_call_id="x",
            idempotency_key="other",
        )  # fmt: skip


# -- constructor arguments (T20) --------------------------------------------------------------------------------------


def test_tool_class_needing_constructor_arguments() -> None:
    """T20: a tool class whose constructor needs arguments cannot be used as a class ("register an instance
    instead"); an instance of it is accepted as is."""

    class Fetch(Tool):
        def __init__(self, base_url: str) -> None:
            self.base_url = base_url

        def call(self, context: ToolContext) -> str:
            return self.base_url

    with pytest.raises(ValueError, match="fetch requires constructor arguments; register an instance instead"):
        as_tool(Fetch)
    instance = Fetch("https://example.test")
    assert as_tool(instance) is instance
    assert isinstance(as_tool(StatusTool), StatusTool)
    with pytest.raises(TypeError, match="tools must be TurnKit tools"):
        as_tool(object())


# -- terminal completion message --------------------------------------------------------------------------------------


def test_completion_message() -> None:
    class SaveReport(Tool):
        terminal = staticmethod(lambda result: f"Saved {result['id']}.")

        def call(self, context: ToolContext) -> dict[str, str]:
            return {"id": "rep_1"}

    class Finish(Tool):
        terminal = "All done."

        def call(self, context: ToolContext) -> None:
            return None

    class Plain(Tool):
        terminal = True

        def call(self, context: ToolContext) -> None:
            return None

    @tool(terminal=lambda result: None)
    def quiet() -> str:
        """Quiet."""
        return "kept"

    assert SaveReport().completion_message({"id": "rep_1"}) == "Saved rep_1."
    assert SaveReport().is_terminal
    assert Finish().completion_message({"result": "x"}) == "All done."
    assert Plain().completion_message({"result": "from result"}) == "from result"
    assert Plain().completion_message({"other": 1}) == "Completed via plain."
    assert quiet.completion_message({"result": "kept"}) == "kept"
    assert quiet.is_terminal
    assert not StatusTool().is_terminal


def test_terminal_function_assigned_in_class_body_is_not_bound() -> None:
    class Done(Tool):
        terminal = lambda result: "done " + result["result"]  # noqa: E731

        def call(self, context: ToolContext) -> str:
            return "x"

    assert Done().completion_message({"result": "x"}) == "done x"


# -- normalize_result (T19) -------------------------------------------------------------------------------------------


def test_normalize_result() -> None:
    class Model(BaseModel):
        when: datetime
        n: int

    @dataclass
    class Point:
        x: int
        y: int

    assert normalize_result({"error": "ordinary data"}) == {"error": "ordinary data"}
    assert normalize_result({1: "a", "nested": {2: (1, 2)}}) == {"1": "a", "nested": {"2": [1, 2]}}
    assert normalize_result([1, "a"]) == {"items": [1, "a"]}
    assert normalize_result((1, 2)) == {"items": [1, 2]}
    when = datetime(2026, 1, 2, tzinfo=UTC)
    assert normalize_result(Model(when=when, n=1)) == {"when": "2026-01-02T00:00:00Z", "n": 1}
    assert normalize_result({"at": when}) == {"at": "2026-01-02T00:00:00Z"}
    assert normalize_result(Point(1, 2)) == {"x": 1, "y": 2}
    assert normalize_result("hello") == {"result": "hello"}
    assert normalize_result(42) == {"result": "42"}
    assert normalize_result(None) == {"result": "None"}


async def test_result_with_error_key_is_a_normal_result() -> None:  # T19
    @tool
    def lookup() -> dict[str, str]:
        """Lookup."""
        return {"error": "ordinary data"}

    assert await lookup.invoke({}, make_context()) == {"error": "ordinary data"}


# -- fenced writes (behaviour §5.4) -----------------------------------------------------------------------------------


async def test_a_cancelled_tools_raw_store_write_is_refused(tk: TurnKit) -> None:
    """T49 (the "LATE RAW WRITE"): a tool that outlives its turn's cancel and appends through ``context.store``
    is refused with ``LostClaim``; the conversation gets nothing after ``cancelled``."""
    turnkit.configure(tool_heartbeat_timeout=1.0)  # the cancel reaches the running tool through its heartbeat
    entered, release, wrote = asyncio.Event(), asyncio.Event(), asyncio.Event()
    refused: list[BaseException] = []

    async def stubborn(context: ToolContext) -> dict[str, Any]:
        """Work on after being cancelled, then write to the record."""
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            await release.wait()  # it goes on anyway
        try:
            assert context.store is not None
            await context.store.append_message(context.conversation_id, role="user", text="LATE RAW WRITE")
        except Exception as err:
            refused.append(err)
        finally:
            wrote.set()
        return {}

    client = ScriptedClient([call_tools(("stubborn", {})), "never"])
    conversation = await tk.conversation(Agent("late_raw", model="scripted", tools=[tool(stubborn)], client=client))
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(entered.wait(), 30)
    assert (await turn.cancel()).status == "cancelled"
    release.set()
    await asyncio.wait_for(wrote.wait(), 30)

    assert [type(err) for err in refused] == [LostClaim]
    assert "LATE RAW WRITE" not in [m.text for m in await conversation.messages()]


PNG = b"\x89PNG\r\n\x1a\nIHDR"


async def _late_writes(context: ToolContext, destination: str, marker: str) -> tuple[dict[str, str], int]:
    """Every write a tool can make through its context, each tried once: the class of what each raised (``"wrote"``
    when it did not), and how many provider calls the paint and view_media made."""
    from turnkit.media import MediaInput
    from turnkit.media_tools import paint_in_turn, view_media_in_turn

    store = context.store
    assert store is not None
    painter = ScriptedClient([], images=[image(PNG + b"painted" + marker.encode())])
    viewer = ScriptedClient(["it shows a cat"])
    attempts: dict[str, Any] = {
        "say": lambda: context.say(f"say {marker}"),
        "append_message": lambda: store.append_message(text=f"append {marker}"),
        "deliver": lambda: store.deliver(destination, f"deliver {marker}", key="late"),
        "put_media": lambda: store.put_media(PNG + marker.encode(), mime_type="image/png"),
        "paint": lambda: paint_in_turn(context, f"paint {marker}", model="scripted-image", client=painter),
        "view_media": lambda: view_media_in_turn(
            context, MediaInput.bytes(PNG + b"viewed" + marker.encode()), objective="what", client=viewer
        ),
    }
    outcomes: dict[str, str] = {}
    for name, attempt in attempts.items():
        try:
            await attempt()
            outcomes[name] = "wrote"
        except Exception as err:
            outcomes[name] = type(err).__name__
    return outcomes, len(painter.paint_requests) + viewer.calls


async def _nothing_written(conversation: Conversation, destination: Conversation, store: Store, marker: str) -> None:
    """No message, delivery or media item of the refused writes tagged ``marker`` exists."""
    texts = [m.text for m in await conversation.messages()]
    assert not [text for text in texts if marker in text], f"a refused write left a message: {texts}"
    assert await destination.inbox() == [], "a refused deliver left a delivery"
    async with store.reads() as tx:
        for data in (PNG + marker.encode(), PNG + b"painted" + marker.encode(), PNG + b"viewed" + marker.encode()):
            with pytest.raises(RecordNotFound):
                await tx.load_media(media_id_for(hashlib.sha256(data).hexdigest()))


@pytest.mark.parametrize("revoked_by", ["cancel", "interruption"])
async def test_every_write_of_a_revoked_call_is_refused(tk: TurnKit, revoked_by: str) -> None:
    """T49: after its turn was cancelled, or its execution interrupted (its attempt timed out while the body went
    on), every write a tool can make through its context (say, append_message, deliver, put_media, and the paint
    and view_media it runs) raises ``LostClaim``, writes nothing, and pays no provider."""
    if revoked_by == "cancel":
        turnkit.configure(tool_heartbeat_timeout=1.0)  # the cancel reaches the running tool through its heartbeat
    marker = uuid.uuid4().hex
    entered, release, wrote = asyncio.Event(), asyncio.Event(), asyncio.Event()
    outcomes: dict[str, str] = {}
    provider_calls: list[int] = []
    destination = await tk.conversation(Agent("inbox_owner", model="scripted", client=ScriptedClient(["ok"])))

    async def stubborn(context: ToolContext) -> dict[str, Any]:
        """Work on after being revoked, then try every write."""
        entered.set()
        try:
            await release.wait()
        except asyncio.CancelledError:
            await release.wait()  # it goes on anyway
        try:
            refused, paid = await _late_writes(context, destination.id, marker)
            outcomes.update(refused)
            provider_calls.append(paid)
        finally:
            wrote.set()
        return {}

    gate = Gate()  # keeps the turn running after an interruption: the execution alone is revoked
    script: list[Any] = [call_tools(("stubborn", {})), call_tools(("slow", {})), "done"]
    tools = [tool(timeout=1.0)(stubborn), gated_tool(gate)] if revoked_by == "interruption" else [tool(stubborn)]
    client = ScriptedClient(script)
    conversation = await tk.conversation(Agent("revoked", model="scripted", tools=tools, client=client))
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(entered.wait(), 30)
    if revoked_by == "cancel":
        assert (await turn.cancel()).status == "cancelled"
    else:
        await asyncio.wait_for(gate.entered.wait(), 30)  # the call was settled "interrupted" and the turn went on
    [execution, *_] = await turn.tool_executions()
    assert execution.status == "interrupted"
    release.set()
    await asyncio.wait_for(wrote.wait(), 30)
    if revoked_by == "interruption":
        assert (await turn.refresh()).status == "running"  # refused for the execution, not for the turn
        gate.opened.set()
        assert (await turn.result(timeout=60)).status == "completed"

    assert outcomes == dict.fromkeys(
        ["say", "append_message", "deliver", "put_media", "paint", "view_media"], "LostClaim"
    )
    assert provider_calls == [0], "a revoked call must pay no provider"
    await _nothing_written(conversation, destination, tk.store, marker)


async def test_a_calls_writes_commit_once_while_it_is_open(tk: TurnKit) -> None:
    """§5.4: while the call is open its context's writes commit: a message (tagged with the execution), a delivery
    (woken at its destination), media bytes. A replay-safe tool's retried attempt that repeats them writes nothing
    twice. The context never hands out the worker's store."""
    destination = await tk.conversation(Agent("mailbox", model="scripted", client=ScriptedClient(["noted"])))
    seen: list[ToolContext] = []

    async def chatty(context: ToolContext) -> dict[str, Any]:
        """Write everything, fail once, then do it all again."""
        seen.append(context)
        store = context.store
        assert store is not None
        said = await context.say("progress")
        appended = await store.append_message(text="more", metadata={"step": 2})
        delivery = await store.deliver(destination.id, "hello there", key="greeting")
        media = await store.put_media(PNG + b"chatty", mime_type="image/png")
        if context.attempt == 1:
            raise RuntimeError("flaky")
        return {"said": said.id, "appended": appended.id, "delivery": delivery.id, "media": media.id}

    client = ScriptedClient([call_tools(("chatty", {})), "done"])
    chatty_tool = tool(recovery="replay_safe", initial_retry_interval=0.01)(chatty)
    conversation = await tk.conversation(Agent("chatty", model="scripted", tools=[chatty_tool], client=client))
    turn = await conversation.ask("go")
    assert turn.status == "completed", turn.error
    assert [c.attempt for c in seen] == [1, 2]
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    result = execution.result or {}

    messages = await conversation.messages()
    [said] = [m for m in messages if m.text == "progress"]
    [appended] = [m for m in messages if m.text == "more"]
    assert (said.id, appended.id) == (result["said"], result["appended"])
    assert said.role == appended.role == "user"
    assert said.metadata == {"tool_execution_id": execution.id}
    assert appended.metadata == {"step": 2, "tool_execution_id": execution.id}
    [delivery] = await destination.inbox()
    assert delivery.id == result["delivery"] and delivery.key == f"tool:{execution.id}:greeting"
    assert delivery.source_conversation_id == conversation.id and delivery.source_turn_id == turn.id

    async def delivered() -> bool:
        return any(m.text == "hello there" for m in await destination.messages())

    await eventually(delivered, what="the delivery reaching its destination")
    store = seen[0].store
    assert store is not None and not isinstance(store, Store)
    assert not [name for name, value in vars(store).items() if isinstance(value, Store)]
    assert not hasattr(store, "atomic"), "the context must not open raw transactions"
    with pytest.raises(ValueError, match="own conversation"):
        await store.append_message(destination.id, text="elsewhere")


async def test_the_builtin_send_message_writes_under_its_calls_fence(tk: TurnKit) -> None:
    """T49: the built-in ``send_message`` tool's delivery is written under its execution's fence too: run again for
    its settled execution (a zombie attempt), it raises ``LostClaim`` instead of finding or writing a delivery."""
    from turnkit._activities.tools import ToolActivities
    from turnkit._engine.builtin_tools import send_message

    destination = await tk.conversation(Agent("letterbox", model="scripted", client=ScriptedClient(["ok"])))
    arguments = {"conversation_id": destination.id, "text": "first"}
    client = ScriptedClient([call_tools(("send_message", arguments)), "sent"])
    conversation = await tk.conversation(Agent("sender", model="scripted", tools=[send_message], client=client))
    turn = await conversation.ask("send it")
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    with pytest.raises(LostClaim):
        await ToolActivities(tk.store)._send_message(turn.record, execution, send_message, arguments)  # pyright: ignore[reportPrivateUsage]
    assert [d.key for d in await destination.inbox()] == [f"message:{execution.id}"]


async def test_every_write_after_the_call_completed_is_refused(tk: TurnKit) -> None:
    """T49: a context kept past its call's end (say, by a background task the tool left behind) writes nothing: once
    its execution is completed, while the turn goes on with its next call, every write through it (say,
    append_message, deliver, put_media, paint, view_media) raises ``LostClaim``, writes nothing and pays no
    provider."""
    marker = uuid.uuid4().hex
    destination = await tk.conversation(Agent("late_inbox", model="scripted", client=ScriptedClient(["ok"])))
    kept: list[ToolContext] = []

    async def quick(context: ToolContext) -> dict[str, Any]:
        """Return at once, leaving the context behind."""
        kept.append(context)
        return {}

    gate = Gate()  # holds the turn in its next call: the first one alone has ended
    client = ScriptedClient([call_tools(("quick", {})), call_tools(("slow", {})), "done"])
    tools = [tool(quick), gated_tool(gate)]
    conversation = await tk.conversation(Agent("finished", model="scripted", tools=tools, client=client))
    turn = await conversation.ask("go", wait=False)
    await asyncio.wait_for(gate.entered.wait(), 30)
    [context] = kept
    [first, _] = await turn.tool_executions()
    assert first.status == "completed" and (await turn.refresh()).status == "running"
    with pytest.raises(LostClaim, match=f"^tool execution {first.id} is completed: its writes are fenced$"):
        await context.say(f"said late {marker}")
    outcomes, paid = await _late_writes(context, destination.id, marker)
    gate.opened.set()
    assert (await turn.result(timeout=60)).status == "completed"

    assert outcomes == dict.fromkeys(
        ["say", "append_message", "deliver", "put_media", "paint", "view_media"], "LostClaim"
    )
    assert paid == 0, "a finished call must pay no provider"
    await _nothing_written(conversation, destination, tk.store, marker)


async def test_a_tools_message_shows_only_media_its_tree_may_use(tk: TurnKit) -> None:
    """Behaviour §3.12, §5.4: a ``media`` part a tool appends must name an item the call stored (``put_media``) or
    one its tree has seen, and is stored as that item's full reference whatever else the part says. Another
    conversation's item is ``"media not found"`` and nothing is written: a tool that writes an id it was given (a
    model's argument) cannot open another tree's media to its own."""
    from turnkit.media import media_part

    async with tk.store.atomic() as tx:  # another conversation's image, shown there
        other = await tk.conversation(Agent("media_keeper", model="scripted", client=ScriptedClient(["ok"])))
        foreign = await tx.put_media(PNG + b"foreign" + uuid.uuid4().bytes, mime_type="image/png")
        await tx.append_message(other.id, role="user", content=[media_part(foreign)])
    mine = PNG + b"mine" + uuid.uuid4().bytes
    refusals: list[str] = []

    async def show(context: ToolContext, media_id: str) -> dict[str, Any]:
        """Show the tool's own image, then try to show the given one.

        Args:
            media_id: A media id to show.
        """
        store = context.store
        assert store is not None
        record = await store.put_media(mine, mime_type="image/png", filename="mine.png")
        shown = await store.append_message(
            content=[{"type": "text", "text": "look"}, {"type": "media", "media_id": record.id, "mime_type": "x/y"}]
        )
        try:
            await store.append_message(content=[{"type": "media", "media_id": media_id}], key="given")
        except RecordNotFound as err:
            refusals.append(str(err))
        return {"shown": shown.id, "media_id": record.id}

    client = ScriptedClient([call_tools(("show", {"media_id": foreign.id})), "seen"])
    conversation = await tk.conversation(Agent("shower", model="scripted", tools=[tool(show)], client=client))
    turn = await conversation.ask("show me")
    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    result = execution.result or {}
    assert refusals == [f"media not found: {foreign.id}"]

    async with tk.store.reads() as tx:
        own = await tx.load_media(str(result["media_id"]))
    messages = await conversation.messages()
    [shown] = [m for m in messages if m.id == result["shown"]]
    assert shown.content == [{"type": "text", "text": "look"}, media_part(own)], "completed from the record"
    assert not [p for m in messages for p in m.content if p.get("media_id") == foreign.id], "a foreign media part"
