"""``paint_image``: the painter's terminal tool (behaviour §1.8).

Every generation is first put to the painter's ``authorization`` gate, which must return literally ``True``.
Image generation itself is not implemented yet in TurnKit for Python: an authorized call fails with
:data:`PAINT_NOT_SUPPORTED` (a tool error the model sees) instead of painting.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, Field

from turnkit.errors import ToolError, ToolValidationError
from turnkit.specialists.read_only import ReadOnlyTool
from turnkit.tools import ToolContext

__all__ = ["NOT_AUTHORIZED", "PAINT_NOT_SUPPORTED", "PaintImageTool"]

NOT_AUTHORIZED: Final = "image generation was not authorized"
PAINT_NOT_SUPPORTED: Final = "image generation is not supported yet in TurnKit for Python; nothing was painted"


class PaintImageTool(ReadOnlyTool):
    """Generate an image from a prompt, optionally from reference images and a mask; ends the turn."""

    name = "paint_image"
    description = "Generate an image from a prompt, optionally guided by reference images and a mask."
    usage_hint = "Use when the task asks for an image; describe it completely in the prompt."
    terminal = True

    class Arguments(BaseModel):
        prompt: str = Field(description="What to paint, completely described.")
        reference_images: list[str] = Field(default_factory=list[str], description="Reference images (URLs or ids).")
        mask: str | None = Field(default=None, description="A mask image for an edit (URL or id).")

    def __init__(
        self,
        *,
        authorization: Callable[..., Any],
        image_model: str | None = None,
        provider: str | None = None,
        size: str | None = None,
        params: Mapping[str, Any] | None = None,
        max_reference_images: int = 4,
    ) -> None:
        """Configure the generation and its gate.

        Raises:
            ValueError: ``authorization`` is not callable, or ``max_reference_images`` is negative.
        """
        if not callable(authorization):
            raise ValueError("painter authorization must be a callable (request, context=...)")
        if isinstance(max_reference_images, bool) or max_reference_images < 0:
            raise ValueError("max_reference_images must be an integer >= 0")
        self.authorization = authorization
        self.image_model = image_model
        self.provider = provider
        self.size = size
        self.params = dict(params or {})
        self.max_reference_images = max_reference_images

    async def call(
        self, context: ToolContext, *, prompt: str, reference_images: list[str], mask: str | None
    ) -> dict[str, Any]:
        """Check the references, ask the gate, then paint (not supported yet).

        Raises:
            ToolValidationError: More references than ``max_reference_images``.
            ToolError: ``"image generation was not authorized"``, or :data:`PAINT_NOT_SUPPORTED`.
        """
        if len(reference_images) > self.max_reference_images:
            raise ToolValidationError(
                f"too many reference images: {len(reference_images)} (at most {self.max_reference_images})"
            )
        request = {
            "prompt": prompt,
            "reference_images": list(reference_images),
            "mask": mask,
            "model": self.image_model,
            "provider": self.provider,
            "size": self.size,
            "params": dict(self.params),
        }
        verdict = self.authorization(request, context=context)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        if verdict is not True:  # literally True, like the authorization hook (behaviour §7.1)
            raise ToolError(NOT_AUTHORIZED)
        raise ToolError(PAINT_NOT_SUPPORTED)
