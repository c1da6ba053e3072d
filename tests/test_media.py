"""Images and media (issue 10 item 4): bytes in the store, references everywhere else; image input to providers.

Providers are the official SDKs pointed at :class:`tests.provider_server.ProviderServer`; the assertions are on the
exact request JSON the server received. No workflow history may hold a media item's bytes.
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import anthropic
import openai
import pytest
import pytest_asyncio

import turnkit
from tests.provider_server import ProviderServer, anthropic_message, anthropic_text, openai_response, openai_text
from turnkit.errors import InputError
from turnkit.media import MediaInput
from turnkit.providers import AnthropicClient, OpenAIClient
from turnkit.runtime import TurnKit
from turnkit.store.store import Store
from turnkit.testing import ScriptedClient

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
    """Neither the raw bytes nor their base64 appear in the turn's or its lane's history."""
    encoded = base64.b64encode(data)
    for workflow_id in (turn.id, turn.record.conversation_id):
        raw = await history_bytes(tk, workflow_id)
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
        with pytest.raises(turnkit.errors.RecordNotFound, match="media not found: media_missing"):
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
