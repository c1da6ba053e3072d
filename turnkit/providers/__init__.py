"""Model clients for real providers, on their official SDKs (``pip install 'turnkit[providers]'``).

* :class:`OpenAIClient`: OpenAI's Responses API (``openai`` SDK).
* :class:`AnthropicClient`: Anthropic's Messages API (``anthropic`` SDK).
* :class:`GeminiClient`: Gemini's ``generateContent`` (``google-genai`` SDK).
* :class:`OpenAICompatibleClient`: an OpenAI-compatible Chat Completions endpoint by ``base_url`` (OpenRouter,
  vLLM, Ollama, LiteLLM's proxy; ``openai`` SDK).
* :func:`client_for` / :class:`RoutingClient`: the client a model's prefix names (``openrouter/…``, ``ollama/…``,
  ``gemini-…``, ``claude-…``, ``gpt-…``; see :mod:`turnkit.providers.routing`).

::

    from turnkit.providers import AnthropicClient

    agent = turnkit.Agent("helper", model="claude-sonnet-4-5", client=AnthropicClient())

Each client is imported on first use, so only the SDK of the provider in use has to be installed. Each has
``await client.validate(model=...)``: one cheap call that raises ``ModelAccessError`` naming the model when the key
is missing or refused, or the model unknown.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from turnkit._lazy import lazy_exports

if TYPE_CHECKING:
    from turnkit.kernel.errors import TransientModelError
    from turnkit.providers.anthropic import AnthropicClient
    from turnkit.providers.gemini import GeminiClient
    from turnkit.providers.openai import OpenAIClient
    from turnkit.providers.openai_compatible import OpenAICompatibleClient
    from turnkit.providers.routing import RoutingClient, client_for

__all__ = [
    "AnthropicClient",
    "GeminiClient",
    "OpenAIClient",
    "OpenAICompatibleClient",
    "RoutingClient",
    "TransientModelError",
    "client_for",
]

__getattr__, __dir__ = lazy_exports(
    __name__,
    {
        "AnthropicClient": "turnkit.providers.anthropic",
        "GeminiClient": "turnkit.providers.gemini",
        "OpenAIClient": "turnkit.providers.openai",
        "OpenAICompatibleClient": "turnkit.providers.openai_compatible",
        "RoutingClient": "turnkit.providers.routing",
        "TransientModelError": "turnkit.kernel.errors",
        "client_for": "turnkit.providers.routing",
    },
)
