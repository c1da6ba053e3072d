"""Choosing a provider client by the model's prefix, as the seed does (behaviour §3.6 ``validate!``).

====================  ==========================================================================================
Model                 Client
====================  ==========================================================================================
``openrouter/<m>``    :class:`OpenAICompatibleClient` on ``https://openrouter.ai/api/v1`` (``OPENROUTER_API_KEY``)
``ollama/<m>``        :class:`OpenAICompatibleClient` on ``$OLLAMA_BASE_URL`` or ``http://localhost:11434/v1``
``vllm/<m>``          :class:`OpenAICompatibleClient` on ``$VLLM_BASE_URL`` or ``http://localhost:8000/v1``
``litellm/<m>``       :class:`OpenAICompatibleClient` on ``$LITELLM_BASE_URL`` or ``http://localhost:4000``
                      (``LITELLM_API_KEY`` when set)
``gemini…``           :class:`GeminiClient` (``gemini/<m>`` or ``gemini-…``)
``claude…``           :class:`AnthropicClient` (``claude-…`` or ``anthropic/<m>``)
``gpt…``, ``o1…``…    :class:`OpenAIClient` (``gpt-…``, ``chatgpt-…``, ``o1``/``o3``/``o4…``, ``openai/<m>``)
====================  ==========================================================================================

A model with none of these prefixes is refused with a :class:`~turnkit.kernel.errors.ConfigError` that lists them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from turnkit.kernel.errors import ConfigError
from turnkit.media_requests import PaintRequest, ViewMediaRequest
from turnkit.model import ModelRequest, Result
from turnkit.providers._common import ProviderClient, resolve_model

__all__ = ["OPENROUTER_BASE_URL", "Route", "RoutingClient", "client_for", "route"]

#: OpenRouter's OpenAI-compatible API.
OPENROUTER_BASE_URL: Final = "https://openrouter.ai/api/v1"

# prefix → (provider, default base URL, base URL variable, key variable, key required)
_COMPATIBLE: Final = {
    "openrouter/": ("openrouter", OPENROUTER_BASE_URL, None, "OPENROUTER_API_KEY", True),
    "ollama/": ("ollama", "http://localhost:11434/v1", "OLLAMA_BASE_URL", None, False),
    "vllm/": ("vllm", "http://localhost:8000/v1", "VLLM_BASE_URL", None, False),
    "litellm/": ("litellm", "http://localhost:4000", "LITELLM_BASE_URL", "LITELLM_API_KEY", False),
}
_OPENAI: Final = re.compile(r"^(gpt|chatgpt|o[1-9])")
_PREFIXES: Final = "openrouter/, ollama/, vllm/, litellm/, gemini, claude, anthropic/, gpt, chatgpt, o1/o3/o4, openai/"


@dataclass(frozen=True)
class Route:
    """Where a model goes: the provider and the model name that provider knows."""

    provider: str
    """``openai``, ``anthropic``, ``gemini``, ``openrouter``, ``ollama``, ``vllm`` or ``litellm``."""
    model: str
    """The model without the routing prefix (``openrouter/meta/llama-3`` → ``meta/llama-3``)."""


def route(model: str) -> Route:
    """The provider of a model, by its prefix (see the module's table).

    Raises:
        ModelAccessError: No model.
        ConfigError: No known prefix.
    """
    name = resolve_model(None, model)
    for prefix, (provider, *_rest) in _COMPATIBLE.items():
        if name.startswith(prefix):
            return Route(provider, name.removeprefix(prefix))
    for prefix, provider in (("gemini/", "gemini"), ("anthropic/", "anthropic"), ("openai/", "openai")):
        if name.startswith(prefix):
            return Route(provider, name.removeprefix(prefix))
    if name.startswith("gemini"):
        return Route("gemini", name)
    if name.startswith("claude"):
        return Route("anthropic", name)
    if _OPENAI.match(name):
        return Route("openai", name)
    raise ConfigError(f"no provider for model {name!r}: start it with one of {_PREFIXES}")


def _new_client(provider: str, model: str | None, options: Mapping[str, Any]) -> ProviderClient[Any, Any]:
    # Imported here: each provider's SDK is needed only when one of its models is used.
    if provider == "openai":
        from turnkit.providers.openai import OpenAIClient

        return OpenAIClient(model, **options)
    if provider == "anthropic":
        from turnkit.providers.anthropic import AnthropicClient

        return AnthropicClient(model, **options)
    if provider == "gemini":
        from turnkit.providers.gemini import GeminiClient

        return GeminiClient(model, **options)
    from turnkit.providers.openai_compatible import OpenAICompatibleClient

    prefix = f"{provider}/"
    _name, default_url, url_variable, key_variable, key_required = _COMPATIBLE[prefix]
    settings: dict[str, Any] = {
        "base_url": (os.environ.get(url_variable) if url_variable else None) or default_url,
        "provider": provider,
        "thinking_style": "openrouter" if provider == "openrouter" else "reasoning_effort",
    }
    if key_variable and (key_required or os.environ.get(key_variable)):
        settings["api_key_env"] = key_variable
    return OpenAICompatibleClient(model, **{**settings, **options})


def client_for(model: str, **options: Any) -> ProviderClient[Any, Any]:
    """A new client for ``model``, pinned to the name its provider knows (the prefix dropped).

    Example::

        model = "openrouter/qwen/qwen3-32b"
        agent = turnkit.Agent("helper", model=model, client=client_for(model))

    Args:
        model: A model with a routing prefix (see the module's table).
        options: Keyword arguments of the chosen client class (``api_key``, ``base_url``, ``timeout``...).

    Raises:
        ConfigError: No known prefix.
    """
    where = route(model)
    return _new_client(where.provider, where.model, options)


class RoutingClient:
    """A :class:`turnkit.Client` that sends each request to the provider its model names (see the module's table):
    one client per provider, built on first use; ``settings.client = RoutingClient()`` lets every agent pick its
    provider by its ``model``.

    Results name the model as its provider knows it (without the prefix), as :func:`client_for`'s clients do: the
    name the bundled prices know (``gemini-2.5-flash``); OpenRouter reports each call's cost itself.
    """

    def __init__(self, options: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Create the router.

        Args:
            options: Keyword arguments per provider (``{"openrouter": {"api_key": ...}, "gemini": {...}}``) for
                the clients it builds.
        """
        self.options = {name: dict(each) for name, each in (options or {}).items()}
        self._clients: dict[str, ProviderClient[Any, Any]] = {}

    def client(self, provider: str) -> ProviderClient[Any, Any]:
        """The router's client of a provider (built on first use, not pinned to a model)."""
        if provider not in self._clients:
            self._clients[provider] = _new_client(provider, None, self.options.get(provider, {}))
        return self._clients[provider]

    async def chat(self, request: ModelRequest) -> Result:
        """Send the request to its model's provider, with the model's routing prefix dropped."""
        where = route(request.model)
        return await self.client(where.provider).chat(request.model_copy(update={"model": where.model}))

    async def validate(self, *, model: str) -> None:
        """Validate ``model`` with its provider's client (see :meth:`ProviderClient.validate`)."""
        where = route(model)
        await self.client(where.provider).validate(model=where.model)

    async def view_media(self, request: ViewMediaRequest) -> Result:
        """Analyse media with the request model's provider."""
        where = route(request.model)
        return await self.client(where.provider).view_media(request.model_copy(update={"model": where.model}))

    async def paint(self, request: PaintRequest) -> Result:
        """Generate an image with the request model's provider."""
        where = route(request.model)
        return await self.client(where.provider).paint(request.model_copy(update={"model": where.model}))

    async def close(self) -> None:
        """Close every client it built."""
        for each in self._clients.values():
            await each.close()

    def __repr__(self) -> str:
        """Show the providers in use."""
        return f"RoutingClient(providers={sorted(self._clients)!r})"
