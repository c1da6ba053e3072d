"""The media part of the client contract (behaviour §3.6): ``paint`` (image generation) and ``view_media`` (media
analysis), their requests and the ``image`` / ``media_analysis`` result parts.

A client that supports them has ``async def paint(self, request: PaintRequest) -> Result`` (``image`` parts with
base64 ``data`` or a ``url``) and ``async def view_media(self, request: ViewMediaRequest) -> Result``
(``media_analysis`` parts). The bytes exist only inside the activity that makes the call: TurnKit stores them in the
media table and keeps references (:mod:`turnkit.media`).
"""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, Field

from turnkit.kernel.errors import ConfigError, Error
from turnkit.model import Client, ModelRequest, Result

__all__ = [
    "VIEW_MEDIA_INSTRUCTIONS",
    "PaintRequest",
    "ViewMediaRequest",
    "analysis_parts",
    "analysis_request",
    "analysis_result",
    "client_with",
    "image_parts",
]

#: The system prompt of a ``view_media`` call made through a chat model.
VIEW_MEDIA_INSTRUCTIONS: Final = (
    "You analyse the attached media for an objective. Describe only what the media shows that bears on the "
    "objective; say so when it does not show it."
)


class PaintRequest(BaseModel):
    """One image generation (behaviour §3.6 ``paint``)."""

    prompt: str
    model: str
    provider: str | None = None
    size: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    """Extra provider parameters (e.g. ``quality``, ``output_format``)."""
    input_images: list[dict[str, Any]] = Field(default_factory=list)
    """Reference images as media references with base64 ``data``."""
    mask: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


class ViewMediaRequest(BaseModel):
    """One media analysis (behaviour §3.6 ``view_media``)."""

    media: dict[str, Any]
    """The media reference ``{media_id, kind, mime_type, byte_size, sha256, filename?}`` with base64 ``data``."""
    objective: str
    model: str
    provider: str | None = None
    output_schema: dict[str, Any] | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


def analysis_request(request: ViewMediaRequest) -> ModelRequest:
    """The chat request a chat model answers a ``view_media`` with: the media and the objective in one user message."""
    return ModelRequest(
        model=request.model,
        messages=[{"role": "user", "content": request.objective, "media": [request.media]}],
        instructions=VIEW_MEDIA_INSTRUCTIONS,
        output_schema=request.output_schema,
        metadata=dict(request.metadata),
    )


def analysis_result(answer: Result, request: ViewMediaRequest, *, provider: str) -> Result:
    """A chat answer to :func:`analysis_request` as a ``media_analysis`` result (the media without its bytes)."""
    media = {key: value for key, value in request.media.items() if key != "data"}
    part = {
        "type": "media_analysis",
        "text": answer.text,
        "data": answer.output_data,
        "model": answer.model or request.model,
        "provider": provider,
        "params": dict(request.params),
        "media": media,
    }
    return Result(parts=[part], usage=answer.usage, model=answer.model or request.model, output_data=answer.output_data)


def client_with(client: Client, method: str) -> Client:
    """``client``, checked to have ``method`` (``paint`` or ``view_media``).

    Raises:
        ConfigError: It has not.
    """
    if not callable(getattr(client, method, None)):
        raise ConfigError(f"{type(client).__name__} has no {method}: use a client that supports it")
    return client


def image_parts(result: Result) -> list[dict[str, Any]]:
    """The ``image`` parts of a ``paint`` result (copies), each with ``data`` or a ``url``.

    Raises:
        Error: ``"image client returned no image"`` / ``"image client returned image without url or data"``.
    """
    images = [dict(part) for part in result.parts if part.get("type") == "image"]
    if not images:
        raise Error("image client returned no image")
    if any(not part.get("data") and not part.get("url") for part in images):
        raise Error("image client returned image without url or data")
    return images


def analysis_parts(result: Result) -> list[dict[str, Any]]:
    """The ``media_analysis`` parts of a ``view_media`` result (copies).

    Raises:
        Error: ``"media client returned no media analysis"``.
    """
    analyses = [dict(part) for part in result.parts if part.get("type") == "media_analysis"]
    if not analyses:
        raise Error("media client returned no media analysis")
    return analyses
