"""``turnkit.paint`` and ``turnkit.view_media``: stateless convenience calls outside any turn (behaviour §1.9).

They call a client directly, return the first image or analysis and persist nothing: no message, no media row,
no usage. The image's base64 ``data`` is returned to the caller (no history is involved).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any

from turnkit.config import settings
from turnkit.kernel.errors import ConfigError
from turnkit.media import MediaInput, media_kind
from turnkit.media_requests import PaintRequest, ViewMediaRequest, analysis_parts, client_with, image_parts
from turnkit.model import Client, Result

__all__ = ["paint", "view_media"]


async def paint(
    prompt: str,
    *,
    model: str,
    client: Client | None = None,
    provider: str | None = None,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Generate one image and return it (``{data?, url?, mime_type, revised_prompt?, model, provider, usage}``).

    Raises:
        ConfigError: No client (``client=`` or ``settings.client``), or one without ``paint``.
        Error: ``"image client returned no image"`` / ``"image client returned image without url or data"``.
    """
    request = PaintRequest(
        prompt=prompt,
        model=model,
        provider=provider,
        size=size,
        params=dict(params or {}),
        metadata=dict(metadata or {}),
    )
    result: Result = await _client(client, "paint").paint(request)  # pyright: ignore[reportAttributeAccessIssue]
    first = image_parts(result)[0]
    return {k: v for k, v in first.items() if k != "type"} | {
        "model": first.get("model") or result.model or model,
        "usage": result.usage.to_record(),
    }


async def view_media(
    media: MediaInput,
    *,
    objective: str,
    model: str | None = None,
    client: Client | None = None,
    provider: str | None = None,
    output_schema: dict[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Analyse ``media`` for ``objective`` and return the first analysis (``{text, data, model, provider, usage,
    media}``); the media reference has no ``media_id`` (nothing is stored).

    Raises:
        ConfigError: No client or no model (``settings.default_model``), or a client without ``view_media``.
        Error: ``"media client returned no media analysis"``.
    """
    chosen = model or settings.default_model
    if not chosen:
        raise ConfigError("view_media needs a model (model= or settings.default_model)")
    ref: dict[str, Any] = {"kind": media_kind(media.mime_type), "mime_type": media.mime_type}
    ref |= {"byte_size": len(media.data)} | ({"filename": media.filename} if media.filename else {})
    request = ViewMediaRequest(
        media=ref | {"data": base64.b64encode(media.data).decode("ascii")},
        objective=objective,
        model=chosen,
        provider=provider,
        output_schema=output_schema,
        params=dict(params or {}),
        metadata=dict(metadata or {}),
    )
    result: Result = await _client(client, "view_media").view_media(request)  # pyright: ignore[reportAttributeAccessIssue]
    first = analysis_parts(result)[0]
    return {k: v for k, v in first.items() if k != "type"} | {"usage": result.usage.to_record(), "media": ref}


def _client(client: Client | None, method: str) -> Client:
    chosen = client if client is not None else settings.client
    if chosen is None:
        raise ConfigError(f"{method} needs a client (client= or settings.client)")
    return client_with(chosen, method)
