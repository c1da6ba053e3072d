"""``paint_image``: the painter's terminal tool (behaviour §1.8).

Every generation is first put to the painter's ``authorization`` gate, which must return literally ``True``; then
the image is generated inside the turn (:func:`turnkit.media_tools.paint_in_turn`): stored in the media table, with
an ``image`` message that references it. The terminal result holds the message id and the image without its bytes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, Final

from pydantic import BaseModel, Field

from turnkit.kernel.errors import ToolError, ToolValidationError
from turnkit.media_tools import paint_in_turn
from turnkit.specialists.read_only import ReadOnlyTool
from turnkit.tools import ToolContext

__all__ = ["NOT_AUTHORIZED", "PaintImageTool"]

NOT_AUTHORIZED: Final = "image generation was not authorized"


class PaintImageTool(ReadOnlyTool):
    """Generate an image from a prompt, optionally from reference images and a mask; ends the turn."""

    name = "paint_image"
    description = "Generate an image from a prompt, optionally guided by reference images and a mask."
    usage_hint = "Use when the task asks for an image; describe it completely in the prompt."
    terminal = True

    class Arguments(BaseModel):
        prompt: str = Field(description="What to paint, completely described.")
        reference_images: list[str] = Field(default_factory=list, description="Reference images (media ids).")
        mask: str | None = Field(default=None, description="A mask image for an edit (a media id).")

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
        """Check the references, ask the gate, then paint.

        Returns:
            ``{conversation_id, image_message_id, image}``; ``image`` references the stored image (no bytes).

        Raises:
            ToolValidationError: More references than ``max_reference_images``.
            ToolError: ``"image generation was not authorized"``.
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
        image = await paint_in_turn(
            context,
            prompt,
            model=self.image_model,
            provider=self.provider,
            size=self.size,
            params=self.params,
            input_images=list(reference_images) or None,
            mask=mask,
        )
        message_id = image.pop("message_id")
        return {"conversation_id": context.conversation_id, "image_message_id": message_id, "image": image}
