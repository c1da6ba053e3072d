"""TurnKit's search attributes: find lanes and turns in the Temporal UI and with ``temporal workflow list --query``.

Every lane (``ConversationWorkflow``) carries :data:`CONVERSATION_ID` and :data:`AGENT`; every turn
(``TurnWorkflow``) also carries :data:`ROOT_TURN_ID`, :data:`PARENT_TURN_ID` (sub-agents only) and
:data:`TURN_STATUS`, which the turn keeps current (``running``, ``waiting``, ``paused``, then ``completed``,
``failed`` or ``cancelled``). All are Keyword attributes and must be registered on the namespace (registration and
the start-up check are in :mod:`turnkit._temporal.search_attributes`).

Temporal rejects a start that names an unregistered attribute, and a workflow task that upserts one fails again
and again. So a workflow upserts only when its own start carried TurnKit's attributes (the server accepted them,
so they exist), and starts children with them only then: a workflow started without them never issues a command
that could wedge it.
"""

from __future__ import annotations

from typing import Final

from temporalio.common import SearchAttributeKey, SearchAttributePair, TypedSearchAttributes

__all__ = [
    "AGENT",
    "ALL_SEARCH_ATTRIBUTES",
    "CONVERSATION_ID",
    "PARENT_TURN_ID",
    "ROOT_TURN_ID",
    "TURN_STATUS",
    "has_turnkit_attributes",
    "lane_search_attributes",
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
