"""TurnKit's search attributes: find lanes and turns in the Temporal UI and with ``temporal workflow list --query``.

Every lane (``ConversationWorkflow``) carries :data:`CONVERSATION_ID` and :data:`AGENT`; every turn
(``TurnWorkflow``) also carries :data:`ROOT_TURN_ID`, :data:`PARENT_TURN_ID` (sub-agents only) and
:data:`TURN_STATUS`, which the turn keeps current (``running``, ``waiting``, ``paused``, then ``completed``,
``failed`` or ``cancelled``). All are Keyword attributes and must be registered on the namespace: the embedded dev
server and the test servers pass :func:`dev_server_flags`; on a cluster an operator runs :func:`create_commands`,
and workers check at start-up (:func:`require_search_attributes`).

Temporal rejects a start that names an unregistered attribute, and a workflow task that upserts one fails again
and again. So a workflow upserts only when its own start carried TurnKit's attributes (the server accepted them,
so they exist), and starts children with them only then: a workflow started without them never issues a command
that could wedge it. Pure definitions and helpers, importable from workflow code.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

from turnkit.errors import ConfigError

__all__ = [
    "AGENT",
    "ALL_SEARCH_ATTRIBUTES",
    "CONVERSATION_ID",
    "PARENT_TURN_ID",
    "ROOT_TURN_ID",
    "TURN_STATUS",
    "create_commands",
    "dev_server_flags",
    "has_turnkit_attributes",
    "lane_search_attributes",
    "missing_search_attributes",
    "registration_hint",
    "require_search_attributes",
    "turn_search_attributes",
]

#: The conversation id (lanes: their own workflow id; turns: the conversation they run in).
CONVERSATION_ID: Final = SearchAttributeKey.for_keyword("TurnKitConversationId")
#: The agent name of the conversation or turn.
AGENT: Final = SearchAttributeKey.for_keyword("TurnKitAgent")
#: The root turn of the turn's tree (a root turn's own id). Turns only.
ROOT_TURN_ID: Final = SearchAttributeKey.for_keyword("TurnKitRootTurnId")
#: The parent turn of a sub-agent's turn (unset for root turns). Turns only.
PARENT_TURN_ID: Final = SearchAttributeKey.for_keyword("TurnKitParentTurnId")
#: The turn's status as its workflow sees it, kept current (``waiting`` = on sub-agents or other turns). Turns only.
TURN_STATUS: Final = SearchAttributeKey.for_keyword("TurnKitTurnStatus")

ALL_SEARCH_ATTRIBUTES: Final[tuple[SearchAttributeKey[str], ...]] = (
    CONVERSATION_ID,
    AGENT,
    ROOT_TURN_ID,
    PARENT_TURN_ID,
    TURN_STATUS,
)


def lane_search_attributes(conversation_id: str, agent_name: str | None = None) -> TypedSearchAttributes:
    """The attributes a lane is started with (the agent may be unknown to the starter: the lane adds it)."""
    pairs = [SearchAttributePair(CONVERSATION_ID, conversation_id)]
    if agent_name:
        pairs.append(SearchAttributePair(AGENT, agent_name))
    return TypedSearchAttributes(pairs)


def turn_search_attributes(
    *, conversation_id: str, agent_name: str, root_turn_id: str, parent_turn_id: str | None, status: str = "running"
) -> TypedSearchAttributes:
    """The attributes a turn workflow is started with."""
    pairs = [
        SearchAttributePair(CONVERSATION_ID, conversation_id),
        SearchAttributePair(AGENT, agent_name),
        SearchAttributePair(ROOT_TURN_ID, root_turn_id),
        SearchAttributePair(TURN_STATUS, status),
    ]
    if parent_turn_id:
        pairs.append(SearchAttributePair(PARENT_TURN_ID, parent_turn_id))
    return TypedSearchAttributes(pairs)


def has_turnkit_attributes(attributes: TypedSearchAttributes) -> bool:
    """Whether a workflow was started with TurnKit's attributes (proof that the namespace has them registered)."""
    return attributes.get(CONVERSATION_ID) is not None


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
    """Raise :class:`~turnkit.errors.ConfigError` naming the attributes the namespace lacks (workers call it at
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
