"""``paint`` and ``view_media`` inside a running turn, and the tools that call them (behaviour §3.12, §4.3).

Both run inside a tool's activity (the turn is ``running``; no claim is taken). Steps: the tree's ``max_spend``
check (over it, ``BudgetError`` and no call), the ``*.requested`` event, the client call (an answer with no usable
image or analysis is charged, then its error raised: :func:`charged_if_unusable`), then one transaction that checks
the tool execution is still open (fenced like :meth:`ToolContext.say`), appends an assistant ``image`` /
``media_analysis`` message and charges the call's usage and cost to the turn
(:func:`turnkit._engine.charges.charge_turn`); then ``message.created`` and ``*.completed``. A charge that takes
the tree over ``max_spend`` raises ``BudgetError "cost limit reached"`` once committed (§3.12 step 3): the tool call
fails with it and so does the turn; the paid result stays recorded, as a model response does.
Generated image bytes go to the store's media table; the message, the tool result and the events hold only the
reference (docs/design.md "Images and media").

The message id is derived from the tool execution, so a retried attempt that finds the message returns it without
calling the client or charging again (over ``max_spend``, it raises the budget error again).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from turnkit._activities.store_retry import retry_store
from turnkit._engine.charges import charge_turn, refuse_over_budget, tree_spend_denial
from turnkit._engine.media_access import usable_media
from turnkit._engine.tool_store import Fence, execution_fence, unfenced
from turnkit.agent import resolve_agent
from turnkit.cost import Cost, cost_from_usage
from turnkit.events import announce_message, emit
from turnkit.kernel.errors import BudgetError, ConfigError, Error, LostClaim
from turnkit.kernel.records import OPEN_EXECUTION_STATUSES, MessageRecord, TurnRecord
from turnkit.media import MediaInput, media_part
from turnkit.media_requests import PaintRequest, ViewMediaRequest, analysis_parts, client_with, image_parts
from turnkit.model import Client, Result, Usage
from turnkit.store.store import Store, StoreTx
from turnkit.tools import Tool, ToolContext

__all__ = ["ImageTool", "ViewMediaTool", "paint_in_turn", "view_media_in_turn"]


async def view_media_in_turn(
    context: ToolContext,
    media: MediaInput | str,
    *,
    objective: str,
    model: str | None = None,
    provider: str | None = None,
    output_schema: dict[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    client: Client | None = None,
) -> dict[str, Any]:
    """Analyse ``media`` (a stored item's id, or a :class:`MediaInput`, stored first) for ``objective`` from a tool.

    Returns:
        The analysis: ``{text, data, model, provider, usage, cost, params, media, metadata, message_id}``.

    Raises:
        LostClaim: The call's execution is no longer open (cancelled, interrupted): nothing is asked or written.
        Error: ``"cannot view media for <status> turn"``, or ``"media client returned no media analysis"``.
        ConfigError: The client has no ``view_media``.
        RecordNotFound: No stored media has that id, or none that this turn's tree has seen (a message of its
            conversations references it: behaviour §3.12).
    """
    store, turn = await _running_turn(context, "cannot view media for")
    ref, data = await media_with_data(store, media, turn=turn, fence=_execution_fence(context))
    agent = resolve_agent(turn.agent_name)
    request = ViewMediaRequest(
        media={**ref, "data": base64.b64encode(data).decode("ascii")},
        objective=objective,
        model=model or turn.model or agent.effective_model,
        provider=provider,
        output_schema=output_schema,
        params=dict(params or {}),
        metadata=dict(metadata or {}),
    )
    message_id = _message_id(context, "view_media", ref["media_id"], objective)
    done = await _existing(store, turn, message_id)
    if done is not None:
        return done
    media_client = client_with(client or agent.effective_client, "view_media")
    try:
        result = await ask_view_media(store, turn, media_client, request, ref)
        analyses = await charged_if_unusable(
            store, _execution_fence(context), turn, result, message_id, lambda: analyses_of(result, request, ref)
        )
    except Exception as err:
        await emit("media.failed", turn.id, turn.conversation_id, error=str(err), metadata=request.metadata)
        raise
    message = await persist_media_message(
        store,
        _execution_fence(context),
        turn,
        result,
        message_id,
        kind="media_analysis",
        parts=analyses,
        metadata={"tool_execution_id": context.execution_id},
        output_data=result.output_data,
    )
    first = described(message)
    await emit_media_completed(turn, first, ref, request.metadata)
    return first


async def paint_in_turn(
    context: ToolContext,
    prompt: str,
    *,
    model: str | None = None,
    provider: str | None = None,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
    input_images: list[MediaInput | str] | None = None,
    mask: MediaInput | str | None = None,
    metadata: Mapping[str, Any] | None = None,
    client: Client | None = None,
) -> dict[str, Any]:
    """Generate an image from a tool; the bytes go to the media table, the ``image`` message holds the reference.

    Returns:
        The image without its bytes: ``{media_id, mime_type, byte_size, sha256, url?, revised_prompt?, model,
        provider, usage, cost, params, metadata, message_id}``.

    Raises:
        LostClaim: The call's execution is no longer open (cancelled, interrupted): nothing is asked or written.
        Error: ``"cannot paint for <status> turn"``, ``"image client returned no image"`` or ``"image client returned
            image without url or data"``.
        ConfigError: No image model, or a client without ``paint`` (Anthropic has no image API).
        RecordNotFound: A reference image or mask id that this turn's tree has never seen.
    """
    store, turn = await _running_turn(context, "cannot paint for")
    if not model:
        raise ConfigError("paint needs an image model (ImageTool.model, or model=)")
    fence = _execution_fence(context)
    references = [await media_with_data(store, item, turn=turn, fence=fence) for item in input_images or ()]
    mask_ref = await media_with_data(store, mask, turn=turn, fence=fence) if mask is not None else None
    request = PaintRequest(
        prompt=prompt,
        model=model,
        provider=provider,
        size=size,
        params=dict(params or {}),
        input_images=[{**ref, "data": base64.b64encode(data).decode("ascii")} for ref, data in references],
        mask=None if mask_ref is None else {**mask_ref[0], "data": base64.b64encode(mask_ref[1]).decode("ascii")},
        metadata=dict(metadata or {}),
    )
    message_id = _message_id(context, "paint", prompt, model)
    done = await _existing(store, turn, message_id)
    if done is not None:
        return done
    image_client = client_with(client or resolve_agent(turn.agent_name).effective_client, "paint")
    result = await generate(store, turn, image_client, request)
    parts = await charged_if_unusable(
        store, fence, turn, result, message_id, lambda: stored_images(store, result, request, fence=fence, turn=turn)
    )
    message = await persist_media_message(
        store,
        _execution_fence(context),
        turn,
        result,
        message_id,
        kind="image",
        parts=parts,
        metadata={"tool_execution_id": context.execution_id},
        output_data=None,
    )
    first = described(message)
    await emit_image_completed(turn, first, request.metadata)
    return first


# -- the call and its events (shared with the standalone mode, turnkit._engine.media_standalone) ---------------------


async def ask_view_media(
    store: Store, turn: TurnRecord, client: Client, request: ViewMediaRequest, ref: dict[str, Any]
) -> Result:
    """``media.requested`` and the client's ``view_media`` (steps 1-2; the answer is taken by :func:`analyses_of`),
    asked only while the tree is within ``max_spend``.

    Raises:
        BudgetError: ``"cost limit reached"`` before the call: nothing is asked or paid.
    """
    await refuse_over_budget(store, turn)
    described_request = request.model_dump(exclude={"media"}) | {"media": ref}
    await emit("media.requested", turn.id, turn.conversation_id, request=described_request)
    return await client.view_media(request)  # pyright: ignore[reportAttributeAccessIssue]


async def analyses_of(result: Result, request: ViewMediaRequest, ref: dict[str, Any]) -> list[dict[str, Any]]:
    """A ``view_media`` answer's ``media_analysis`` parts (media without bytes).

    Raises:
        Error: ``"media client returned no media analysis"``.
    """
    analyses = analysis_parts(result)
    for part in analyses:
        part["media"] = {**{k: v for k, v in dict(part.get("media") or {}).items() if k != "data"}, **ref}
        part.setdefault("model", result.model or request.model)
        part["usage"] = result.usage.to_record()
        part["metadata"] = request.metadata
    return analyses


async def generate(store: Store, turn: TurnRecord, client: Client, request: PaintRequest) -> Result:
    """``image.requested`` and the client's ``paint`` (steps 1-2; the answer is taken by :func:`stored_images`), asked
    only while the tree is within ``max_spend``.

    Raises:
        BudgetError: ``"cost limit reached"`` before the call: nothing is asked or paid.
    """
    await refuse_over_budget(store, turn)
    await emit(
        "image.requested",
        turn.id,
        turn.conversation_id,
        request=request.model_dump(exclude={"input_images", "mask"}),
    )
    return await client.paint(request)  # pyright: ignore[reportAttributeAccessIssue]


async def stored_images(
    store: Store, result: Result, request: PaintRequest, *, fence: Fence | None = None, turn: TurnRecord | None = None
) -> list[dict[str, Any]]:
    """A ``paint`` answer's ``image`` parts with their bytes stored (references only; under ``fence``, with
    ``turn``'s root locked, when given).

    Raises:
        Error: ``"image client returned no image"`` / ``"image client returned image without url or data"`` / ``"image
            client returned image data that is not base64"``.
    """
    parts: list[dict[str, Any]] = []
    for part in image_parts(result):
        stored: dict[str, Any] = {}
        if part.get("data"):
            stored = await _store_generated(store, part, fence, turn)
        kept = {k: v for k, v in part.items() if k != "data"}
        parts.append(
            kept
            | stored
            | {
                "model": part.get("model") or result.model or request.model,
                "provider": part.get("provider") or request.provider,
                "usage": result.usage.to_record(),
                "params": request.params,
                "metadata": request.metadata,
            }
        )
    return parts


async def charged_if_unusable(
    store: Store,
    fence: Fence,
    turn: TurnRecord,
    result: Result,
    call_id: str | None,
    take: Callable[[], Awaitable[list[dict[str, Any]]]],
) -> list[dict[str, Any]]:
    """The answer's parts (``take``); an answer it refuses (an :class:`Error`: no image, no analysis) is charged
    first (behaviour §3.12: step 3, the charge, comes before step 4, the check), then its error is raised.

    The charge is one fenced transaction under the root's lock; with a ``call_id`` (a tool's call: the message id
    its retried attempts share) it also records the id in ``state.unusable_media_calls``, so a retried attempt
    raises the same error without calling or charging again (:func:`_existing`).

    Raises:
        BudgetError: ``"cost limit reached"``: the charge took the tree over ``max_spend`` (step 3 raises first).
        Error: The answer's own error.
    """
    try:
        # Storing the bytes is a store write after the provider answered: it waits out an outage here (the answer
        # would otherwise be lost with the attempt, and its retry would pay for it again).
        return await retry_store(take, what="storing a paid media answer")
    except Error as err:
        cost = cost_from_usage(result.usage, result.model)
        refusal = str(err)

        async def charge() -> str | None:
            async with store.atomic(turn_id=turn.root_turn_id) as tx:
                await fence(tx)
                current = await tx.load_turn(turn.id)
                if call_id is not None and call_id in current.state.unusable_media_calls:
                    return await tree_spend_denial(tx, current)  # an earlier try of this commit landed
                updates: dict[str, Any] = {}
                if call_id is not None:
                    unusable = {**current.state.unusable_media_calls, call_id: refusal}
                    state = current.state.model_copy(update={"unusable_media_calls": unusable})
                    updates["options"] = current.options.with_state(state)
                charged = await charge_turn(tx, current, result.usage, cost, **updates)
                return await tree_spend_denial(tx, charged)

        denial = await retry_store(charge, what="charging an unusable media answer")
        if denial is not None:
            raise BudgetError(denial) from err
        raise


async def emit_media_completed(
    turn: TurnRecord, first: Mapping[str, Any], ref: Mapping[str, Any], metadata: Mapping[str, Any]
) -> None:
    """``media.completed`` for a persisted analysis."""
    await emit(
        "media.completed",
        turn.id,
        turn.conversation_id,
        analysis=first.get("text"),
        model=first.get("model"),
        provider=first.get("provider"),
        media=dict(ref),
        usage=first.get("usage"),
        cost=first.get("cost"),
        metadata=dict(metadata),
    )


async def emit_image_completed(turn: TurnRecord, first: Mapping[str, Any], metadata: Mapping[str, Any]) -> None:
    """``image.completed`` for a persisted image."""
    await emit(
        "image.completed",
        turn.id,
        turn.conversation_id,
        image=dict(first),
        model=first.get("model"),
        provider=first.get("provider"),
        mime_type=first.get("mime_type"),
        usage=first.get("usage"),
        cost=first.get("cost"),
        metadata=dict(metadata),
    )


# -- steps ----------------------------------------------------------------------------------------------------------


async def _running_turn(context: ToolContext, refusal: str) -> tuple[Store, TurnRecord]:
    if context.store is None:
        raise Error("paint and view_media need the worker's store (this context was built outside a worker)")
    # TurnKit's own tool: every write below takes the execution's fence (_execution_fence) in its transaction.
    store = unfenced(context.store)
    async with store.reads() as tx:
        execution = await tx.load_tool_execution(context.execution_id)
        turn = await tx.load_turn(context.turn_id)
    if execution.status not in OPEN_EXECUTION_STATUSES:
        # A revoked call asks for nothing it could not record: no provider call is paid for it.
        raise LostClaim(f"tool execution {execution.id} is {execution.status}: its writes are fenced")
    if turn.status != "running":
        raise Error(f"{refusal} {turn.status} turn")
    return store, turn


async def media_with_data(
    store: Store, media: MediaInput | str, *, turn: TurnRecord, fence: Fence | None = None
) -> tuple[dict[str, Any], bytes]:
    """A media item's reference (its ``media`` part without the type) and bytes; a MediaInput is stored first
    (under ``fence``, taken with the root's lock, when given).

    Raises:
        RecordNotFound: ``"media not found: <id>"``: no such item, or one ``turn``'s tree has never seen
            (:func:`turnkit._engine.media_access.usable_media`).
    """
    given = isinstance(media, MediaInput)
    async with store.atomic(turn_id=turn.root_turn_id if given and fence is not None else None) as tx:
        if isinstance(media, MediaInput):
            if fence is not None:
                await fence(tx)
            record = await tx.put_media(media.data, mime_type=media.mime_type, filename=media.filename)
        else:
            record = await usable_media(tx, turn, str(media))
        data = await tx.load_media_data(record.id)
    part = media_part(record)
    part.pop("type")
    return part, data


async def _store_generated(
    store: Store, part: Mapping[str, Any], fence: Fence | None, turn: TurnRecord | None
) -> dict[str, Any]:
    try:
        data = base64.b64decode(str(part["data"]), validate=True)
    except (binascii.Error, ValueError) as err:
        raise Error("image client returned image data that is not base64") from err
    async with store.atomic(turn_id=turn.root_turn_id if fence is not None and turn is not None else None) as tx:
        if fence is not None:
            await fence(tx)
        record = await tx.put_media(data, mime_type=str(part.get("mime_type") or "image/png"))
    return record.reference()


def _message_id(context: ToolContext, operation: str, *key: str) -> str:
    """The id of the message an execution's call writes: the same on every attempt of that execution."""
    digest = hashlib.sha256("\x1f".join((context.execution_id, operation, *key)).encode()).hexdigest()
    return f"msg_{digest[:24]}"


async def _existing(store: Store, turn: TurnRecord, message_id: str) -> dict[str, Any] | None:
    """What an earlier attempt of this call committed: its result, or (over ``max_spend``, or for a charged answer
    that was unusable) the error it raised; None when it committed nothing."""
    async with store.atomic() as tx:
        message = await tx.find_message(message_id)
    found = None if message is None else described(message)
    unusable = turn.state.unusable_media_calls.get(message_id)
    if found is None and unusable is None:
        return None
    await _within_spend(store, turn)
    if unusable is not None:
        raise Error(unusable)
    return found


def described(message: MessageRecord) -> dict[str, Any]:
    """The first ``image`` / ``media_analysis`` part of a message, without its type, plus ``message_id``."""
    first = next(part for part in message.content if part.get("type") in ("image", "media_analysis"))
    return {k: v for k, v in first.items() if k != "type"} | {"message_id": message.id}


def _execution_fence(context: ToolContext) -> Fence:
    return execution_fence(context.execution_id)


async def persist_media_message(
    store: Store,
    fence: Fence,
    turn: TurnRecord,
    result: Result,
    message_id: str | None,
    *,
    kind: str,
    parts: list[dict[str, Any]],
    metadata: Mapping[str, Any],
    output_data: Any,
    extra_charges: Sequence[tuple[Usage, Cost]] = (),
    finish: Callable[[StoreTx, MessageRecord], Awaitable[None]] | None = None,
) -> MessageRecord:
    """Fence, append the message, charge the turn (and ``extra_charges``: a standalone paint's judge calls; then
    ``finish``), in one transaction under the root's lock.

    A tool's message carries ``tool_execution_id`` in its metadata, as ToolContext.say does: the column of that
    name marks the execution's tool-result message.

    Raises:
        BudgetError: ``"cost limit reached"``: the charge took the tree over ``max_spend``; the message and the
            charge are committed, ``finish`` is not run.
    """
    cost = cost_from_usage(result.usage, result.model)
    for part in parts:
        part["cost"] = cost.total

    async def commit() -> tuple[MessageRecord, str | None]:
        async with store.atomic(turn_id=turn.root_turn_id) as tx:
            # An earlier try of this commit may have landed before its connection went away.
            found = None if message_id is None else await tx.find_message(message_id)
            if found is not None:
                return found, await tree_spend_denial(tx, await tx.load_turn(turn.id))
            await fence(tx)
            message = await tx.append_message(
                turn.conversation_id,
                id=message_id,
                role="assistant",
                kind=kind,
                content=[{"type": kind, **part} for part in parts],
                turn_id=turn.id,
                metadata=dict(metadata) | ({"output_data": output_data} if output_data is not None else {}),
            )
            charged = await charge_turn(tx, await tx.load_turn(turn.id), result.usage, cost)
            for usage, extra in extra_charges:
                charged = await charge_turn(tx, charged, usage, extra)
            denial = await tree_spend_denial(tx, charged)
            announce_message(tx, message)
            if finish is not None and denial is None:
                await finish(tx, message)
            return message, denial

    # The provider has answered and is owed: the commit waits out a store outage rather than lose the answer with
    # the attempt (whose retry would ask, and pay, again). With a ``message_id`` it is idempotent.
    message, denial = await retry_store(commit, what="recording a paid media answer")
    if denial is not None:
        raise BudgetError(denial)  # after the commit: the call is paid for and recorded
    return message


async def _within_spend(store: Store, turn: TurnRecord) -> None:
    """Raise the budget error a call found in the store raised when it was charged (a retried attempt's answer)."""
    async with store.atomic() as tx:
        denial = await tree_spend_denial(tx, await tx.load_turn(turn.id))
    if denial is not None:
        raise BudgetError(denial)


# -- tools ----------------------------------------------------------------------------------------------------------


class ViewMediaTool(Tool):
    """Look at a stored image or document and report what it shows for an objective (behaviour §4.3).

    Use it as it is (``Agent(..., tools=[ViewMediaTool()])``: the model names a ``media_id`` from the conversation),
    or subclass it: override :meth:`media`, :meth:`objective` and :meth:`metadata`, and set the class settings.
    """

    name = "view_media"
    description = "Look at a stored image or document (by its media id) and describe what it shows for an objective."
    usage_hint = "Use when the answer depends on what an image or document in the conversation shows."
    model: ClassVar[str | None] = None
    """The analysing model; None: the turn's model."""
    provider: ClassVar[str | None] = None
    output_schema: ClassVar[dict[str, Any] | None] = None
    params: ClassVar[dict[str, Any]] = {}

    class Arguments(BaseModel):
        media_id: str = Field(description="The media id (media_…) of the image or document to look at.")
        objective: str = Field(description="What to find out from it.")

    def __init__(self, *, client: Client | None = None) -> None:
        """``client``: the client that analyses (default: the agent's)."""
        self.client = client

    def media(self, **arguments: Any) -> MediaInput | str:
        """The media to view: a stored media id or a :class:`MediaInput`."""
        return str(arguments["media_id"])

    def objective(self, **arguments: Any) -> str:
        """The objective of the analysis."""
        return str(arguments["objective"])

    def metadata(self, **arguments: Any) -> dict[str, Any]:
        """Metadata recorded with the analysis and its events."""
        return {}

    async def call(self, context: ToolContext, **arguments: Any) -> dict[str, Any]:
        """Analyse the media through :func:`view_media_in_turn`."""
        return await view_media_in_turn(
            context,
            self.media(**arguments),
            objective=self.objective(**arguments),
            model=self.model,
            provider=self.provider,
            output_schema=self.output_schema,
            params=self.params,
            metadata=self.metadata(**arguments),
            client=self.client,
        )


class ImageTool(Tool):
    """Generate an image (behaviour §4.3): the image is stored, the tool result holds its ``media_id``, not its bytes.

    Set ``model`` (the image model) on a subclass or pass it to the constructor; override :meth:`prompt`,
    :meth:`input_images`, :meth:`mask` and :meth:`metadata` for other arguments.
    """

    name = "paint"
    description = "Generate an image from a complete description."
    usage_hint = "Use when the task asks for an image."
    model: ClassVar[str | None] = None
    provider: ClassVar[str | None] = None
    size: ClassVar[str | None] = None
    params: ClassVar[dict[str, Any]] = {}

    class Arguments(BaseModel):
        prompt: str = Field(description="The image to generate, completely described.")

    def __init__(self, *, model: str | None = None, client: Client | None = None) -> None:
        """``model`` overrides the class's image model; ``client`` paints (default: the agent's client)."""
        self.image_model = model or type(self).model
        self.client = client

    def prompt(self, **arguments: Any) -> str:
        """The generation prompt."""
        return str(arguments["prompt"])

    def input_images(self, **arguments: Any) -> list[MediaInput | str] | None:
        """Reference images (media ids or :class:`MediaInput`); None by default."""
        return None

    def mask(self, **arguments: Any) -> MediaInput | str | None:
        """An edit mask; None by default."""
        return None

    def metadata(self, **arguments: Any) -> dict[str, Any]:
        """Metadata recorded with the image and its events."""
        return {}

    async def call(self, context: ToolContext, **arguments: Any) -> dict[str, Any]:
        """Paint through :func:`paint_in_turn`."""
        return await paint_in_turn(
            context,
            self.prompt(**arguments),
            model=self.image_model,
            provider=self.provider,
            size=self.size,
            params=self.params,
            input_images=self.input_images(**arguments),
            mask=self.mask(**arguments),
            metadata=self.metadata(**arguments),
            client=self.client,
        )
