"""Registering TurnKit's search attributes on a namespace, and the workers' start-up check that they are there.

The attributes themselves (their keys, and the pairs a lane or a turn starts with) are pure definitions, in
:mod:`turnkit.kernel.search_attributes`, which workflow code imports. The embedded dev server and the test servers
pass :func:`dev_server_flags`; on a cluster an operator runs :func:`create_commands`, and workers check at start-up
(:func:`require_search_attributes`).
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey

from turnkit.kernel.errors import ConfigError
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES

__all__ = [
    "create_commands",
    "dev_server_flags",
    "missing_search_attributes",
    "registration_hint",
    "require_search_attributes",
]


def dev_server_flags(keys: Sequence[SearchAttributeKey[str]] = ALL_SEARCH_ATTRIBUTES) -> list[str]:
    """``temporal server start-dev`` flags that register the attributes."""
    return [arg for key in keys for arg in ("--search-attribute", f"{key.name}=Keyword")]


def create_commands(namespace: str = "default", names: Sequence[str] | None = None) -> list[str]:
    """The ``temporal operator search-attribute create`` commands that register the attributes on a cluster."""
    wanted = list(names) if names is not None else [key.name for key in ALL_SEARCH_ATTRIBUTES]
    return [
        f"temporal operator search-attribute create --namespace {namespace} --name {name} --type Keyword"
        for name in wanted
    ]


def registration_hint(message: str) -> str:
    """What to do about a start Temporal rejected for an unregistered TurnKit attribute ("" for any other error)."""
    if "search attribute TurnKit" not in message:
        return ""
    return (
        " (register TurnKit's search attributes on the namespace with `temporal operator search-attribute create`,"
        " see the README's 'Finding runs in the Temporal UI', or run with turnkit.configure(search_attributes=False))"
    )


async def missing_search_attributes(client: Client) -> list[str]:
    """The TurnKit attributes the client's namespace lacks (or has with another type than Keyword)."""
    response = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    known = response.custom_attributes
    keyword = IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
    return [key.name for key in ALL_SEARCH_ATTRIBUTES if known.get(key.name) != keyword]


async def require_search_attributes(client: Client) -> None:
    """Raise :class:`~turnkit.kernel.errors.ConfigError` naming the attributes the namespace lacks (workers call it at
    start-up, before any workflow could start or upsert one)."""
    missing = await missing_search_attributes(client)
    if not missing:
        return
    commands = "\n  ".join(create_commands(client.namespace, missing))
    raise ConfigError(
        f"Temporal namespace {client.namespace!r} lacks TurnKit's search attributes (Keyword): {', '.join(missing)}. "
        f"Register them (once per namespace):\n  {commands}\n"
        "or run without them: turnkit.configure(search_attributes=False)."
    )
