"""Test doubles for model clients.

:class:`ScriptedClient` answers model calls from a script, in order, and records every request::

    client = ScriptedClient([call_tools(("lookup", {"q": "x"})), "done"])

It implements :class:`turnkit.model.Client`, so it can be passed wherever a real client goes, including activities
running in a Temporal worker.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, TypeAlias

from turnkit.kernel.errors import ModelError
from turnkit.media_requests import PaintRequest, ViewMediaRequest, analysis_request, analysis_result
from turnkit.model import ModelRequest, Result, ToolCall, Usage
from turnkit.streaming import DeltaSink, current_sink

__all__ = [
    "DEFAULT_USAGE",
    "ScriptItem",
    "ScriptedClient",
    "call_tools",
    "image",
    "say",
]

#: Usage given to scripted answers that do not state one, so usage sums are testable.
DEFAULT_USAGE: Final = Usage(input_tokens=10, output_tokens=5)

#: How a streamed answer is cut: each word with the spaces after it (and leading spaces alone).
_WORDS: Final = re.compile(r"\S+\s*|\s+")

#: One scripted answer: a final text, a ready result, or a function of the request returning either.
ScriptItem: TypeAlias = Result | str | Callable[[ModelRequest], "Result | str"]


def say(text: str, usage: Usage | None = None) -> Result:
    """A final text answer.

    Args:
        text: The answer.
        usage: Its usage; defaults to :data:`DEFAULT_USAGE` (the same as a plain string in a script).

    Returns:
        The result.
    """
    return Result.build(text=text, usage=DEFAULT_USAGE if usage is None else usage)


def call_tools(
    *calls: tuple[str, Mapping[str, Any]] | ToolCall,
    text: str | None = None,
    usage: Usage | None = None,
) -> Result:
    """An answer proposing tool calls.

    Calls given as ``(name, arguments)`` get no id here; :class:`ScriptedClient` fills in a unique one when it
    returns the result.

    Args:
        *calls: ``(name, arguments)`` pairs or :class:`ToolCall` objects, in proposal order.
        text: Optional assistant text before the calls.
        usage: Its usage; defaults to :data:`DEFAULT_USAGE`.

    Returns:
        The result.
    """
    built: list[ToolCall] = []
    for call in calls:
        if isinstance(call, ToolCall):
            built.append(call)
        else:
            name, arguments = call
            built.append(ToolCall.parse("", name, dict(arguments)))
    return Result.build(text=text, tool_calls=built, usage=DEFAULT_USAGE if usage is None else usage)


def image(
    data: bytes, *, mime_type: str = "image/png", revised_prompt: str | None = None, usage: Usage | None = None
) -> Result:
    """A generated image, for :class:`ScriptedClient`'s ``images`` script (``paint`` answers).

    Args:
        data: The image bytes (sent base64-encoded, as providers do).
        mime_type: Their type.
        revised_prompt: The prompt as the "provider" revised it.
        usage: Its usage; defaults to :data:`DEFAULT_USAGE`.
    """
    part: dict[str, Any] = {"type": "image", "data": base64.b64encode(data).decode("ascii"), "mime_type": mime_type}
    if revised_prompt is not None:
        part["revised_prompt"] = revised_prompt
    return Result(parts=[part], usage=DEFAULT_USAGE if usage is None else usage)


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


class ScriptedClient:
    """A model client that returns scripted answers in order and records every request (unless told not to).

    The script is a sequence of items, each consumed by one call: a ``str`` is a final text answer (with
    :data:`DEFAULT_USAGE`), a :class:`Result` is returned as-is, and a callable receives the request and returns
    either. A single callable instead of a sequence answers every call. Tool calls without an id get a unique
    ``call_<12 hex>`` id, because the store keys executions by ``(turn_id, tool_call_id)``; a result without a
    model gets the request's model.

    Calls are thread-safe. When the script is exhausted, a call raises
    :class:`~turnkit.kernel.errors.ModelError` ``"scripted client has no more results"``.
    """

    def __init__(
        self,
        script: Sequence[ScriptItem] | Callable[[ModelRequest], Result | str],
        *,
        images: Sequence[Result] = (),
        delta_delay: float = 0.0,
        record: bool = True,
    ) -> None:
        """Create the client.

        Args:
            script: The scripted answers, or one callable answering every call (``view_media`` calls included: they
                are chat calls with the media in the user message).
            images: The answers to ``paint`` calls, in order (see :func:`image`).
            delta_delay: Seconds between the words of an answer streamed to a watcher (when the call streams, see
                :mod:`turnkit.streaming`): a demo can show text arriving as a provider sends it.
            record: Keep every request in :attr:`requests`, for a test to look at. False for a process that runs for
                long (a benchmark's worker, the demo): a kept request holds its messages, the transcript's kept ones
                included, so the list would grow by every call and keep what the worker's transcripts let go.
        """
        self.delta_delay = delta_delay
        self._images = list(images)
        self.paint_requests: list[PaintRequest] = []
        """Every ``paint`` request received, in order."""
        self._lock = threading.Lock()
        self._responder: Callable[[ModelRequest], Result | str] | None = None
        self._items: list[ScriptItem] = []
        if callable(script):
            self._responder = script
        else:
            self._items = list(script)
        self._position = 0
        self._record = record
        self._calls = 0
        self.requests: list[ModelRequest] = []
        """Every request received, in order (none when the client was made with ``record=False``)."""

    @property
    def calls(self) -> int:
        """How many calls were made (including one that found the script exhausted)."""
        with self._lock:
            return self._calls

    @property
    def remaining(self) -> int:
        """How many scripted items are left (0 for a single-callable script)."""
        with self._lock:
            return len(self._items) - self._position

    async def chat(self, request: ModelRequest) -> Result:
        """Return the next scripted answer.

        Args:
            request: The request; it is recorded in :attr:`requests` (unless the client was made with
                ``record=False``).

        Returns:
            The answer.

        Raises:
            ModelError: The script is exhausted.
        """
        with self._lock:
            self._calls += 1
            if self._record:
                self.requests.append(request)
            if self._responder is not None:
                item: ScriptItem = self._responder
            elif self._position < len(self._items):
                item = self._items[self._position]
                self._position += 1
            else:
                raise ModelError("scripted client has no more results")
        # Callables run outside the lock, so they may inspect the client (e.g. `client.calls`).
        if callable(item):
            item = item(request)
        result = self._finish(item, request)
        sink = current_sink()
        if sink is not None:  # streamed, as a provider's answer would be: word by word
            await self._stream(result, sink)
        return result

    async def _stream(self, result: Result, sink: DeltaSink) -> None:
        first = True
        for part in result.parts:
            kind = part.get("type", "text")
            if kind not in ("text", "thinking") or not part.get("text"):
                continue
            text = str(part["text"])
            if kind == "text" and not first:
                text = "\n" + text  # Result.text joins the text parts with a newline
            first = first and kind != "text"
            write = sink.text if kind == "text" else sink.thinking
            for piece in _WORDS.findall(text):
                write(piece)
                await asyncio.sleep(self.delta_delay)  # 0: still lets the publisher run between words

    async def view_media(self, request: ViewMediaRequest) -> Result:
        """Answer a media analysis from the script: the next item answers the chat request of
        :func:`~turnkit.media_requests.analysis_request` (media and objective in one user message)."""
        answer = await self.chat(analysis_request(request))
        return analysis_result(answer, request, provider="scripted")

    async def paint(self, request: PaintRequest) -> Result:
        """Return the next scripted image.

        Raises:
            ModelError: The ``images`` script is exhausted.
        """
        with self._lock:
            self.paint_requests.append(request)
            if not self._images:
                raise ModelError("scripted client has no more images")
            result = self._images.pop(0)
        return result.model_copy(update={"model": result.model or request.model})

    def _finish(self, item: Result | str, request: ModelRequest) -> Result:
        result = say(item) if isinstance(item, str) else item
        parts: list[dict[str, Any]] = []
        for part in result.parts:
            copied = dict(part)
            if copied.get("type") == "tool_call" and not copied.get("id"):
                copied["id"] = _new_call_id()
            parts.append(copied)
        # Copy, never mutate: the same Result object may appear in several scripts or several positions.
        return result.model_copy(update={"parts": parts, "model": result.model or request.model})
