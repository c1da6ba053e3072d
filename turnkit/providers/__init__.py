"""Model clients for real providers, on their official SDKs (``pip install 'turnkit[providers]'``).

* :class:`OpenAIClient`: OpenAI's Responses API (``openai`` SDK).
* :class:`AnthropicClient`: Anthropic's Messages API (``anthropic`` SDK).

::

    from turnkit.providers import AnthropicClient

    agent = turnkit.Agent("helper", model="claude-sonnet-4-5", client=AnthropicClient())

Each client is imported on first use, so only the SDK of the provider in use has to be installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from turnkit.errors import TransientModelError

if TYPE_CHECKING:
    from turnkit.providers.anthropic import AnthropicClient
    from turnkit.providers.openai import OpenAIClient

__all__ = ["AnthropicClient", "OpenAIClient", "TransientModelError"]


def __getattr__(name: str) -> Any:
    """Import a client's module (and with it its SDK) only when the client is first asked for."""
    if name == "OpenAIClient":
        from turnkit.providers.openai import OpenAIClient

        return OpenAIClient
    if name == "AnthropicClient":
        from turnkit.providers.anthropic import AnthropicClient

        return AnthropicClient
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
