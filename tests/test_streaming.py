"""Token streaming (issue 38): ``Turn.stream()`` and ``Conversation.stream()`` yield the model's deltas live, merged
with the committed events (tool calls, sub-agents, the turn's end), and the store records the answer exactly once."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import turnkit
from tests.engine import Engine, Gate, eventually, gated_tool
from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_message,
    anthropic_text,
    anthropic_thinking,
    anthropic_tool_use,
    openai_call,
    openai_reasoning,
    openai_response,
    openai_text,
)
from tests.workers import WorkerProcess
from turnkit import cli
from turnkit._engine.live_publish import CallPublisher
from turnkit._engine.turn_stream import LiveCalls
from turnkit.model import ModelRequest
from turnkit.providers import AnthropicClient, OpenAIClient, TransientModelError
from turnkit.runtime import TurnKit
from turnkit.store.live import PRESENCE_CHANNEL, LiveMessage, PostgresTransport, Subscription, channel_of, transport_for
from turnkit.store.store import Store
from turnkit.streaming import TurnStreamEvent, streaming_to
from turnkit.testing import ScriptedClient, call_tools

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
postgres_only = pytest.mark.parametrize(
    "database_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


@turnkit.tool(recovery="replay_safe")
def lookup(topic: str) -> dict[str, Any]:
    """Look a topic up.

    Args:
        topic: What to look up.
    """
    return {"fact": f"{topic} is durable"}


def answer_text(events: list[TurnStreamEvent], call_id: str) -> str:
    """The text a consumer shows for ``call_id``: its deltas since its last restart."""
    text = ""
    for event in events:
        if isinstance(event, turnkit.Restart) and event.call_id == call_id:
            text = ""
        elif isinstance(event, turnkit.TextDelta) and event.call_id == call_id:
            text += event.text
    return text


async def test_a_turn_streams_its_words_tool_calls_and_sub_agents(tk: TurnKit) -> None:
    """Worker and client in one process (SQLite: in-process delivery; PostgreSQL: NOTIFY): the tool call starts and
    finishes, the sub-agent starts and streams its own words, then the answer arrives word by word while the turn
    runs, and the stream ends with the recorded answer."""
    answer = "Temporal keeps the turn durable, word by word."
    # The first call proposes the tool without text: the stream subscribes once ask returns, and a first call's words
    # could come before that (they are not recorded twice, just not seen live); the answer comes after the tool ran.
    client = ScriptedClient(
        [call_tools(("lookup", {"topic": "temporal"})), call_tools(("checker", {"task": "check it"})), answer],
        delta_delay=0.02,
    )
    checker = turnkit.Agent(
        "checker", model="scripted", client=ScriptedClient(["It holds, checked."], delta_delay=0.02)
    )
    agent = turnkit.Agent("streamer", model="scripted", tools=[lookup], sub_agents=[checker], client=client)
    turn = await (await tk.conversation(agent)).ask("what is temporal?", wait=False)

    events: list[TurnStreamEvent] = []
    running_at_first_delta: bool | None = None
    async for event in turn.stream():
        if isinstance(event, turnkit.TextDelta) and running_at_first_delta is None:
            running_at_first_delta = not (await tk.store.load_turn(turn.id)).terminal
        events.append(event)

    assert running_at_first_delta is True  # live: the first words came before the turn ended
    ended = events[-1]
    assert isinstance(ended, turnkit.TurnEnded) and ended.status == "completed" and ended.output_text == answer
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("ToolCallStarted") < kinds.index("ToolCallFinished")
    assert kinds.index("ToolCallFinished") < kinds.index("TextDelta")  # the tool ran before any text came
    [sub] = [e for e in events if isinstance(e, turnkit.SubAgentStarted)]
    assert sub.agent == "checker" and sub.parent_turn_id == turn.id
    # The sub-agent's words stream too (from its own conversation), after it started and before its turn ended.
    sub_deltas = [(i, e) for i, e in enumerate(events) if isinstance(e, turnkit.TextDelta) and e.turn_id == sub.turn_id]
    assert "".join(e.text for _, e in sub_deltas) == "It holds, checked."
    sub_end = next(i for i, e in enumerate(events) if isinstance(e, turnkit.TurnEnded) and e.turn_id == sub.turn_id)
    assert events.index(sub) < sub_deltas[0][0] and sub_deltas[-1][0] < sub_end
    [call] = {e.call_id for e in events if isinstance(e, turnkit.TextDelta) and e.turn_id == turn.id}
    assert answer_text(events, call) == answer
    assert len([e for e in events if isinstance(e, turnkit.TextDelta) and e.turn_id == turn.id]) > 3  # word by word
    assert not any(isinstance(e, turnkit.Restart) for e in events)
    # A turn that already ended streams its end at once.
    assert [type(e).__name__ for e in [e async for e in turn.stream()]][-1] == "TurnEnded"


@dataclass
class Sink:
    """A delta sink that keeps what it was given."""

    texts: list[str] = field(default_factory=list[str])
    thoughts: list[str] = field(default_factory=list[str])

    def text(self, delta: str) -> None:
        self.texts.append(delta)

    def thinking(self, delta: str) -> None:
        self.thoughts.append(delta)


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


def request() -> ModelRequest:
    return ModelRequest(model="test-model", messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_streamed_call_returns_what_the_same_call_without_streaming_returns(
    server: ProviderServer, provider: str
) -> None:
    """With a sink, the client streams (``"stream": true``, server-sent events): thinking and text go to the sink
    piece by piece, and the result built from the stream equals the non-streaming one, raw provider parts included."""
    client: turnkit.Client
    if provider == "openai":
        client = OpenAIClient(api_key="sk-test", base_url=f"{server.url}/v1")
        body = openai_response(
            openai_reasoning("Think first."),
            openai_text("Hello there, world."),
            openai_call("c1", "lookup", {"q": "a"}),
        )
    else:
        client = AnthropicClient(api_key="sk-ant-test", base_url=server.url)
        body = anthropic_message(
            anthropic_thinking("Think first.", signature="sig-1"),
            anthropic_text("Hello there, world."),
            anthropic_tool_use("toolu_1", "lookup", {"q": "a"}),
            stop_reason="tool_use",
        )
    server.script(body, body)
    plain = await client.chat(request())
    sink = Sink()
    with streaming_to(sink):
        streamed = await client.chat(request())

    assert [b.get("stream") for b in server.bodies] == [None, True]
    assert streamed == plain
    assert sink.texts == ["Hello ", "there, ", "world."] and "".join(sink.thoughts) == "Think first."


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_stream_cut_in_the_middle_is_a_transient_error(server: ProviderServer, provider: str) -> None:
    """The connection drops after a few events: a :class:`TransientModelError` (the model activity retries it)."""
    client: turnkit.Client
    if provider == "openai":
        client = OpenAIClient(api_key="sk-test", base_url=f"{server.url}/v1")
        body = openai_response(openai_text("Hello there, world."))
    else:
        client = AnthropicClient(api_key="sk-ant-test", base_url=server.url)
        body = anthropic_message(anthropic_text("Hello there, world."))
    server.script(Reply(body=body, cut_after=5))
    sink = Sink()
    with pytest.raises(TransientModelError), streaming_to(sink):
        await client.chat(request())
    assert sink.texts  # some text had arrived before the cut


@pytest.mark.crash
@postgres_only
async def test_deltas_cross_processes_on_postgres_and_a_cut_stream_restarts(
    engine: Engine, server: ProviderServer
) -> None:
    """PostgreSQL, the worker in another process, the provider streaming server-sent events: the first attempt's
    stream is cut mid-way, the model activity retries, and this process sees the first attempt's words live, then a
    ``Restart`` (attempt 2), then the second attempt's words, all before the turn ends; what the consumer keeps is the
    answer the store recorded, once."""
    from tests.stream_app import streamer

    answer = "The durable answer arrives piece by piece over the wire."
    voided = "Words that the cut will void before they end."
    server.script(
        Reply(body=openai_response(openai_text(voided)), cut_after=6, pause=0.05),
        Reply(body=openai_response(openai_text(answer)), pause=0.05),
    )
    worker = await WorkerProcess.for_engine(
        engine, app="tests.stream_app", env={"TURNKIT_STREAM_PROVIDER_URL": server.url}
    )
    try:
        turn = await (await engine.tk.conversation(streamer)).ask("stream it", wait=False)
        events: list[TurnStreamEvent] = []
        live_before_end = 0
        async with asyncio.timeout(60):
            async for event in turn.stream():
                if isinstance(event, turnkit.TextDelta) and not (await engine.tk.store.load_turn(turn.id)).terminal:
                    live_before_end += 1
                events.append(event)
    finally:
        assert await worker.stop() == 0

    ended = events[-1]
    assert isinstance(ended, turnkit.TurnEnded) and ended.status == "completed" and ended.output_text == answer
    [restart] = [e for e in events if isinstance(e, turnkit.Restart)]
    assert restart.attempt == 2
    before = [e.text for e in events[: events.index(restart)] if isinstance(e, turnkit.TextDelta)]
    assert before and voided.startswith("".join(before)) and "".join(before) != voided  # attempt 1, cut short
    assert answer_text(events, restart.call_id) == answer
    assert live_before_end > 3  # the deltas came while the turn ran, from the worker's process
    assert len(server.requests) == 2 and all(body["stream"] for body in server.bodies)
    assistant = [m for m in await turn.messages() if m.role == "assistant"]
    assert [m.content[0]["text"] for m in assistant] == [answer]  # recorded once, from the retried call


@sqlite_only
async def test_a_conversation_streams_its_turns_one_after_the_other(tk: TurnKit) -> None:
    """``Conversation.stream()`` started before any turn: each turn asked later streams its words and ends with its
    recorded answer, in the order the turns ran."""
    answers = ["First answer, streamed.", "Second answer, streamed too."]
    agent = turnkit.Agent("chatty", model="scripted", client=ScriptedClient(answers))
    conversation = await tk.conversation(agent)
    events: list[TurnStreamEvent] = []

    async def watch() -> None:
        async for event in conversation.stream():
            events.append(event)
            if len([e for e in events if isinstance(e, turnkit.TurnEnded)]) == len(answers):
                return

    watcher = asyncio.create_task(watch())

    async def subscribed() -> bool:
        return transport_for(tk.store).subscribed(conversation.id)

    await eventually(subscribed, what="the conversation's stream subscribed")  # or the first words could be missed
    first = await conversation.ask("one")
    second = await conversation.ask("two")
    async with asyncio.timeout(30):
        await watcher

    ends = [e for e in events if isinstance(e, turnkit.TurnEnded)]
    assert [(e.turn_id, e.output_text) for e in ends] == [(first.id, answers[0]), (second.id, answers[1])]
    for turn, answer in ((first, answers[0]), (second, answers[1])):
        [call] = {e.call_id for e in events if isinstance(e, turnkit.TextDelta) and e.turn_id == turn.id}
        assert answer_text(events, call) == answer
    assert events.index(ends[0]) < min(i for i, e in enumerate(events) if getattr(e, "turn_id", "") == second.id)


async def test_long_deltas_are_cut_under_the_notify_limit_and_arrive_in_order(store: Store) -> None:
    """A retried call's publisher sends ``restart`` first; a delta far past PostgreSQL's 8000-byte payload limit (600
    astral characters, 12 bytes each as JSON) arrives in pieces that rebuild it, numbered in order; the subscriber
    reads them back as ``Restart`` then the text (both stores: NOTIFY, in-process)."""
    transport = transport_for(store)
    subscription = await transport.subscribe(["conv_limits"])
    long_text = "🙂" * 600 + "é" * 700
    try:
        async with CallPublisher(
            transport, conversation_id="conv_limits", turn_id="turn_limits", call_id="req_1", attempt=2
        ) as publisher:
            publisher.text(long_text)
            publisher.thinking("hmm")
        assert await subscription.barrier("conv_limits")
        messages: list[LiveMessage] = []
        while (message := await subscription.get(timeout=0)) is not None:
            messages.append(message)
    finally:
        await subscription.close()
    assert [m.seq for m in messages] == list(range(len(messages)))
    assert messages[0].kind == "restart" and messages[0].attempt == 2
    assert all(len(m.payload().encode()) < 8000 for m in messages)
    calls = LiveCalls()
    events = [e for m in messages for e in calls.events(m)]
    assert isinstance(events[0], turnkit.Restart)
    assert "".join(e.text for e in events if isinstance(e, turnkit.TextDelta)) == long_text
    assert [e.text for e in events if isinstance(e, turnkit.ThinkingDelta)] == ["hmm"]
    assert not transport.subscribed("conv_limits")


@sqlite_only
async def test_show_html_follow_rewrites_the_timeline_until_the_run_ends(
    tk: TurnKit, engine: Engine, tmp_path: Path
) -> None:
    """``turnkit show TURN --html FILE --follow``: while the turn runs, the page shows its running tool call and
    reloads itself; once the turn ended, the command returns and the last page no longer reloads."""
    gate = Gate()
    agent = turnkit.Agent(
        "followed",
        model="scripted",
        tools=[gated_tool(gate)],
        client=ScriptedClient([call_tools(("slow", {})), "done"]),
    )
    turn = await (await tk.conversation(agent)).ask("go", wait=False)
    page = tmp_path / "run.html"
    options = ["--address", engine.temporal_address, "--database-url", engine.database_url]
    following = asyncio.create_task(cli.run_command(["show", turn.id, "--html", str(page), "--follow", *options]))

    async def running_page() -> bool:
        text = page.read_text() if page.exists() else ""
        return "http-equiv='refresh'" in text and "slow" in text

    try:
        await eventually(running_page, what="the page of the running turn, with its tool call")
        assert not following.done()
    finally:
        gate.opened.set()
    async with asyncio.timeout(30):
        assert await following == 0
    final = page.read_text()
    assert "http-equiv" not in final and turn.id in final and "slow" in final
    assert (await tk.store.load_turn(turn.id)).status == "completed"


@postgres_only
async def test_only_conversations_someone_watches_cost_a_notify(store: Store, database_url: str) -> None:
    """PostgreSQL: a publisher sends a conversation's live messages only while some process announced that it watches
    it: one that subscribed before the publisher began (it answers the publisher's roll call), one that subscribed
    after; a conversation nobody watches costs no NOTIFY, and an announcement that is not renewed expires."""
    import asyncpg

    watcher_store = await Store.open(database_url, migrate=False)
    publisher = transport_for(store)
    assert isinstance(publisher, PostgresTransport)
    publisher.warmup = 0  # believe presence from the first publish on (the default sends all for its first seconds)
    watcher = transport_for(watcher_store)
    raw_url = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    outsider = await asyncpg.connect(raw_url)  # listens without announcing itself: it sees what is sent
    heard: list[tuple[str, str]] = []
    for conversation in ("conv_early", "conv_late", "conv_nobody"):
        await outsider.add_listener(channel_of(conversation), lambda _c, _p, ch, payload: heard.append((ch, payload)))
    early = await watcher.subscribe(["conv_early"])
    late: Subscription | None = None
    try:
        assert await publisher.publish([LiveMessage("text", "conv_nobody", text="warm")]) == 0
        await eventually(
            lambda: _true(publisher.watched("conv_early")), what="the roll call answered", timeout=5
        )  # before any periodic announcement
        late = await watcher.subscribe(["conv_late"])
        await eventually(lambda: _true(publisher.watched("conv_late")), what="the late watcher announced")
        assert not publisher.watched("conv_nobody")

        skipped = publisher.skipped
        sent = await publisher.publish(
            [LiveMessage("text", c, text=c) for c in ("conv_nobody", "conv_early", "conv_nobody", "conv_late")]
        )
        assert sent == 2 and publisher.skipped == skipped + 2
        assert [m.text for m in [await early.get(timeout=10), await late.get(timeout=10)] if m] == [
            "conv_early",
            "conv_late",
        ]
        await eventually(lambda: _true(len(heard) >= 2), what="the outsider heard the watched messages")
        # Commit order: a NOTIFY to conv_nobody, sent before them, would have arrived first.
        assert [LiveMessage.parse(p).text for _, p in heard if LiveMessage.parse(p)] == ["conv_early", "conv_late"]

        await early.close()
        await eventually(lambda: _true(not publisher.watched("conv_early")), what="the unwatch heard")
        assert publisher.watched("conv_late")

        stale = {"op": "watch", "watcher": "gone", "channels": [channel_of("conv_stale")], "ttl": 0.5}
        await outsider.execute("SELECT pg_notify($1, $2)", PRESENCE_CHANNEL, json.dumps(stale))
        await eventually(lambda: _true(publisher.watched("conv_stale")), what="the stale watcher heard")
        await eventually(lambda: _true(not publisher.watched("conv_stale")), what="its announcement expired")
    finally:
        await early.close()
        if late is not None:
            await late.close()
        await outsider.close()
        await watcher_store.close()


async def test_a_publisher_forgets_watchers_that_ended_silently_once_it_keeps_many(tmp_path: Path) -> None:
    """A publisher that hears presence keeps every announced channel until it expires, but checks expiry only for
    channels it publishes to: once it keeps more than its bound, a new announcement clears the expired ones (watchers
    killed without an unwatch, on channels nobody published to since), and what has not expired stays watched."""
    from turnkit.store import live

    store = await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'presence.db'}")
    try:
        publisher = PostgresTransport(store)  # only its presence bookkeeping runs: no connection is made
        publisher.warmup = 0

        def hear(watcher: str, channels: list[str], ttl: float) -> None:
            notice = {"op": "watch", "watcher": watcher, "channels": channels, "ttl": ttl}
            publisher._presence(None, 0, PRESENCE_CHANNEL, json.dumps(notice))  # pyright: ignore[reportPrivateUsage]

        publisher._hearing_since = asyncio.get_running_loop().time()  # pyright: ignore[reportPrivateUsage]
        hear("alive", [channel_of("conv_alive")], ttl=60)
        dead = [channel_of(f"conv_dead_{n}") for n in range(live._WATCHED_PRUNE_AT)]  # pyright: ignore[reportPrivateUsage]
        for start in range(0, len(dead), 100):
            hear("killed", dead[start : start + 100], ttl=0)  # expired as soon as heard
        kept = publisher._watched  # pyright: ignore[reportPrivateUsage]
        assert len(kept) == live._WATCHED_PRUNE_AT + 1  # pyright: ignore[reportPrivateUsage]
        hear("late", [channel_of("conv_late")], ttl=60)  # past the bound: the expired ones go
        assert set(kept) == {channel_of("conv_alive"), channel_of("conv_late")}
        assert publisher.watched("conv_alive") and publisher.watched("conv_late")
        assert not publisher.watched("conv_dead_0")
    finally:
        await store.close()


async def _true(value: bool) -> bool:
    return value
