"""Images and media (issue 10 item 4): bytes in the store, references everywhere else; image input to providers.

Providers are the official SDKs pointed at :class:`tests.provider_server.ProviderServer`; the assertions are on the
exact request JSON the server received. No workflow history may hold a media item's bytes.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import http.server
import io
import signal
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import suppress
from pathlib import Path

import anthropic
import openai
import pytest
import pytest_asyncio
from temporalio.service import RPCError, RPCStatusCode

import turnkit
from tests.engine import Engine
from tests.provider_server import (
    ProviderServer,
    anthropic_message,
    anthropic_text,
    openai_call,
    openai_response,
    openai_text,
)
from tests.request_client import start_client
from turnkit.kernel.errors import InputError
from turnkit.media import MAX_MEDIA_BYTES, MediaInput
from turnkit.media_requests import VIEW_MEDIA_INSTRUCTIONS, PaintRequest
from turnkit.media_tools import ImageTool, ViewMediaTool, paint_in_turn, view_media_in_turn
from turnkit.providers import AnthropicClient, OpenAIClient
from turnkit.runtime import TurnKit
from turnkit.store.store import Store
from turnkit.testing import ScriptedClient, call_tools, image
from turnkit.tools import ToolContext

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png(marker: str) -> bytes:
    """Bytes that sniff as PNG and carry ``marker`` (so a history search can find them)."""
    return PNG_SIGNATURE + b"IHDR" + marker.encode() + bytes(range(256))


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


@pytest_asyncio.fixture
async def openai_client(server: ProviderServer) -> AsyncIterator[OpenAIClient]:
    client = OpenAIClient(client=openai.AsyncOpenAI(api_key="sk-test", base_url=f"{server.url}/v1", max_retries=0))
    yield client
    await client.close()


@pytest_asyncio.fixture
async def anthropic_client(server: ProviderServer) -> AsyncIterator[AnthropicClient]:
    client = AnthropicClient(client=anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=server.url, max_retries=0))
    yield client
    await client.close()


async def history_bytes(tk: TurnKit, workflow_id: str) -> bytes:
    history = await tk.client.get_workflow_handle(workflow_id).fetch_history()
    return b"".join(event.SerializeToString() for event in history.events)


async def assert_no_media_in_histories(tk: TurnKit, turn: turnkit.Turn, data: bytes) -> None:
    """Neither the raw bytes nor their base64 appear in the turn's or its lane's history (a fresh conversation's
    first turn has no lane: issue 9)."""
    encoded = base64.b64encode(data)
    for workflow_id in (turn.id, turn.record.conversation_id):
        try:
            raw = await history_bytes(tk, workflow_id)
        except RPCError as err:
            assert err.status == RPCStatusCode.NOT_FOUND and workflow_id != turn.id, err
            continue
        assert data[8:40] not in raw, workflow_id
        assert encoded[8:60] not in raw, workflow_id


# -- MediaInput and the store -------------------------------------------------------------------------------------


def test_media_input_infers_the_type_and_refuses_unsupported_media(tmp_path: Path) -> None:
    """Behaviour §4.3: the MIME type comes from the argument, the file extension or the bytes; png, jpeg, webp,
    gif, pdf, audio/* and video/* are supported, anything else is an InputError."""
    assert MediaInput.bytes(png("a")).mime_type == "image/png"
    assert MediaInput.bytes(b"\xff\xd8\xff\xe0jpeg").mime_type == "image/jpeg"
    assert MediaInput.bytes(b"%PDF-1.7 doc").kind == "document"
    assert MediaInput.bytes(b"RIFF\x00\x00\x00\x00WEBPVP8 ").mime_type == "image/webp"
    assert MediaInput.bytes(b"ID3...", mime_type="audio/mpeg").kind == "audio"
    file = tmp_path / "chart.gif"
    file.write_bytes(b"not really a gif")
    from_file = MediaInput.path(file)
    assert (from_file.mime_type, from_file.filename) == ("image/gif", "chart.gif")
    with pytest.raises(InputError, match="cannot infer the media type"):
        MediaInput.bytes(b"plain text")
    with pytest.raises(InputError, match="unsupported media type: text/plain"):
        MediaInput.bytes(b"hello", mime_type="text/plain")
    with pytest.raises(InputError, match="media is empty"):
        MediaInput.bytes(b"", mime_type="image/png")
    with pytest.raises(InputError, match="cannot read media file"):
        MediaInput.path(tmp_path / "missing.png")


def test_media_input_from_a_binary_file_object(tmp_path: Path) -> None:
    """Issue 39 (§4.3 "an IO"): a file object opened in binary mode is read from its position; its name is kept;
    a text-mode file is refused with a message that says to open it in binary mode."""
    file = tmp_path / "scan.pdf"
    file.write_bytes(b"%PDF-1.7 scanned")
    with file.open("rb") as handle:
        scanned = MediaInput.file(handle)
    assert (scanned.mime_type, scanned.filename, scanned.data) == ("application/pdf", "scan.pdf", b"%PDF-1.7 scanned")
    buffer = io.BytesIO(b"skip" + png("buffer"))
    buffer.seek(4)
    assert MediaInput.file(buffer, filename="x.png").data == png("buffer")
    with file.open("r") as text, pytest.raises(InputError, match=r"scan\.pdf' is open in text mode: open it in binary"):
        MediaInput.file(text)  # type: ignore[arg-type]


@pytest.fixture
def media_site() -> Iterator[str]:
    """A local HTTP server for media URLs: ``/cat.png`` (served as image/png), ``/blob`` (a PNG served as
    ``application/octet-stream``), ``/huge.png`` (more than MAX_MEDIA_BYTES); anything else is a 404."""
    pages = {"/cat.png": (png("cat"), "image/png"), "/blob": (png("blob"), "application/octet-stream")}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/huge.png":
                self.send_response(200)
                self.send_header("Content-Type", "image/png")
                self.end_headers()
                chunk = b"\0" * (1 << 20)
                with suppress(OSError):  # the client stops reading past the limit
                    for _ in range(MAX_MEDIA_BYTES // len(chunk) + 2):
                        self.wfile.write(chunk)
                return
            if self.path not in pages:
                self.send_error(404)
                return
            body, content_type = pages[self.path]
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def test_media_input_from_a_url(media_site: str, tk: TurnKit) -> None:
    """Issue 39 (§4.3 "a URL"): the bytes are downloaded when the input is made, typed by the served Content-Type,
    else the path's extension or the bytes; the turn's record holds the bytes (not the URL). Errors name the URL."""
    cat = await MediaInput.url(f"{media_site}/cat.png")
    assert (cat.data, cat.mime_type, cat.filename) == (png("cat"), "image/png", "cat.png")
    blob = await MediaInput.url(f"{media_site}/blob")
    assert (blob.mime_type, blob.filename) == ("image/png", "blob")  # generic type: the bytes decide
    with pytest.raises(InputError, match=r"cannot fetch media from http://127\.0\.0\.1:\d+/missing\.png: HTTP 404"):
        await MediaInput.url(f"{media_site}/missing.png")
    with pytest.raises(InputError, match=r"huge\.png is too large"):
        await MediaInput.url(f"{media_site}/huge.png")
    with pytest.raises(InputError, match="media URL must be http or https: 'file:///etc/passwd'"):
        await MediaInput.url("file:///etc/passwd")

    client = ScriptedClient(["A cat."])
    agent = turnkit.Agent("url-viewer", model="scripted", client=client)
    turn = await (await tk.conversation(agent)).ask("what is it?", media=[cat])
    assert turn.status == "completed", turn.error
    [sent] = client.requests[0].messages[-1]["media"]
    assert sent["media_id"] == f"media_{hashlib.sha256(png('cat')).hexdigest()[:24]}" and "url" not in sent


async def test_media_is_stored_once_by_content_and_read_back(database_url: str) -> None:
    """Media bytes live in the store's media table (SQLite and PostgreSQL), content-addressed: storing equal bytes
    again (a retried write) finds the same row, and the reference carries id, type, size and SHA-256."""
    store = await Store.open(database_url)
    try:
        await check_media_round_trip(store)
    finally:
        await store.close()


async def check_media_round_trip(store: Store) -> None:
    data = png(uuid.uuid4().hex)
    async with store.atomic() as tx:
        first = await tx.put_media(data, mime_type="image/png", filename="a.png")
    async with store.atomic() as tx:
        again = await tx.put_media(data, mime_type="image/jpeg", filename="b.png")
        loaded = await tx.load_media(first.id)
        stored = await tx.load_media_data(first.id)
    digest = hashlib.sha256(data).hexdigest()
    assert first == again == loaded
    assert first.reference() == {
        "media_id": f"media_{digest[:24]}",
        "mime_type": "image/png",
        "byte_size": len(data),
        "sha256": digest,
        "filename": "a.png",
    }
    assert stored == data
    async with store.atomic() as tx:
        with pytest.raises(turnkit.kernel.errors.RecordNotFound, match="media not found: media_missing"):
            await tx.load_media("media_missing")


# -- image input with ask / run -----------------------------------------------------------------------------------


async def test_ask_with_media_sends_an_input_image_to_openai(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """``ask(..., media=[MediaInput])``: the message holds a reference, the OpenAI Responses request gets the image
    as an ``input_image`` data URL after the text, and no history holds the bytes."""
    data = png(uuid.uuid4().hex)
    server.script(openai_response(openai_text("A red square.")))
    agent = turnkit.Agent("vision-openai", model="gpt-vision", client=openai_client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("what is this?", media=[MediaInput.bytes(data, filename="square.png")])

    assert turn.status == "completed", turn.error
    assert turn.output_text == "A red square."
    [body] = server.bodies
    digest = hashlib.sha256(data).hexdigest()
    assert body["input"] == [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "what is this?"},
                {
                    "type": "input_image",
                    "image_url": "data:image/png;base64," + base64.b64encode(data).decode(),
                    "detail": "auto",
                },
            ],
        }
    ]
    [message] = [m for m in await conversation.messages() if m.role == "user"]
    assert message.content == [
        {"type": "text", "text": "what is this?"},
        {
            "type": "media",
            "kind": "image",
            "media_id": f"media_{digest[:24]}",
            "mime_type": "image/png",
            "byte_size": len(data),
            "sha256": digest,
            "filename": "square.png",
        },
    ]
    await assert_no_media_in_histories(tk, turn, data)


async def test_run_with_media_sends_image_and_document_blocks_to_anthropic(
    tk: TurnKit, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    """``run(..., media=[...])`` with Anthropic: base64 ``image`` and ``document`` blocks before the task text."""
    image = png(uuid.uuid4().hex)
    document = b"%PDF-1.4 " + uuid.uuid4().hex.encode()
    server.script(anthropic_message(anthropic_text("Both seen.")))
    agent = turnkit.Agent("vision-anthropic", model="claude-vision", client=anthropic_client)
    run = await tk.run(agent, "describe both", media=[MediaInput.bytes(image), MediaInput.bytes(document)])

    assert run.status == "completed", run.error
    [body] = server.bodies
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()},
                },
                {
                    "type": "document",
                    "source": {
                        "type": "base64",
                        "media_type": "application/pdf",
                        "data": base64.b64encode(document).decode(),
                    },
                },
                {"type": "text", "text": "describe both"},
            ],
        }
    ]
    await assert_no_media_in_histories(tk, run, image)


async def test_media_reaches_the_model_as_a_reference_in_preview_and_bytes_in_the_call(tk: TurnKit) -> None:
    """The projected message carries the reference (no bytes) in ``preview``; the client call gets the bytes."""
    data = png(uuid.uuid4().hex)
    client = ScriptedClient(["seen"])
    agent = turnkit.Agent("vision-scripted", model="scripted", client=client)
    conversation = await tk.conversation(agent)
    prepared = await conversation.build_turn("look", media=[MediaInput.bytes(data)])
    preview = await prepared.preview()
    [user] = preview.messages
    assert "data" not in user["media"][0] and user["media"][0]["mime_type"] == "image/png"
    turn = await prepared.run()
    assert turn.status == "completed", turn.error
    [sent] = client.requests[0].messages
    assert base64.b64decode(sent["media"][0]["data"]) == data


async def test_ask_refuses_media_that_is_not_a_media_input(tk: TurnKit) -> None:
    """Bad ``media=`` is an InputError naming it, before anything is written."""
    agent = turnkit.Agent("vision-bad", model="scripted", client=ScriptedClient(["never"]))
    conversation = await tk.conversation(agent)
    with pytest.raises(InputError, match=r"media\[0\] must be a MediaInput, not bytes"):
        await conversation.ask("look", media=[b"raw"])  # pyright: ignore[reportArgumentType]
    assert await conversation.messages() == []


# -- view_media and paint inside turns ----------------------------------------------------------------------------


def recorder() -> tuple[list[turnkit.Event], Callable[[turnkit.Event], None]]:
    seen: list[turnkit.Event] = []
    return seen, seen.append


async def test_view_media_tool_analyses_a_stored_image_inside_the_turn(tk: TurnKit) -> None:
    """Behaviour §3.12 (inside a running turn) and §4.3 ``ViewMediaTool``: the model names a media id, the client gets
    the image with the objective, a ``media_analysis`` message is written (with the reference, not the bytes), the
    call is charged to the turn, ``media.*`` events fire, and the next model call sees the tool result only."""
    data = png(uuid.uuid4().hex)
    media_id = "media_" + hashlib.sha256(data).hexdigest()[:24]
    client = ScriptedClient(
        [call_tools(("view_media", {"media_id": media_id, "objective": "what colour?"})), "It is red.", "Red."]
    )
    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    agent = turnkit.Agent("viewer", model="scripted", tools=[ViewMediaTool()], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("look at this", media=[MediaInput.bytes(data)])

    assert turn.status == "completed", turn.error
    assert turn.output_text == "Red."
    [analysis_call] = [request.messages for request in client.requests[1:2]]
    assert analysis_call == [
        {
            "role": "user",
            "content": "what colour?",
            "media": [
                {
                    "media_id": media_id,
                    "kind": "image",
                    "mime_type": "image/png",
                    "byte_size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest(),
                    "data": base64.b64encode(data).decode(),
                }
            ],
        }
    ]
    [execution] = await turn.tool_executions()
    assert execution.status == "completed"
    assert execution.result is not None
    assert execution.result["text"] == "It is red."
    assert execution.result["media"]["media_id"] == media_id and "data" not in execution.result["media"]
    messages = await conversation.messages()
    assert [(m.role, m.kind) for m in messages] == [
        ("user", "text"),
        ("assistant", "tool_call"),
        ("assistant", "media_analysis"),
        ("tool", "tool_result"),
        ("assistant", "text"),
    ]
    analysis = messages[2]
    assert analysis.metadata["tool_execution_id"] == execution.id and analysis.turn_id == turn.id
    assert analysis.content[0]["text"] == "It is red." and analysis.content[0]["provider"] == "scripted"
    # The last call sees the call and its result next to each other; the analysis message is not projected.
    assert [m["role"] for m in client.requests[2].messages] == ["user", "assistant", "tool"]
    assert turn.usage.input_tokens == 30  # two turn calls and the analysis
    types = [event.type for event in events if event.type.startswith("media.")]
    assert types == ["media.requested", "media.completed"]
    completed = next(event for event in events if event.type == "media.completed")
    assert completed.payload["analysis"] == "It is red." and completed.payload["media"]["media_id"] == media_id
    await assert_no_media_in_histories(tk, turn, data)


async def test_view_media_of_an_unknown_id_fails_the_call_and_emits_nothing_billed(tk: TurnKit) -> None:
    """A media id that is not stored fails the tool call with the id named; the model sees it and goes on."""
    client = ScriptedClient(
        [call_tools(("view_media", {"media_id": "media_nothere", "objective": "x"})), "could not look"]
    )
    agent = turnkit.Agent("viewer-missing", model="scripted", tools=[ViewMediaTool()], client=client)
    turn = await (await tk.conversation(agent)).ask("look")
    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert "media not found: media_nothere" in str(execution.error)
    assert client.calls == 2


async def test_view_media_through_anthropic_sends_the_image_with_the_objective(
    tk: TurnKit, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    """A ``ViewMediaTool`` with an Anthropic client: one Messages call with the image block and the objective."""
    data = png(uuid.uuid4().hex)
    media_id = "media_" + hashlib.sha256(data).hexdigest()[:24]
    server.script(anthropic_message(anthropic_text("A red square.")))
    client = ScriptedClient([call_tools(("view_media", {"media_id": media_id, "objective": "describe"})), "done"])
    tool = ViewMediaTool(client=anthropic_client)
    agent = turnkit.Agent("viewer-anthropic", model="claude-eyes", tools=[tool], client=client)
    turn = await (await tk.conversation(agent)).ask("see", media=[MediaInput.bytes(data)])

    assert turn.status == "completed", turn.error
    [body] = server.bodies
    assert body["model"] == "claude-eyes"
    assert body["system"] == VIEW_MEDIA_INSTRUCTIONS
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(data).decode()},
                },
                {"type": "text", "text": "describe"},
            ],
        }
    ]
    [execution] = await turn.tool_executions()
    assert execution.result is not None
    assert (execution.result["text"], execution.result["provider"]) == ("A red square.", "anthropic")


def openai_image(data: bytes, revised_prompt: str) -> dict[str, object]:
    """An ``images.generate`` answer in OpenAI's wire format."""
    return {
        "created": 1_700_000_000,
        "data": [{"b64_json": base64.b64encode(data).decode(), "revised_prompt": revised_prompt}],
        "output_format": "png",
        "usage": {
            "input_tokens": 20,
            "output_tokens": 4000,
            "total_tokens": 4020,
            "input_tokens_details": {"text_tokens": 20, "image_tokens": 0},
        },
    }


async def test_image_tool_paints_through_openai_and_stores_the_image_outside_the_history(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """Behaviour §3.12 ``paint`` inside a turn through OpenAI's ``images.generate``: the request JSON, an ``image``
    message and a tool result that reference the stored image (no base64), ``image.*`` events, usage charged."""
    data = png(uuid.uuid4().hex)
    server.script(
        openai_response(openai_call("call_paint", "paint", {"prompt": "a red square"})),
        openai_image(data, "A red square on white."),
        openai_response(openai_text("Painted.")),
    )
    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    agent = turnkit.Agent(
        "painter-openai", model="gpt-chat", tools=[ImageTool(model="gpt-image-1")], client=openai_client
    )
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("paint a red square")

    assert turn.status == "completed", turn.error
    assert [request.path for request in server.requests] == ["/v1/responses", "/v1/images/generations", "/v1/responses"]
    assert server.bodies[1] == {"model": "gpt-image-1", "prompt": "a red square", "n": 1}
    digest = hashlib.sha256(data).hexdigest()
    [execution] = await turn.tool_executions()
    assert execution.result is not None
    assert {k: execution.result[k] for k in ("media_id", "mime_type", "byte_size", "sha256", "revised_prompt")} == {
        "media_id": f"media_{digest[:24]}",
        "mime_type": "image/png",
        "byte_size": len(data),
        "sha256": digest,
        "revised_prompt": "A red square on white.",
    }
    assert "data" not in execution.result
    async with tk.store.atomic() as tx:
        assert await tx.load_media_data(execution.result["media_id"]) == data
    [image_message] = [m for m in await conversation.messages() if m.kind == "image"]
    assert image_message.role == "assistant" and image_message.metadata["tool_execution_id"] == execution.id
    assert "data" not in image_message.content[0] and image_message.content[0]["provider"] == "openai"
    assert [e.type for e in events if e.type.startswith("image.")] == ["image.requested", "image.completed"]
    requested = next(e for e in events if e.type == "image.requested")
    assert requested.payload["request"]["prompt"] == "a red square"
    assert turn.usage.output_tokens == 7 + 4000 + 7  # two chat calls and the generation
    await assert_no_media_in_histories(tk, turn, data)


async def test_the_painter_edits_with_reference_images_and_a_mask_through_openai(
    tk: TurnKit, server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """Issue 39 (behaviour §1.8 painter, §3.12 ``paint`` with ``input_images`` and ``mask``): reference images and a
    mask given to the turn go to OpenAI's ``images.edit`` as multipart files (every reference, then the mask, with
    their bytes and types); the edited image is stored and the turn ends with it. A mask without an image to edit is
    refused before anything is sent."""
    photo, sketch, mask = png(f"photo-{uuid.uuid4().hex}"), png(f"sketch-{uuid.uuid4().hex}"), png("mask")
    ids = [f"media_{hashlib.sha256(each).hexdigest()[:24]}" for each in (photo, sketch, mask)]
    edited = png(f"edited-{uuid.uuid4().hex}")
    arguments = {"prompt": "put a hat on it", "reference_images": ids[:2], "mask": ids[2]}
    server.script(
        openai_response(openai_call("call_paint", "paint_image", arguments)),
        openai_image(edited, "A cat in a hat."),
    )
    painter = turnkit.specialists.painter(
        model="gpt-chat", image_model="gpt-image-1", authorization=lambda request, context: True, client=openai_client
    )
    media = [MediaInput.bytes(each) for each in (photo, sketch, mask)]
    turn = await (await tk.conversation(painter)).ask("edit my photo", media=media)

    assert turn.status == "completed", turn.error
    assert [request.path for request in server.requests] == ["/v1/responses", "/v1/images/edits"]
    sent = server.bodies[1]
    assert (sent["model"], sent["prompt"], sent["n"]) == ("gpt-image-1", "put a hat on it", "1")
    assert [(f.data, f.content_type) for f in sent["image[]"]] == [(photo, "image/png"), (sketch, "image/png")]
    assert (sent["mask"].data, sent["mask"].content_type) == (mask, "image/png")
    [execution] = await turn.tool_executions()
    assert execution.result is not None
    stored = execution.result["image"]
    async with tk.store.atomic() as tx:
        assert await tx.load_media_data(stored["media_id"]) == edited
    await assert_no_media_in_histories(tk, turn, photo)

    with pytest.raises(turnkit.ConfigError, match="a mask needs the image it edits"):
        await openai_client.paint(PaintRequest(prompt="x", model="gpt-image-1", mask={"data": "", "mime_type": "p"}))
    assert len(server.requests) == 2


async def test_paint_with_an_anthropic_client_fails_with_a_config_error(
    tk: TurnKit, server: ProviderServer, anthropic_client: AnthropicClient
) -> None:
    """Anthropic has no image API: the paint call fails with a clear error, nothing is sent to the server."""
    client = ScriptedClient([call_tools(("paint", {"prompt": "a cat"})), "no image"])
    tool = ImageTool(model="claude-image", client=anthropic_client)
    agent = turnkit.Agent("painter-anthropic", model="scripted", tools=[tool], client=client)
    turn = await (await tk.conversation(agent)).ask("paint")
    assert turn.status == "completed", turn.error
    [execution] = await turn.tool_executions()
    assert execution.status == "failed"
    assert "AnthropicClient cannot paint: anthropic has no image generation API" in str(execution.error)
    assert server.requests == []


async def test_image_tool_with_the_scripted_client(tk: TurnKit) -> None:
    """The scripted client's ``images`` script answers ``paint``; the request carries model, size and prompt."""
    data = png(uuid.uuid4().hex)

    class Poster(ImageTool):
        model = "scripted-image"
        size = "1024x1024"

    client = ScriptedClient([call_tools(("poster", {"prompt": "a poster"})), "done"], images=[image(data)])
    agent = turnkit.Agent("poster", model="scripted", tools=[Poster()], client=client)
    turn = await (await tk.conversation(agent)).ask("poster please")
    assert turn.status == "completed", turn.error
    [request] = client.paint_requests
    assert (request.prompt, request.model, request.size) == ("a poster", "scripted-image", "1024x1024")
    [execution] = await turn.tool_executions()
    assert execution.result is not None and execution.result["byte_size"] == len(data)


async def test_a_paint_answered_without_an_image_fails_the_call(tk: TurnKit) -> None:
    """Behaviour §3.12 step 4: a ``paint`` answer with no image part fails the call with "image client returned no
    image", one whose image has neither url nor data with "image client returned image without url or data"; no
    ``image`` message is written and ``image.completed`` is never emitted; the turn goes on. Step 3 comes first:
    both calls are charged to the turn."""
    events: list[turnkit.Event] = []
    turnkit.configure(on_event=events.append)
    empty = turnkit.Result(parts=[], usage=turnkit.Usage(input_tokens=1, output_tokens=100))
    hollow = turnkit.Result(
        parts=[{"type": "image", "mime_type": "image/png"}], usage=turnkit.Usage(input_tokens=2, output_tokens=200)
    )

    class Poster(ImageTool):
        model = "scripted-image"

    client = ScriptedClient(
        [call_tools(("poster", {"prompt": "one"})), call_tools(("poster", {"prompt": "two"})), "gave up"],
        images=[empty, hollow],
    )
    conversation = await tk.conversation(turnkit.Agent("hollow", model="scripted", tools=[Poster()], client=client))
    turn = await conversation.ask("posters")
    assert turn.status == "completed" and turn.output_text == "gave up"
    executions = await turn.tool_executions()
    assert [(e.status, (e.error or {}).get("message")) for e in executions] == [
        ("failed", "Error: image client returned no image"),  # a non-ToolError is recorded "<class>: <message>"
        ("failed", "Error: image client returned image without url or data"),
    ]
    assert len(client.paint_requests) == 2
    assert [m for m in await conversation.messages() if m.kind == "image"] == []
    mine = [e.type for e in events if e.turn_id == turn.id and e.type.startswith("image.")]
    assert mine == ["image.requested", "image.requested"]
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (30 + 3, 15 + 300)  # three model calls, two paints


async def test_a_repeated_unusable_paint_of_one_execution_is_charged_once(tk: TurnKit) -> None:
    """A paint answered with no image is charged keyed by its message id (derived from the execution): a second
    identical call in the same execution (what a retried attempt makes) raises the same error without calling the
    client or charging again."""
    errors: list[str] = []

    @turnkit.tool
    async def paint_twice(context: ToolContext) -> dict[str, str]:
        """Paint twice."""
        for _ in range(2):
            try:
                await paint_in_turn(context, "a cat", model="scripted-image")
            except turnkit.Error as err:
                errors.append(str(err))
        return {"errors": "; ".join(errors)}

    empty = turnkit.Result(parts=[], usage=turnkit.Usage(input_tokens=1, output_tokens=100))
    client = ScriptedClient([call_tools(("paint_twice", {})), "done"], images=[empty, empty])
    agent = turnkit.Agent("empty-twice", model="scripted", tools=[paint_twice], client=client)
    turn = await (await tk.conversation(agent)).ask("paint")
    assert turn.status == "completed", turn.error
    assert errors == ["image client returned no image"] * 2
    assert len(client.paint_requests) == 1
    assert (turn.usage.input_tokens, turn.usage.output_tokens) == (20 + 1, 10 + 100)


async def test_a_paint_over_max_spend_fails_the_turn(tk: TurnKit) -> None:
    """T34 for a media call (behaviour §3.12 step 3): an image costing 0.05, painted by a terminal tool inside a turn
    whose max_spend is 0.03, is charged, then fails the turn with "cost limit reached" right away (the tool call
    fails with it, so the terminal tool ends nothing); the image stays recorded, as a model response over budget
    does."""
    data = png(uuid.uuid4().hex)

    class Poster(ImageTool):
        model = "scripted-image"
        terminal = "Poster painted."

    costly = image(data, usage=turnkit.Usage(input_tokens=1, output_tokens=5, cost=0.05))
    client = ScriptedClient([call_tools(("poster", {"prompt": "a poster"})), "never"], images=[costly])
    agent = turnkit.Agent("thrifty-poster", model="scripted", tools=[Poster()], client=client, max_spend=0.03)
    turn = await (await tk.conversation(agent)).ask("poster please")
    assert turn.status == "failed"
    assert turn.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}
    assert turn.cost.total == pytest.approx(0.05) and client.calls == 1 and len(client.paint_requests) == 1
    [execution] = await turn.tool_executions()
    assert execution.status == "failed" and execution.error is not None
    assert execution.error["message"] == "cost limit reached"
    assert [m.kind for m in await turn.messages()].count("image") == 1


async def test_a_standalone_paint_over_max_spend_fails_the_turn(tk: TurnKit) -> None:
    """T34 for a standalone media call: the prepared turn is charged, fails with "cost limit reached" and the
    BudgetError is re-raised; it never completes."""
    data = png(uuid.uuid4().hex)
    costly = image(data, usage=turnkit.Usage(output_tokens=5, cost=0.05))
    client = ScriptedClient([], images=[costly])
    agent = turnkit.Agent("thrifty-painter", model="scripted", client=ScriptedClient(["never"]), max_spend=0.03)
    prepared = await (await tk.conversation(agent)).build_turn("paint a cat")
    with pytest.raises(turnkit.BudgetError, match=r"^cost limit reached$"):
        await prepared.paint("a cat", model="scripted-image", client=client)
    failed = await prepared.refresh()
    assert failed.status == "failed" and failed.cost.total == pytest.approx(0.05)
    assert failed.error is not None and failed.error["class"] == "TurnKit::BudgetError"


async def test_require_image_and_require_media_analysis_policies(tk: TurnKit) -> None:
    """Behaviour §3.9: ``OutputPolicy.require_image`` passes when the turn's messages hold an image (fail mode
    otherwise fails the turn with OutputAudit); ``require_media_analysis`` likewise for analyses."""
    data = png(uuid.uuid4().hex)
    painted = ScriptedClient([call_tools(("paint", {"prompt": "a cat"})), "Here it is."], images=[image(data)])
    painter = turnkit.Agent(
        "must-paint",
        model="scripted",
        tools=[ImageTool(model="scripted-image")],
        client=painted,
        output_policy=[turnkit.OutputPolicy.require_image],
    )
    run = await tk.run(painter, "paint a cat")
    assert run.status == "completed", run.error
    assert run.policy_clean is True

    lazy = turnkit.Agent(
        "must-paint-lazy",
        model="scripted",
        client=ScriptedClient(["No image, sorry."]),
        output_policy=[turnkit.OutputPolicy.require_image],
    )
    failed = await tk.run(lazy, "paint a cat")
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["class"] == "TurnKit::OutputAudit"
    assert failed.error["policy_audit"]["violations"][0]["rule"] == "require_image"

    viewer = turnkit.Agent(
        "must-look",
        model="scripted",
        client=ScriptedClient(["I did not look."]),
        output_policy=[turnkit.OutputPolicy.require_media_analysis],
    )
    unseen = await tk.run(viewer, "look")
    assert unseen.status == "failed" and unseen.error is not None
    assert unseen.error["policy_audit"]["violations"][0]["rule"] == "require_media_analysis"


# -- stateless calls outside a turn -------------------------------------------------------------------------------


async def test_module_level_paint_and_view_media_call_the_client_and_persist_nothing(
    server: ProviderServer, openai_client: OpenAIClient
) -> None:
    """Behaviour §1.9: ``turnkit.paint`` / ``turnkit.view_media`` return the first image or analysis; no store."""
    data = png(uuid.uuid4().hex)
    server.script(openai_image(data, "revised"), openai_response(openai_text("A square.")))
    painted = await turnkit.paint("a square", model="gpt-image-1", client=openai_client, size="256x256")
    assert base64.b64decode(painted["data"]) == data
    assert (painted["revised_prompt"], painted["model"], painted["mime_type"]) == (
        "revised",
        "gpt-image-1",
        "image/png",
    )
    assert server.bodies[0] == {"model": "gpt-image-1", "prompt": "a square", "size": "256x256", "n": 1}
    seen = await turnkit.view_media(
        MediaInput.bytes(data, filename="s.png"), objective="what shape?", model="gpt-eyes", client=openai_client
    )
    assert (seen["text"], seen["provider"]) == ("A square.", "openai")
    assert seen["media"] == {"kind": "image", "mime_type": "image/png", "byte_size": len(data), "filename": "s.png"}
    assert server.bodies[1]["input"][0]["content"][1]["image_url"].startswith("data:image/png;base64,")
    with pytest.raises(turnkit.ConfigError, match="paint needs a client"):
        await turnkit.paint("x", model="m")


async def test_compacting_a_conversation_with_media_summarises_without_the_media(tk: TurnKit) -> None:
    """A summary request never carries media references (their bytes are not loaded for it): compaction of a
    history with an image works, and the summariser sees the text."""
    data = png(uuid.uuid4().hex)
    client = ScriptedClient(lambda request: "SUMMARY" if request.metadata.get("compaction") else "answer")
    small = {"context_limit": 200, "reserved_tokens": 0, "threshold": 0.5, "head_messages": 1, "tail_messages": 2}
    agent = turnkit.Agent("vision-compact", model="scripted", client=client, compaction=small)
    conversation = await tk.conversation(agent)
    await conversation.say("hello")
    first = await conversation.ask("look at this", media=[MediaInput.bytes(data)])
    assert first.status == "completed", first.error
    for i in range(4):
        await conversation.say(f"note {i}: " + "x" * 200)
    second = await conversation.ask("and now?")
    assert second.status == "completed", second.error
    summary_request = next(r for r in client.requests if r.metadata.get("compaction"))
    assert all("media" not in message for message in summary_request.messages)
    assert any(message.get("content") == "look at this" for message in summary_request.messages)


async def test_a_repeated_view_media_of_one_execution_is_answered_from_the_store(tk: TurnKit) -> None:
    """The analysis message id is derived from the execution: a second identical call in the same execution (what a
    retried attempt makes) finds the message and neither calls the client nor charges again. A failing analysis
    emits ``media.failed``."""
    data = png(uuid.uuid4().hex)
    answers: list[str] = []

    @turnkit.tool
    async def look_twice(context: ToolContext) -> dict[str, str]:
        """Look at the image twice."""
        media = MediaInput.bytes(data)
        for _ in range(2):
            answers.append((await view_media_in_turn(context, media, objective="colour?"))["text"])
        return {"seen": answers[-1]}

    client = ScriptedClient([call_tools(("look_twice", {})), "It is red.", "done"])
    agent = turnkit.Agent("looker", model="scripted", tools=[look_twice], client=client)
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("look")
    assert turn.status == "completed", turn.error
    assert answers == ["It is red.", "It is red."]
    assert client.calls == 3  # the turn's two calls and one analysis
    assert [m.kind for m in await conversation.messages()].count("media_analysis") == 1
    assert turn.usage.input_tokens == 30

    events, on_event = recorder()
    turnkit.configure(on_event=on_event)

    def blind(request: turnkit.ModelRequest) -> turnkit.Result | str:
        if request.instructions == VIEW_MEDIA_INSTRUCTIONS:
            raise turnkit.ModelError("no eyes today")
        done = any(message["role"] == "tool" for message in request.messages)
        return "gave up" if done else call_tools(("look_twice", {}))

    failing = ScriptedClient(blind)
    agent = turnkit.Agent("looker-failing", model="scripted", tools=[look_twice], client=failing)
    broken = await (await tk.conversation(agent)).ask("look")
    [execution] = await broken.tool_executions()
    assert execution.status == "failed"
    failed = [e for e in events if e.type == "media.failed"]
    assert len(failed) == 1 and failed[0].payload["error"] == "no eyes today"
    assert broken.status == "completed" and broken.output_text == "gave up"


# -- standalone mode: the whole work of a prepared turn -----------------------------------------------------------


async def test_turn_paint_standalone_claims_paints_and_completes_a_prepared_turn(tk: TurnKit) -> None:
    """Behaviour §3.12 standalone: a pending prepared turn is claimed, ``turn.started``, the image is painted and
    stored, the turn completes with ``output_data = {type: image, images}`` (references only); a second call finds it
    completed: ``"cannot paint for completed turn"``; a submitted turn is refused."""
    data = png(uuid.uuid4().hex)
    client = ScriptedClient([], images=[image(data, revised_prompt="a calm cat")])
    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    agent = turnkit.Agent("standalone-painter", model="scripted", client=ScriptedClient(["never"]))
    conversation = await tk.conversation(agent)
    prepared = await conversation.build_turn("paint a cat")
    turn = await prepared.paint("a cat", model="scripted-image", client=client)

    assert turn.status == "completed", turn.error
    digest = hashlib.sha256(data).hexdigest()
    assert turn.output_text == f"media_{digest[:24]}"
    assert turn.record.output_data is not None
    [painted] = turn.record.output_data["images"]
    assert turn.record.output_data["type"] == "image" and painted["sha256"] == digest and "data" not in painted
    assert turn.usage.output_tokens == 5
    [message] = [m for m in await conversation.messages() if m.kind == "image"]
    assert message.turn_id == turn.id and message.content[0]["revised_prompt"] == "a calm cat"
    mine = [e.type for e in events if e.turn_id == turn.id]
    assert mine == ["turn.started", "image.requested", "message.created", "turn.completed", "image.completed"]
    with pytest.raises(turnkit.Error, match=r"^cannot paint for completed turn$"):
        await turn.paint("again", model="scripted-image", client=client)
    queued = await conversation.ask("later", wait=False, paused=True)
    with pytest.raises(turnkit.Error, match=r"^cannot paint for paused turn$"):
        await queued.paint("x", model="scripted-image", client=client)
    await queued.cancel()


async def test_a_standalone_paint_is_audited_by_the_agents_output_policy(tk: TurnKit) -> None:
    """Behaviour §3.12 step 6, "with the output policy applied" (§3.9): the standalone paint's answer (text = the
    media id, data = {type: image, images}) is audited. Fail mode with a dirty audit: the turn fails with
    TurnKit::OutputAudit, the output still recorded, and OutputAudit is raised; report and revise modes: it completes
    with the audit recorded (no revision request: there is no model to revise). A judge call is charged to the turn
    (usage and cost) and counts against max_spend."""
    data = png(uuid.uuid4().hex)
    media_id = "media_" + hashlib.sha256(data).hexdigest()[:24]
    seen: list[tuple[str, object]] = []

    def no_cats(output: object, *, output_text: str, output_data: object) -> str:
        seen.append((output_text, output_data))
        return "no cats allowed"

    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    strict = turnkit.Agent("audited-painter", model="scripted", client=ScriptedClient([]), output_policy=[no_cats])
    prepared = await (await tk.conversation(strict)).build_turn("paint a cat")
    with pytest.raises(turnkit.OutputAudit, match=r"^no cats allowed$"):
        await prepared.paint("a cat", model="scripted-image", client=ScriptedClient([], images=[image(data)]))
    failed = await prepared.refresh()
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["class"] == "TurnKit::OutputAudit" and failed.error["message"] == "no cats allowed"
    assert failed.output_text == media_id and failed.record.output_data is not None
    assert failed.policy_clean is False
    [(text, audited)] = seen
    assert text == media_id and audited == failed.record.output_data
    mine = [e.type for e in events if e.turn_id == prepared.id]
    assert mine == [
        "turn.started",
        "image.requested",
        "message.created",
        "output_policy.completed",
        "turn.failed",
        "image.completed",
    ]

    for mode in ("report", "revise"):
        lenient = turnkit.Agent(
            f"reported-painter-{mode}",
            model="scripted",
            client=ScriptedClient([]),
            output_policy=[no_cats],
            output_policy_mode=mode,
        )
        conversation = await tk.conversation(lenient)
        painted = await (await conversation.build_turn("paint a cat")).paint(
            "a cat", model="scripted-image", client=ScriptedClient([], images=[image(data)])
        )
        assert painted.status == "completed", painted.error
        assert painted.output_text == media_id and painted.policy_clean is False
        assert painted.policy_audit is not None
        assert painted.policy_audit["violations"][0]["message"] == "no cats allowed"
        assert [m.kind for m in await conversation.messages()] == ["text", "image"]  # no revision request

    verdict = '{"approved": true, "violations": []}'
    judge_answer = turnkit.Result.build(text=verdict, usage=turnkit.Usage(input_tokens=7, output_tokens=3, cost=0.02))
    judge = turnkit.OutputPolicy("Images only.", model="judge", client=ScriptedClient([judge_answer]))
    judged = turnkit.Agent("judged-painter", model="scripted", client=ScriptedClient([]), output_policy=[judge])
    clean = await (await (await tk.conversation(judged)).build_turn("paint")).paint(
        "a cat", model="scripted-image", client=ScriptedClient([], images=[image(data)])
    )
    assert clean.status == "completed" and clean.policy_clean is True
    assert (clean.usage.input_tokens, clean.usage.output_tokens) == (17, 8)  # the paint's 10/5 and the judge's 7/3
    assert clean.cost.total == pytest.approx(0.02)

    judge = turnkit.OutputPolicy("Images only.", model="judge", client=ScriptedClient([judge_answer]))
    thrifty = turnkit.Agent(
        "judged-thrifty", model="scripted", client=ScriptedClient([]), output_policy=[judge], max_spend=0.01
    )
    prepared = await (await tk.conversation(thrifty)).build_turn("paint")
    with pytest.raises(turnkit.BudgetError, match=r"^cost limit reached$"):
        await prepared.paint("a cat", model="scripted-image", client=ScriptedClient([], images=[image(data)]))
    over = await prepared.refresh()
    assert over.status == "failed" and over.cost.total == pytest.approx(0.02)


async def test_a_standalone_paint_without_a_usable_image_is_charged_before_it_fails(tk: TurnKit) -> None:
    """Behaviour §3.12 step 3 before step 4: a standalone paint answered with no image is charged to the turn (usage
    and cost), then fails the turn with "image client returned no image"; over max_spend, the charge raises the
    budget error first."""
    empty = turnkit.Result(parts=[], usage=turnkit.Usage(input_tokens=4, output_tokens=2, cost=0.01))
    agent = turnkit.Agent("empty-painter", model="scripted", client=ScriptedClient([]))
    prepared = await (await tk.conversation(agent)).build_turn("paint")
    with pytest.raises(turnkit.Error, match=r"^image client returned no image$"):
        await prepared.paint("a cat", model="scripted-image", client=ScriptedClient([], images=[empty]))
    failed = await prepared.refresh()
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["message"] == "image client returned no image"
    assert (failed.usage.input_tokens, failed.usage.output_tokens) == (4, 2)
    assert failed.cost.total == pytest.approx(0.01)

    costly = turnkit.Result(parts=[], usage=turnkit.Usage(output_tokens=2, cost=0.05))
    thrifty = turnkit.Agent("empty-thrifty", model="scripted", client=ScriptedClient([]), max_spend=0.03)
    prepared = await (await tk.conversation(thrifty)).build_turn("paint")
    with pytest.raises(turnkit.BudgetError, match=r"^cost limit reached$"):
        await prepared.paint("a cat", model="scripted-image", client=ScriptedClient([], images=[costly]))
    assert (await prepared.refresh()).cost.total == pytest.approx(0.05)


async def test_turn_view_media_standalone_fails_the_turn_when_the_client_fails(tk: TurnKit) -> None:
    """Standalone ``view_media``: success completes the turn with the analysis as its output; a client error fails
    the turn, emits ``media.failed`` and is re-raised."""
    data = png(uuid.uuid4().hex)
    agent = turnkit.Agent("standalone-viewer", model="scripted", client=ScriptedClient(["A cat."]))
    conversation = await tk.conversation(agent)
    seen = await (await conversation.build_turn("look")).view_media(MediaInput.bytes(data), objective="what?")
    assert seen.status == "completed", seen.error
    assert seen.output_text == "A cat."
    assert seen.record.output_data is not None and seen.record.output_data["type"] == "media_analysis"

    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    blind = ScriptedClient([])  # exhausted: the analysis call raises
    prepared = await conversation.build_turn("look again")
    with pytest.raises(turnkit.ModelError, match="scripted client has no more results"):
        await prepared.view_media(MediaInput.bytes(data), objective="what?", client=blind)
    failed = await prepared.refresh()
    assert failed.status == "failed" and failed.error is not None
    assert failed.error["message"] == "scripted client has no more results"
    assert [e.type for e in events if e.turn_id == prepared.id] == [
        "turn.started",
        "media.requested",
        "media.failed",
        "turn.failed",
    ]


# -- standalone mode: one durable request, in the turn's own workflow ------------------------------------------------


class HeldPainter:
    """An image client whose ``paint`` blocks until released (or cancelled); it counts its calls."""

    def __init__(self, answer: turnkit.Result) -> None:
        self.answer = answer
        self.entered, self.released, self.cancelled = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self.requests: list[PaintRequest] = []

    async def chat(self, request: turnkit.ModelRequest) -> turnkit.Result:
        raise turnkit.ModelError("this client only paints")

    async def paint(self, request: PaintRequest) -> turnkit.Result:
        self.requests.append(request)
        self.entered.set()
        try:
            await self.released.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return self.answer.model_copy(update={"model": request.model})


async def test_a_standalone_paint_outlives_its_client(tk: TurnKit, engine: Engine) -> None:
    """``Turn.paint`` of a prepared turn from a client process SIGKILLed while the image is painted: the turn's own
    workflow (workflow id = turn id, running the ``turnkit.standalone_media`` activity) stores the image and
    completes the turn without the client or an operator; ``Turn.result()`` from another client waits for that
    workflow and returns the turn. The image client was called once. The turn cannot be painted again."""
    data = png(uuid.uuid4().hex)
    painter = HeldPainter(image(data))
    agent = turnkit.Agent("held-painter", model="scripted", client=painter)
    prepared = await (await tk.conversation(agent)).build_turn("paint a cat")
    client = await start_client(engine, "paint", prepared.id)
    await asyncio.wait_for(painter.entered.wait(), 30)
    assert (await prepared.refresh()).status == "running"
    client.send_signal(signal.SIGKILL)
    assert await client.wait() == -signal.SIGKILL
    painter.released.set()

    done = await tk.turn(prepared.id).result(timeout=60)
    assert done.status == "completed", done.error
    assert done.record.output_data is not None
    assert done.record.output_data["images"][0]["sha256"] == hashlib.sha256(data).hexdigest()
    assert len(painter.requests) == 1 and painter.requests[0].prompt == "a cat"
    history = await tk.client.get_workflow_handle(prepared.id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert started.workflow_type.name == "StandaloneMediaWorkflow"
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    assert scheduled == ["turnkit.standalone_media"]
    with pytest.raises(turnkit.Error, match=r"^cannot paint for completed turn$"):
        await done.paint("again", model="scripted-image")


async def test_cancelling_a_standalone_turn_cancels_its_call(tk: TurnKit) -> None:
    """``Turn.cancel`` of a turn whose standalone paint is in flight cancels the turn's own workflow, and with it the
    paint call (through the activity's heartbeat); the turn ends ``cancelled``, nothing is painted into it, and the
    caller of ``paint`` gets ``LostClaim``."""
    turnkit.configure(model_heartbeat_timeout=1.0)
    painter = HeldPainter(image(png(uuid.uuid4().hex)))
    agent = turnkit.Agent("cancelled-painter", model="scripted", client=painter)
    conversation = await tk.conversation(agent)
    prepared = await conversation.build_turn("paint a cat")
    painting = asyncio.create_task(prepared.paint("a cat", model="scripted-image"))
    await asyncio.wait_for(painter.entered.wait(), 30)
    cancelled = await tk.turn(prepared.id).cancel()
    assert cancelled.status == "cancelled"
    with pytest.raises(turnkit.LostClaim, match="is cancelled"):
        await painting
    await asyncio.wait_for(painter.cancelled.wait(), 30)
    assert [m.kind for m in await conversation.messages()] == ["text"]


async def test_a_standalone_calls_transient_failure_is_retried_by_temporal(tk: TurnKit) -> None:
    """A standalone ``view_media`` whose provider is overloaded once (``TransientModelError``) is asked again by the
    activity's retry, under the same claim: the turn completes with one analysis and one ``turn.started``."""
    data = png(uuid.uuid4().hex)
    answers: list[Exception | str] = [turnkit.TransientModelError("overloaded"), "A cat, again."]

    def flaky(request: turnkit.ModelRequest) -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    events, on_event = recorder()
    turnkit.configure(on_event=on_event)
    client = ScriptedClient(flaky)
    conversation = await tk.conversation(turnkit.Agent("flaky-viewer", model="scripted", client=client))
    seen = await (await conversation.build_turn("look")).view_media(MediaInput.bytes(data), objective="what?")
    assert seen.status == "completed" and seen.output_text == "A cat, again." and client.calls == 2
    assert [m.kind for m in await conversation.messages()] == ["text", "media_analysis"]
    assert [e.type for e in events if e.turn_id == seen.id].count("turn.started") == 1


async def test_a_media_id_is_usable_only_from_its_own_conversations_tree(tk: TurnKit) -> None:
    """Behaviour §3.12: a media id resolves only for a turn whose tree has seen it (a message of its conversations
    references it). Another conversation's image is ``"media not found"`` to a standalone ``view_media`` and to
    ``ViewMediaTool`` alike, and no provider is asked; its own conversation's next turn may analyse it."""
    data = png(uuid.uuid4().hex)
    media_id = "media_" + hashlib.sha256(data).hexdigest()[:24]
    owner_client = ScriptedClient(["kept", "a red square"])
    owner = await tk.conversation(turnkit.Agent("media-owner", model="scripted", client=owner_client))
    assert (await owner.ask("keep this", media=[MediaInput.bytes(data)])).status == "completed"

    intruder_client = ScriptedClient([call_tools(("view_media", {"media_id": media_id, "objective": "what?"})), "no"])
    intruder_agent = turnkit.Agent("media-intruder", model="scripted", tools=[ViewMediaTool()], client=intruder_client)
    intruder = await tk.conversation(intruder_agent)
    prepared = await intruder.build_turn("look at theirs")
    with pytest.raises(turnkit.RecordNotFound, match=f"^media not found: {media_id}$"):
        await prepared.view_media(media_id, objective="what?")
    assert intruder_client.calls == 0, "nobody may be paid to look at another tree's media"

    turn = await intruder.ask("look at theirs, from a tool")
    [execution] = await turn.tool_executions()
    assert execution.status == "failed" and f"media not found: {media_id}" in str(execution.error)
    assert intruder_client.calls == 2  # the turn's own two model calls, no analysis

    seen = await (await owner.build_turn("look again")).view_media(media_id, objective="what?")
    assert seen.status == "completed" and seen.output_text == "a red square"
