"""A local stand-in for the OpenAI, Anthropic, Gemini and Chat Completions HTTP APIs, for testing the provider
clients through the real SDKs.

:class:`ProviderServer` listens on 127.0.0.1 (a free port) in a background thread, records every request it
receives and answers each one with the next scripted :class:`Reply`. Point an SDK at it with ``base_url``:
``f"{server.url}/v1"`` for OpenAI (which appends ``/responses``) and ``server.url`` for Anthropic (which appends
``/v1/messages``), ``server.url`` for Gemini (``/v1beta/models/{model}:generateContent``, ``GET
/v1beta/models/{model}``) and ``f"{server.url}/v1"`` for Chat Completions (``/v1/chat/completions``, ``GET
/v1/models``). The helpers below build bodies in each provider's wire format.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from email.parser import BytesParser
from email.policy import HTTP
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = [
    "ProviderServer",
    "Recorded",
    "Reply",
    "Upload",
    "anthropic_error",
    "anthropic_events",
    "anthropic_message",
    "anthropic_text",
    "anthropic_thinking",
    "anthropic_tool_use",
    "chat_call",
    "chat_completion",
    "chat_error",
    "gemini_call",
    "gemini_error",
    "gemini_response",
    "multipart_fields",
    "openai_call",
    "openai_error",
    "openai_events",
    "openai_reasoning",
    "openai_response",
    "openai_text",
]


@dataclass
class Recorded:
    """One request as the server received it."""

    method: str
    path: str
    headers: dict[str, str]
    body: Any
    at: float = field(default_factory=time.monotonic)
    """When it arrived (``time.monotonic()``): the gaps between attempts as the provider sees them."""


@dataclass
class Reply:
    """One scripted answer: an HTTP status, a JSON body and extra headers.

    A request that asks to stream (``"stream": true``) gets a 200 body as the provider's server-sent events instead
    (:func:`openai_events`, :func:`anthropic_events`); ``cut_after`` events into it, the server drops the connection
    (a chunked body that never ends), as a network cut mid-stream does. ``pause`` seconds pass between events.
    """

    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict[str, str])
    cut_after: int | None = None
    pause: float = 0.0


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    provider: ProviderServer


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_POST(self) -> None:
        self._answer("POST")

    def do_GET(self) -> None:
        self._answer("GET")

    def _answer(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        content_type = self.headers.get("Content-Type") or ""
        if content_type.startswith("multipart/form-data"):
            body: Any = multipart_fields(content_type, raw)
        else:
            body = json.loads(raw) if raw else None
        reply = self.server.provider.record(
            Recorded(method=method, path=self.path, headers={k.lower(): v for k, v in self.headers.items()}, body=body)
        )
        if reply.status == 200 and isinstance(body, dict) and body.get("stream"):  # pyright: ignore[reportUnknownMemberType]
            events = openai_events(reply.body) if self.path.endswith("/responses") else anthropic_events(reply.body)
            self._stream(events, reply)
            return
        payload = json.dumps(reply.body).encode()
        self.send_response(reply.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(payload)

    def _stream(self, events: list[tuple[str, dict[str, Any]]], reply: Reply) -> None:
        """Send ``events`` as ``text/event-stream`` in HTTP/1.1 chunks, one event per chunk; cut after
        ``reply.cut_after`` of them (no final chunk: the client sees the body end too soon)."""
        self.protocol_version = "HTTP/1.1"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("Connection", "close")
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        for sent, (name, data) in enumerate(events):
            if reply.cut_after is not None and sent >= reply.cut_after:
                self.wfile.flush()
                self.close_connection = True
                return
            chunk = f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
            self.wfile.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            self.wfile.flush()
            if reply.pause:
                time.sleep(reply.pause)
        self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        pass  # keep test output clean


@dataclass(frozen=True)
class Upload:
    """A file of a multipart request (``images.edit``'s image and mask)."""

    filename: str
    content_type: str
    data: bytes


def multipart_fields(content_type: str, raw: bytes) -> dict[str, Any]:
    """A ``multipart/form-data`` body as ``{name: value}``: text fields as strings, files as :class:`Upload`, and a
    name sent more than once (``image[]``) as a list of them."""
    message = BytesParser(policy=HTTP).parsebytes(f"Content-Type: {content_type}\r\n\r\n".encode() + raw)
    fields: dict[str, Any] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        assert isinstance(name, str) and isinstance(payload, bytes)
        filename = part.get_filename()
        value: Any = payload.decode() if filename is None else Upload(filename, part.get_content_type(), payload)
        if name in fields:
            previous = fields[name]
            fields[name] = [*previous, value] if isinstance(previous, list) else [previous, value]
        else:
            fields[name] = [value] if name.endswith("[]") else value
    return fields


class ProviderServer:
    """A scripted HTTP server on 127.0.0.1; use it as a context manager.

    A request that finds the script empty gets a 400 answer (``"no scripted reply"``), which the clients report as
    a non-retryable error, so a test that under-scripts fails at once instead of being retried.
    """

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        """Every request received, in order."""
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.provider = self
        # A short poll interval: shutdown() waits for the serving loop to notice, which is the whole teardown time.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.01}, name="provider-server", daemon=True
        )

    @property
    def url(self) -> str:
        """``http://127.0.0.1:<port>``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def script(self, *replies: Reply | dict[str, Any]) -> None:
        """Queue answers; a plain dict is a 200 answer with that JSON body."""
        with self._lock:
            self._replies.extend(r if isinstance(r, Reply) else Reply(body=r) for r in replies)

    def record(self, request: Recorded) -> Reply:
        """Record a request and take the next answer (called from the server's threads)."""
        with self._lock:
            self.requests.append(request)
            if self._replies:
                return self._replies.popleft()
        return Reply(400, {"type": "error", "error": {"type": "invalid_request_error", "message": "no scripted reply"}})

    @property
    def bodies(self) -> list[Any]:
        """The JSON bodies of the requests received, in order."""
        with self._lock:
            return [r.body for r in self.requests]

    def __enter__(self) -> ProviderServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()


# -- OpenAI Responses API --------------------------------------------------------------------------------------------


def openai_text(text: str, id: str = "msg_1") -> dict[str, Any]:
    """An assistant ``message`` output item with one ``output_text`` part."""
    return {
        "type": "message",
        "id": id,
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def openai_call(call_id: str, name: str, arguments: dict[str, Any] | str, id: str = "fc_1") -> dict[str, Any]:
    """A ``function_call`` output item (arguments as the JSON string the API sends)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": raw,
        "status": "completed",
    }


def openai_reasoning(summary: str, id: str = "rs_1", encrypted: str = "gAAA-opaque") -> dict[str, Any]:
    """A ``reasoning`` output item with a summary and encrypted content."""
    return {
        "type": "reasoning",
        "id": id,
        "summary": [{"type": "summary_text", "text": summary}],
        "encrypted_content": encrypted,
    }


def openai_response(
    *output: dict[str, Any],
    status: str = "completed",
    usage: dict[str, Any] | None = None,
    model: str = "gpt-test-2025-01-01",
    incomplete_reason: str | None = None,
) -> dict[str, Any]:
    """A Responses API ``response`` object."""
    return {
        "id": "resp_1",
        "object": "response",
        "created_at": 1_700_000_000,
        "status": status,
        "model": model,
        "output": list(output),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "error": None,
        "incomplete_details": {"reason": incomplete_reason} if incomplete_reason else None,
        "usage": usage
        or {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 7,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 19,
        },
    }


def openai_error(status: int, message: str, type: str = "invalid_request_error") -> Reply:
    """An OpenAI error answer."""
    return Reply(status, {"error": {"message": message, "type": type, "param": None, "code": None}})


# -- Anthropic Messages API ------------------------------------------------------------------------------------------


def anthropic_text(text: str) -> dict[str, Any]:
    """A ``text`` content block."""
    return {"type": "text", "text": text}


def anthropic_tool_use(id: str, name: str, input: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_use`` content block."""
    return {"type": "tool_use", "id": id, "name": name, "input": input}


def anthropic_thinking(thinking: str, signature: str = "sig-opaque") -> dict[str, Any]:
    """A ``thinking`` content block."""
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def anthropic_message(
    *content: dict[str, Any],
    stop_reason: str = "end_turn",
    usage: dict[str, Any] | None = None,
    model: str = "claude-test-20250101",
) -> dict[str, Any]:
    """A Messages API ``message`` object."""
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": list(content),
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 12, "output_tokens": 7},
    }


def anthropic_error(status: int, message: str, type: str = "invalid_request_error") -> Reply:
    """An Anthropic error answer."""
    return Reply(status, {"type": "error", "error": {"type": type, "message": message}})


# -- Server-sent events (streaming requests) -------------------------------------------------------------------------


def pieces(text: str) -> list[str]:
    """``text`` cut as a provider streams it: a few characters at a time (each word with the spaces after it)."""
    return re.findall(r"\S+\s*|\s+", text) or [""]


def openai_events(response: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Responses API ``response`` as the stream of events that builds it, ``response.created`` to
    ``response.completed`` (``response.incomplete`` / ``response.failed`` for those statuses)."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(name: str, **data: Any) -> None:
        events.append((name, {"type": name, "sequence_number": len(events), **data}))

    emit("response.created", response={**response, "status": "in_progress", "output": [], "usage": None})
    for index, item in enumerate(response.get("output") or ()):
        item_id = item.get("id", f"item_{index}")
        kind = item.get("type")
        started = {**item, "status": "in_progress"} if "status" in item else dict(item)
        if kind == "message":
            started["content"] = []
        elif kind == "reasoning":
            started["summary"] = []
        elif kind == "function_call":
            started["arguments"] = ""
        emit("response.output_item.added", output_index=index, item=started)
        if kind == "message":
            for c_index, part in enumerate(item.get("content") or ()):
                empty = {**part, "text": ""} if part.get("type") == "output_text" else part
                emit(
                    "response.content_part.added",
                    item_id=item_id,
                    output_index=index,
                    content_index=c_index,
                    part=empty,
                )
                if part.get("type") == "output_text":
                    for delta in pieces(part["text"]):
                        emit(
                            "response.output_text.delta",
                            item_id=item_id,
                            output_index=index,
                            content_index=c_index,
                            delta=delta,
                            logprobs=[],
                        )
                    emit(
                        "response.output_text.done",
                        item_id=item_id,
                        output_index=index,
                        content_index=c_index,
                        text=part["text"],
                        logprobs=[],
                    )
                emit(
                    "response.content_part.done", item_id=item_id, output_index=index, content_index=c_index, part=part
                )
        elif kind == "reasoning":
            for s_index, summary in enumerate(item.get("summary") or ()):
                emit(
                    "response.reasoning_summary_part.added",
                    item_id=item_id,
                    output_index=index,
                    summary_index=s_index,
                    part={"type": "summary_text", "text": ""},
                )
                for delta in pieces(summary["text"]):
                    emit(
                        "response.reasoning_summary_text.delta",
                        item_id=item_id,
                        output_index=index,
                        summary_index=s_index,
                        delta=delta,
                    )
                emit(
                    "response.reasoning_summary_text.done",
                    item_id=item_id,
                    output_index=index,
                    summary_index=s_index,
                    text=summary["text"],
                )
        elif kind == "function_call":
            for delta in pieces(item["arguments"]):
                emit("response.function_call_arguments.delta", item_id=item_id, output_index=index, delta=delta)
            emit(
                "response.function_call_arguments.done",
                item_id=item_id,
                output_index=index,
                arguments=item["arguments"],
            )
        emit("response.output_item.done", output_index=index, item=item)
    status = response.get("status")
    final = {"completed": "response.completed", "incomplete": "response.incomplete", "failed": "response.failed"}
    emit(final.get(str(status), "response.completed"), response=response)
    return events


def anthropic_events(message: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """A Messages API ``message`` as the stream of events that builds it, ``message_start`` to ``message_stop``."""
    events: list[tuple[str, dict[str, Any]]] = []

    def emit(name: str, **data: Any) -> None:
        events.append((name, {"type": name, **data}))

    usage = message.get("usage") or {}
    emit("message_start", message={**message, "content": [], "stop_reason": None, "stop_sequence": None})
    for index, block in enumerate(message.get("content") or ()):
        kind = block.get("type")
        if kind == "text":
            emit("content_block_start", index=index, content_block={"type": "text", "text": ""})
            for delta in pieces(block["text"]):
                emit("content_block_delta", index=index, delta={"type": "text_delta", "text": delta})
        elif kind == "thinking":
            emit(
                "content_block_start", index=index, content_block={"type": "thinking", "thinking": "", "signature": ""}
            )
            for delta in pieces(block["thinking"]):
                emit("content_block_delta", index=index, delta={"type": "thinking_delta", "thinking": delta})
            emit("content_block_delta", index=index, delta={"type": "signature_delta", "signature": block["signature"]})
        elif kind == "tool_use":
            emit("content_block_start", index=index, content_block={**block, "input": {}})
            for delta in pieces(json.dumps(block["input"])):
                emit("content_block_delta", index=index, delta={"type": "input_json_delta", "partial_json": delta})
        else:
            emit("content_block_start", index=index, content_block=block)
        emit("content_block_stop", index=index)
    emit(
        "message_delta",
        delta={"stop_reason": message.get("stop_reason"), "stop_sequence": message.get("stop_sequence")},
        usage={"output_tokens": usage.get("output_tokens", 0)},
    )
    emit("message_stop")
    return events


# -- Gemini generateContent ------------------------------------------------------------------------------------------


def gemini_call(
    name: str, args: dict[str, Any], *, id: str | None = None, signature: str | None = None
) -> dict[str, Any]:
    """A ``functionCall`` part (Gemini often sends no id), with an optional ``thoughtSignature``."""
    call: dict[str, Any] = {"name": name, "args": args}
    if id is not None:
        call["id"] = id
    part: dict[str, Any] = {"functionCall": call}
    if signature is not None:
        part["thoughtSignature"] = signature
    return part


def gemini_response(
    *parts: dict[str, Any],
    finish_reason: str = "STOP",
    usage: dict[str, Any] | None = None,
    model: str = "gemini-test-001",
) -> dict[str, Any]:
    """A ``GenerateContentResponse`` with one candidate."""
    return {
        "candidates": [{"content": {"role": "model", "parts": list(parts)}, "finishReason": finish_reason, "index": 0}],
        "usageMetadata": usage or {"promptTokenCount": 12, "candidatesTokenCount": 7, "totalTokenCount": 19},
        "modelVersion": model,
        "responseId": "resp_1",
    }


def gemini_error(status: int, message: str, code: str = "INVALID_ARGUMENT", retry_delay: str | None = None) -> Reply:
    """A Gemini (google.rpc.Status) error answer, with a ``RetryInfo`` detail when ``retry_delay`` is given."""
    error: dict[str, Any] = {"code": status, "message": message, "status": code}
    if retry_delay is not None:
        error["details"] = [{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}]
    return Reply(status, {"error": error})


# -- OpenAI-compatible Chat Completions ------------------------------------------------------------------------------


def chat_call(id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    """A ``tool_calls`` entry (arguments as the JSON string the API sends)."""
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": id, "type": "function", "function": {"name": name, "arguments": raw}}


def chat_completion(
    content: str | None = None,
    *calls: dict[str, Any],
    reasoning: str | None = None,
    usage: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    model: str = "served-model",
) -> dict[str, Any]:
    """A ``chat.completion`` with one choice (``reasoning`` as OpenRouter sends it)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if reasoning is not None:
        message["reasoning"] = reasoning
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [
            {"index": 0, "message": message, "finish_reason": finish_reason or ("tool_calls" if calls else "stop")}
        ],
        "usage": usage or {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19},
    }


def chat_error(status: int, message: str, type: str = "invalid_request_error") -> Reply:
    """An OpenAI-style error answer, as compatible servers send it."""
    return Reply(status, {"error": {"message": message, "type": type, "code": status}})
