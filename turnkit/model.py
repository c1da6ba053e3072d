"""The model-client contract (behaviour §3.3 and §3.6).

A :class:`Client` turns one :class:`ModelRequest` into one :class:`Result`. Clients never execute tools: TurnKit
runs them and persists their results. Everything here is a pydantic model so it can cross Temporal activity
boundaries unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, Field

__all__ = [
    "INVALID_JSON_ARGUMENTS",
    "Client",
    "ModelRequest",
    "Result",
    "ToolCall",
    "ToolSpec",
    "Usage",
]

#: The ``arguments_error`` of a tool call whose arguments are not valid JSON (behaviour §3.6).
INVALID_JSON_ARGUMENTS = "invalid JSON arguments"

_TOKEN_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "cache_write_tokens", "thinking_tokens")


class Usage(BaseModel):
    """Token usage of one model call, in exclusive buckets, plus an optional provider-reported cost total.

    The buckets do not overlap (cached input is not also counted as input; thinking is not also counted as output),
    so ``total_tokens`` is a plain sum.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    thinking_tokens: int = 0
    cost: float | None = None
    """Provider-reported cost in USD (a total), when the provider reports one."""

    @property
    def total_tokens(self) -> int:
        """The sum of the five token buckets."""
        return (
            self.input_tokens + self.output_tokens + self.cached_tokens + self.cache_write_tokens + self.thinking_tokens
        )

    def __add__(self, other: Usage) -> Usage:
        """Sum two usages bucket by bucket.

        The cost is the sum of the known costs, and None only when neither side reports one.
        """
        if not isinstance(other, Usage):  # pyright: ignore[reportUnnecessaryIsInstance]
            return NotImplemented
        costs = [c for c in (self.cost, other.cost) if c is not None]
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            thinking_tokens=self.thinking_tokens + other.thinking_tokens,
            cost=sum(costs) if costs else None,
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Usage:
        """Build a usage from a hash such as a stored ``turn.usage``.

        ``reasoning_tokens`` is accepted as ``thinking_tokens``; ``total_tokens`` and unknown keys are ignored
        (the total is always recomputed).

        Args:
            data: A mapping of token counts; None gives an empty usage.

        Returns:
            The usage.
        """
        if not data:
            return cls()
        counts: dict[str, int] = {}
        for name in _TOKEN_FIELDS:
            value = data.get(name)
            if value is None and name == "thinking_tokens":
                value = data.get("reasoning_tokens")
            counts[name] = int(value or 0)
        cost = data.get("cost")
        return cls(**counts, cost=None if cost is None else float(cost))

    def to_record(self) -> dict[str, Any]:
        """The JSON form stored on turns: the five counts and ``total_tokens``, plus ``cost`` when known."""
        record: dict[str, Any] = {name: getattr(self, name) for name in _TOKEN_FIELDS}
        record["total_tokens"] = self.total_tokens
        if self.cost is not None:
            record["cost"] = self.cost
        return record


def _stringify_keys(value: Any) -> Any:
    """Recursively turn mapping keys into strings, as the gem's ``deep_stringify_keys`` does."""
    if isinstance(value, Mapping):
        return {str(k): _stringify_keys(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return [_stringify_keys(v) for v in value]  # pyright: ignore[reportUnknownVariableType]
    return value


class ToolCall(BaseModel):
    """A tool call proposed by the model.

    ``arguments_error`` is set when the provider's arguments could not be parsed; such a call fails without
    running the tool, and the model sees the error.
    """

    id: str
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    arguments_error: str | None = None

    @classmethod
    def parse(cls, id: str, name: str, raw: Any) -> ToolCall:
        """Build a tool call from provider arguments in any shape (behaviour §3.6).

        A mapping has its keys stringified. A JSON string is parsed: a JSON object becomes the arguments, any other
        JSON value gives ``{}``, and invalid JSON sets ``arguments_error = "invalid JSON arguments"``. A blank string
        gives ``{}`` (providers send ``""`` for calls without arguments). Anything else gives ``{}``.

        Args:
            id: The provider's tool-call id.
            name: The tool name.
            raw: The arguments as the provider returned them.

        Returns:
            The normalised tool call.
        """
        if isinstance(raw, Mapping):
            return cls(id=id, name=name, arguments=_stringify_keys(raw))
        if isinstance(raw, str | bytes):
            text = raw.decode() if isinstance(raw, bytes) else raw
            if not text.strip():
                return cls(id=id, name=name, arguments={})
            try:
                parsed = json.loads(text)
            except ValueError:
                return cls(id=id, name=name, arguments={}, arguments_error=INVALID_JSON_ARGUMENTS)
            if isinstance(parsed, dict):
                return cls(id=id, name=name, arguments=_stringify_keys(parsed))
            return cls(id=id, name=name, arguments={})
        return cls(id=id, name=name, arguments={})

    def to_part(self) -> dict[str, Any]:
        """The ``tool_call`` content part for this call (``arguments_error`` only when set)."""
        part: dict[str, Any] = {"type": "tool_call", "id": self.id, "name": self.name, "arguments": self.arguments}
        if self.arguments_error is not None:
            part["arguments_error"] = self.arguments_error
        return part


class Result(BaseModel):
    """What a client returns for one model call: ordered content parts plus usage (behaviour §3.6).

    Parts use the message content shapes of behaviour §2.3: ``text``, ``thinking``, ``provider`` (opaque continuation
    state), ``tool_call``, ``image`` and ``media_analysis``.
    """

    parts: list[dict[str, Any]] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    model: str | None = None
    finish_reason: str | None = None
    output_data: Any = None

    @classmethod
    def build(
        cls,
        text: str | None = None,
        tool_calls: Sequence[ToolCall | Mapping[str, Any]] | None = None,
        usage: Usage | Mapping[str, Any] | None = None,
        model: str | None = None,
        output_data: Any = None,
        parts: Sequence[Mapping[str, Any]] | None = None,
        finish_reason: str | None = None,
    ) -> Result:
        """Build a result from explicit ``parts``, or synthesise them from ``text`` and ``tool_calls``.

        Args:
            text: Assistant text; becomes the first part when ``parts`` is not given.
            tool_calls: Tool calls, as :class:`ToolCall` or ``{"id", "name", "arguments"}`` mappings; they become
                ``tool_call`` parts after the text.
            usage: Token usage (a :class:`Usage` or a mapping for :meth:`Usage.from_dict`).
            model: The model that answered.
            output_data: Structured output, when an output schema was requested.
            parts: Ready-made content parts; when given, ``text`` and ``tool_calls`` are ignored.
            finish_reason: The provider's stop reason.

        Returns:
            The result.
        """
        if parts is not None:
            built = [dict(part) for part in parts]
        else:
            built = []
            if text:
                built.append({"type": "text", "text": text})
            for call in tool_calls or ():
                if not isinstance(call, ToolCall):
                    call = ToolCall.parse(str(call.get("id") or ""), str(call.get("name") or ""), call.get("arguments"))
                built.append(call.to_part())
        if usage is None:
            usage_value = Usage()
        elif isinstance(usage, Usage):
            usage_value = usage
        else:
            usage_value = Usage.from_dict(usage)
        return cls(parts=built, usage=usage_value, model=model, finish_reason=finish_reason, output_data=output_data)

    @property
    def text(self) -> str:
        """The ``text`` parts joined with a newline (a part without a type counts as text)."""
        return "\n".join(str(p.get("text", "")) for p in self.parts if p.get("type", "text") == "text")

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The tool calls, in proposal order, built from the ``tool_call`` parts."""
        calls: list[ToolCall] = []
        for part in self.parts:
            if part.get("type") != "tool_call":
                continue
            call = ToolCall.parse(str(part.get("id") or ""), str(part.get("name") or ""), part.get("arguments"))
            if part.get("arguments_error"):
                call = call.model_copy(update={"arguments_error": str(part["arguments_error"])})
            calls.append(call)
        return calls

    @property
    def has_tool_calls(self) -> bool:
        """True when the model proposed at least one tool call."""
        return any(p.get("type") == "tool_call" for p in self.parts)

    @property
    def images(self) -> list[dict[str, Any]]:
        """The ``image`` parts (a ``paint``'s answer: ``data`` or ``url``, ``mime_type``, ``revised_prompt``...)."""
        return [part for part in self.parts if part.get("type") == "image"]

    @property
    def has_image(self) -> bool:
        """True when the result holds at least one image (the spec's ``image?``)."""
        return bool(self.images)

    @property
    def media_analyses(self) -> list[dict[str, Any]]:
        """The ``media_analysis`` parts (a ``view_media``'s answer: ``text``, ``media``, ``output_data``...)."""
        return [part for part in self.parts if part.get("type") == "media_analysis"]

    @property
    def has_media_analysis(self) -> bool:
        """True when the result holds at least one media analysis (the spec's ``media_analysis?``)."""
        return bool(self.media_analyses)


class ToolSpec(BaseModel):
    """A tool as the model sees it: name, description and JSON schema of its arguments.

    ``usage_hint`` and ``terminal`` are prompt-only details (behaviour §3.4 ``tools`` section); clients may ignore them.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}, "required": []})
    usage_hint: str = ""
    terminal: bool = False


class ModelRequest(BaseModel):
    """One model call (behaviour §3.3).

    ``messages`` are provider-neutral projections (behaviour §3.5)::

        {"role": "user" | "assistant" | "tool", "content": str,
         "tool_calls"?: [{"id", "name", "arguments"}], "tool_call_id"?: str, "provider_parts"?: [...]}

    ``instructions`` is the stable system prompt and ``dynamic_instructions`` the per-turn part, so adapters can
    cache the stable part. ``metadata`` carries ``turn_id``, ``conversation_id`` and ``request_id``.
    """

    model: str
    messages: list[dict[str, Any]] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    instructions: str = ""
    dynamic_instructions: str | None = None
    thinking: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    report: dict[str, Any] = Field(default_factory=dict)
    """The system prompt's report: ``{chars, hash, stable_chars, dynamic_chars, sections, tool_count}``."""

    @property
    def tool_names(self) -> list[str]:
        """The names of the offered tools, in order."""
        return [t.name for t in self.tools]


@runtime_checkable
class Client(Protocol):
    """A model client.

    Implementations translate a :class:`ModelRequest` into a provider call and the provider's answer into a
    :class:`Result`. They must never execute tools. Provider failures should be raised as
    :class:`turnkit.kernel.errors.ModelError` so they fail the turn instead of crashing the worker.

    A request is read-only: its messages and what they hold (content parts, tool calls, provider parts) are shared
    with the worker's kept transcript, which the conversation's next calls send again. Build new lists and dicts
    instead of changing those in place; a kept message raises ``TypeError`` when changed.
    """

    async def chat(self, request: ModelRequest) -> Result:
        """Make one model call.

        Args:
            request: The request.

        Returns:
            The model's answer.
        """
        ...
