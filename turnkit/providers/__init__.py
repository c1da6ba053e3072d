"""Model clients for real providers, on their official SDKs (``pip install 'turnkit[providers]'``).

* :class:`OpenAIClient`: OpenAI's Responses API (``openai`` SDK).
* :class:`AnthropicClient`: Anthropic's Messages API (``anthropic`` SDK).

::

    from turnkit.providers import AnthropicClient

    agent = turnkit.Agent("helper", model="claude-sonnet-4-5", client=AnthropicClient())

Each client is imported on first use, so only the SDK of the provider in use has to be installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit.kernel.errors import TransientModelError
    from turnkit.providers.anthropic import AnthropicClient
    from turnkit.providers.openai import OpenAIClient

__all__ = ["AnthropicClient", "OpenAIClient", "TransientModelError"]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AnthropicClient": "turnkit.providers.anthropic",
        "OpenAIClient": "turnkit.providers.openai",
        "TransientModelError": "turnkit.kernel.errors",
    },
)
