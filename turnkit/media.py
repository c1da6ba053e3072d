"""Media inputs and references (behaviour §4.3 ``MediaInput``; docs/design.md "Images and media").

Media bytes never travel in workflow payloads or histories: they are written to the store's media table
(``StoreTx.put_media``) and everything else (message parts, tool results, events, activity payloads) carries the
reference ``{media_id, mime_type, byte_size, sha256, filename?}``. Only the activity that calls a provider reads the
bytes back, to send them as an image (or document) input part.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import mimetypes
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Final
from urllib.parse import unquote, urlsplit

from turnkit.kernel.errors import InputError
from turnkit.kernel.records import MediaRecord
from turnkit.model import ModelRequest
from turnkit.store.store import Store, StoreTx

__all__ = [
    "IMAGE_MIME_TYPES",
    "MAX_MEDIA_BYTES",
    "MediaInput",
    "check_media",
    "media_kind",
    "media_part",
    "resolve_media",
    "store_media",
    "stored_media",
    "with_media_data",
]

#: The image types providers accept as image input.
IMAGE_MIME_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/webp", "image/gif"})
_DOCUMENT_MIME_TYPES: Final = frozenset({"application/pdf"})

#: The largest media item accepted (20 MB: what the providers accept for one inline image or document).
MAX_MEDIA_BYTES: Final = 20 * 1024 * 1024

# Magic numbers, so bytes without a name still get their type.
_SIGNATURES: Final = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
    (b"%PDF-", "application/pdf"),
)


def media_kind(mime_type: str) -> str:
    """``image``, ``document``, ``audio`` or ``video`` for a supported MIME type.

    Raises:
        InputError: The type is not supported (png, jpeg, webp, gif, pdf, ``audio/*``, ``video/*``).
    """
    if mime_type in IMAGE_MIME_TYPES:
        return "image"
    if mime_type in _DOCUMENT_MIME_TYPES:
        return "document"
    major = mime_type.split("/", 1)[0]
    if major in ("audio", "video") and "/" in mime_type:
        return major
    raise InputError(f"unsupported media type: {mime_type} (png, jpeg, webp, gif, pdf, audio/* or video/*)")


def _sniff(data: builtins.bytes) -> str | None:
    for signature, mime_type in _SIGNATURES:
        if data.startswith(signature):
            return mime_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


@dataclass(frozen=True)
class MediaInput:
    """An image or other media item given to a turn (``ask(..., media=[...])``) or to ``view_media``.

    Build it with :meth:`bytes`, :meth:`path`, :meth:`file` (a binary file object) or ``await`` :meth:`url` (an
    ``http(s)`` download). The MIME type is the one given, else inferred from the file
    extension, else from the bytes' signature. Only the reference is persisted with messages; the bytes go to the
    store's media table.
    """

    data: builtins.bytes
    mime_type: str
    filename: str | None = None

    def __post_init__(self) -> None:
        """Check the type and the size."""
        media_kind(self.mime_type)
        if not self.data:
            raise InputError("media is empty")
        if len(self.data) > MAX_MEDIA_BYTES:
            raise InputError(f"media is too large: {len(self.data)} bytes (at most {MAX_MEDIA_BYTES})")

    @classmethod
    def bytes(cls, data: builtins.bytes, *, mime_type: str | None = None, filename: str | None = None) -> MediaInput:
        """Media from bytes in memory.

        Raises:
            InputError: No type given and none can be inferred, an unsupported type, empty or too large.
        """
        if not isinstance(data, bytes | bytearray | memoryview):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InputError(f"media data must be bytes, not {type(data).__name__}")
        raw = builtins.bytes(data)
        inferred = mime_type or (mimetypes.guess_type(filename)[0] if filename else None) or _sniff(raw)
        if inferred is None:
            raise InputError("cannot infer the media type: give mime_type")
        return cls(data=raw, mime_type=inferred, filename=filename)

    @classmethod
    def path(cls, path: str | Path, *, mime_type: str | None = None) -> MediaInput:
        """Media read from a file (its name is kept as ``filename``).

        Raises:
            InputError: The file cannot be read, or :meth:`bytes` refuses its content.
        """
        file = Path(path)
        try:
            data = file.read_bytes()
        except OSError as err:
            raise InputError(f"cannot read media file {str(file)!r}: {err.strerror or err}") from err
        return cls.bytes(data, mime_type=mime_type, filename=file.name)

    @classmethod
    def file(cls, file: BinaryIO, *, mime_type: str | None = None, filename: str | None = None) -> MediaInput:
        """Media read from a file object opened in binary mode (``open(path, "rb")``, ``io.BytesIO``, an upload),
        from its current position to its end. The name is ``filename``, else the file's own ``name``, if any.

        Raises:
            InputError: The file is not binary or cannot be read, or :meth:`bytes` refuses its content.
        """
        try:
            data = file.read()
        except (OSError, ValueError) as err:
            raise InputError(f"cannot read media from {_describe(file)}: {err}") from err
        if isinstance(data, str):
            raise InputError(f"media file {_describe(file)} is open in text mode: open it in binary mode ('rb')")
        name = filename or getattr(file, "name", None)
        return cls.bytes(data, mime_type=mime_type, filename=Path(name).name if isinstance(name, str) else None)

    @classmethod
    async def url(cls, url: str, *, mime_type: str | None = None, timeout: float = 30.0) -> MediaInput:
        """Media downloaded from an ``http(s)`` URL now, in the caller's process. The record keeps the bytes, not the
        URL, so a later model call (or its retry) never depends on the URL still answering. The type is
        ``mime_type``, else the response's ``Content-Type``, else the URL path's extension, else the bytes' signature.

        Raises:
            InputError: Not an ``http``/``https`` URL, an error or timeout fetching it (named with the URL), more than
                :data:`MAX_MEDIA_BYTES`, or :meth:`bytes` refuses the content.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise InputError(f"media URL must be http or https: {url!r}")
        data, served_type = await asyncio.to_thread(_download, url, timeout)
        filename = Path(unquote(parts.path)).name or None
        return cls.bytes(data, mime_type=mime_type or served_type, filename=filename)

    @property
    def kind(self) -> str:
        """``image``, ``document``, ``audio`` or ``video``."""
        return media_kind(self.mime_type)


def _describe(file: object) -> str:
    name = getattr(file, "name", None)
    return repr(name) if isinstance(name, str) else type(file).__name__


def _download(url: str, timeout: float) -> tuple[builtins.bytes, str | None]:
    """GET ``url``: its body (at most :data:`MAX_MEDIA_BYTES`) and its served type (None when generic or absent)."""
    request = urllib.request.Request(url, headers={"User-Agent": "turnkit"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            data = response.read(MAX_MEDIA_BYTES + 1)
            served = response.headers.get_content_type() if response.headers.get("Content-Type") else None
    except urllib.error.HTTPError as err:
        raise InputError(f"cannot fetch media from {url}: HTTP {err.code}") from err
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise InputError(f"cannot fetch media from {url}: {reason}") from err
    if len(data) > MAX_MEDIA_BYTES:
        raise InputError(f"media at {url} is too large: more than {MAX_MEDIA_BYTES} bytes")
    # A server that does not know the type says so generically: then the extension or the bytes decide.
    return data, None if served in (None, "application/octet-stream", "binary/octet-stream") else served


async def store_media(tx: StoreTx, media: MediaInput) -> dict[str, Any]:
    """Write ``media``'s bytes to the store (idempotent) and return its ``media`` content part."""
    record = await tx.put_media(media.data, mime_type=media.mime_type, filename=media.filename)
    return media_part(record)


def media_part(record: MediaRecord) -> dict[str, Any]:
    """The ``media`` message content part that references a stored item."""
    return {"type": "media", "kind": media_kind(record.mime_type), **record.reference()}


async def resolve_media(tx: StoreTx, messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Projected messages with each ``media`` reference completed with its base64 ``data``, for a provider call.

    Runs in the activity that calls the provider, never in workflow code: the bytes exist only in that activity's
    memory and the provider request.
    """
    resolved: list[dict[str, Any]] = []
    for message in messages:
        refs = message.get("media")
        if not refs:
            resolved.append(dict(message))
            continue
        filled = []
        for ref in refs:
            data = await tx.load_media_data(str(ref["media_id"]))
            filled.append({**ref, "data": base64.b64encode(data).decode("ascii")})
        resolved.append({**message, "media": filled})
    return resolved


async def with_media_data(store: Store, request: ModelRequest, *, has_media: bool | None = None) -> ModelRequest:
    """``request`` with the bytes of every referenced media item (:func:`resolve_media`); unchanged without media.
    ``has_media``: whether a message references media, known already (the model activity's transcript keeps it)."""
    if has_media is None:
        has_media = any(message.get("media") for message in request.messages)
    if not has_media:
        return request
    async with store.atomic() as tx:
        messages = await resolve_media(tx, request.messages)
    return request.model_copy(update={"messages": messages})


def check_media(media: Sequence[MediaInput] | None) -> None:
    """Check the ``media=`` of ``ask``/``run`` before anything is written.

    Raises:
        InputError: ``media`` is not a list of :class:`MediaInput`.
    """
    if media is None:
        return
    if isinstance(media, MediaInput | str | bytes) or not isinstance(media, Sequence):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise InputError("media must be a list of MediaInput")
    for index, item in enumerate(media):
        if not isinstance(item, MediaInput):  # pyright: ignore[reportUnnecessaryIsInstance]
            raise InputError(f"media[{index}] must be a MediaInput, not {type(item).__name__}")


async def stored_media(store: Store, media: Sequence[MediaInput] | None) -> list[dict[str, Any]]:
    """Store each item's bytes (idempotent, content-addressed) and return their ``media`` parts, in order."""
    if not media:
        return []
    async with store.atomic() as tx:
        return [await store_media(tx, item) for item in media]
