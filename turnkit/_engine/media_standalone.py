"""``Turn.paint`` / ``Turn.view_media`` in standalone mode (behaviour §3.12): a prepared turn whose whole work is one
image generation or media analysis.

The turn must be ``pending`` and not submitted (a prepared turn, ``build_turn``): a submitted one belongs to its
conversation's lane, which would run it. The call claims it (compare-and-set ``pending`` → ``running`` with a claim
token; a lost claim raises ``"turn is already running"``), emits ``turn.started``, checks the tree's ``max_spend``,
calls the client, then in one transaction fenced on the claim token writes the message and charges the turn. A
painted image is then audited by the agent's output policy, each judge's answer committed with its charge, and one
more fenced transaction completes the turn (or, in ``fail`` mode with a dirty audit, fails it with
``TurnKit::OutputAudit``); an analysis completes it in the first. Every paid answer is thus committed before the
next step can fail, and a retried attempt finds it instead of paying again. On error the turn fails and the error
is re-raised.

Both run in the ``turnkit.standalone_media`` activity of the turn's own workflow (docs/design.md, "No side doors"),
not in the caller's process. ``claim_token`` is that request's: a retried attempt finds the claim its predecessor
took and goes on under it. ``ends_turn`` says which errors end the turn; the others are left for the activity's next
attempt (a provider that may answer when asked again).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from turnkit._activities.judges import answered_audit, judge_next
from turnkit._activities.output_audit import AnswerAudit, PublishedStatus, announce_audit_in, publication
from turnkit._engine.authorization import Action, authorize
from turnkit._engine.ids import new_claim_token
from turnkit._engine.turn_end import fail_unfinished_turn
from turnkit._engine.waits import notify_waiters
from turnkit.agent import Agent, resolve_agent
from turnkit.events import announce, emit
from turnkit.kernel.errors import BudgetError, ConfigError, Error, LostClaim, OutputAudit
from turnkit.kernel.records import MessageRecord, TurnRecord
from turnkit.media import MediaInput
from turnkit.media_requests import PaintRequest, ViewMediaRequest
from turnkit.media_tools import (
    Fence,
    analyses_of,
    ask_view_media,
    charged_if_unusable,
    described,
    emit_image_completed,
    emit_media_completed,
    generate,
    media_with_data,
    persist_media_message,
    stored_images,
)
from turnkit.model import Client, Result
from turnkit.store.store import Store, StoreTx, utcnow

if TYPE_CHECKING:
    from turnkit.runtime import TurnKit

__all__ = ["check_claimable", "paint_turn", "view_media_turn"]


async def paint_turn(
    tk: TurnKit,
    turn_id: str,
    prompt: str,
    *,
    model: str,
    provider: str | None = None,
    size: str | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    client: Client | None = None,
    claim_token: str | None = None,
    ends_turn: Callable[[BaseException], bool] | None = None,
) -> TurnRecord:
    """Paint as the whole of a prepared turn; it completes with ``output_data = {type: "image", images: [...]}``
    (references, no bytes) and ``output_text`` = the image's URL, else its media id.

    The answer is audited with the agent's output policy (behaviour §3.12 step 6): ``policy_audit`` is recorded;
    in ``fail`` mode a dirty audit fails the turn (its output recorded) and raises; ``report`` and ``revise``
    complete it (no model to revise with).

    Raises:
        AuthorizationError: ``"not authorized to paint"``: the hook, asked for the turn's principal with ``turn``,
            ``prompt`` and ``model``, denied it (nothing claimed, nothing paid).
        OutputAudit: The audit found violations and the agent's mode is ``fail``.
        Error: ``"cannot paint for <status> turn"``, ``"turn is already running"``, or the call's error (the turn
            is then failed).
    """
    store = tk.store
    await _authorized(store, turn_id, "paint", prompt=prompt, model=model)
    turn, token = await _claim(store, turn_id, "paint", claim_token)
    request = PaintRequest(
        prompt=prompt,
        model=model,
        provider=provider,
        size=size,
        params=dict(params or {}),
        metadata=dict(metadata or {}),
    )
    try:
        image_client = _chosen(client, turn, "paint")
        fence = _claim_fence(turn.id, token)
        # The image and its charge are committed before its audit can fail, under an id this request's attempts
        # share: a retried attempt finds it and paints nothing (docs/design.md "Every paid call once").
        message_id = _call_message_id(turn.id, "paint", token)
        async with store.reads() as tx:  # the image an earlier attempt of this request committed, if any
            message = await tx.find_message(message_id)
        if message is None:
            result = await generate(store, turn, image_client, request)
            parts = await charged_if_unusable(
                store, fence, turn, result, None, lambda: stored_images(store, result, request, fence=fence, turn=turn)
            )
            message = await persist_media_message(
                store, fence, turn, result, message_id, kind="image", parts=parts, metadata={}, output_data=None
            )
        images = [{k: v for k, v in part.items() if k not in ("type", "cost")} for part in message.content]
        first_image = images[0]
        text = str(first_image.get("url") or first_image.get("media_id") or "")
        output_data = {"type": "image", "images": images}
        agent = resolve_agent(turn.agent_name)
        # The output policy judges the answer as it would a model's (behaviour §3.12 step 6, §3.9).
        audit = await _judged(store, turn, agent, Result.build(text=text, output_data=output_data))
        async with store.atomic(turn_id=turn.root_turn_id) as tx:
            await fence(tx)
            await _completion(turn, text, output_data, agent=agent, audit=audit)(tx, message)
    except Exception as err:
        if ends_turn is None or ends_turn(err):
            await _fail(tk, turn, err)
        raise
    await emit_image_completed(turn, described(message), request.metadata)
    finished = await _finished(tk, turn)
    if finished.status == "failed" and finished.error is not None:
        # Fail mode and a dirty audit: the turn failed with it (its output recorded), and the error is raised.
        raise OutputAudit(str(finished.error.get("message") or ""), finished.error.get("policy_audit"))
    return finished


async def view_media_turn(
    tk: TurnKit,
    turn_id: str,
    media: MediaInput | str,
    *,
    objective: str,
    model: str | None = None,
    provider: str | None = None,
    output_schema: dict[str, Any] | None = None,
    params: Mapping[str, Any] | None = None,
    metadata: Mapping[str, Any] | None = None,
    client: Client | None = None,
    claim_token: str | None = None,
    ends_turn: Callable[[BaseException], bool] | None = None,
) -> TurnRecord:
    """Analyse media as the whole of a prepared turn; it completes with ``output_text`` = the analysis and
    ``output_data = {type: "media_analysis", media_analyses: [...]}``.

    Raises:
        AuthorizationError: ``"not authorized to view_media"``: the hook, asked for the turn's principal with
            ``turn``, ``media`` (the id; None for the caller's own bytes), ``objective`` and ``model``, denied it
            (nothing claimed, nothing paid).
        RecordNotFound: ``"media not found: <id>"``: an id that no message of the turn's tree references.
        Error: ``"cannot view media for <status> turn"``, ``"turn is already running"``, or the call's error (the
            turn is then failed and ``media.failed`` emitted).
    """
    store = tk.store
    media_id = media if isinstance(media, str) else None
    await _authorized(store, turn_id, "view_media", media=media_id, objective=objective, model=model)
    turn, token = await _claim(store, turn_id, "view media", claim_token)
    chosen_metadata = dict(metadata or {})
    try:
        ref, data = await media_with_data(store, media, turn=turn)  # an id: only one this turn's tree has seen
        request = ViewMediaRequest(
            media={**ref, "data": base64.b64encode(data).decode("ascii")},
            objective=objective,
            model=model or turn.model or resolve_agent(turn.agent_name).effective_model,
            provider=provider,
            output_schema=output_schema,
            params=dict(params or {}),
            metadata=chosen_metadata,
        )
        fence = _claim_fence(turn.id, token)
        # The analysis, its charge and the turn's end are one transaction under an id this request's attempts share:
        # an attempt whose predecessor's commit landed finds the turn ended and asks nothing (see the activity).
        message_id = _call_message_id(turn.id, "view_media", token)
        result = await ask_view_media(store, turn, _chosen(client, turn, "view_media"), request, ref)
        analyses = await charged_if_unusable(
            store, fence, turn, result, message_id, lambda: analyses_of(result, request, ref)
        )
        found = [dict(part) for part in analyses]
        message = await persist_media_message(
            store,
            fence,
            turn,
            result,
            message_id,
            kind="media_analysis",
            parts=analyses,
            metadata={},
            output_data=result.output_data,
            finish=_completion(
                turn, str(found[0].get("text") or ""), {"type": "media_analysis", "media_analyses": found}
            ),
        )
    except Exception as err:
        if ends_turn is None or ends_turn(err):
            await emit("media.failed", turn.id, turn.conversation_id, error=str(err), metadata=chosen_metadata)
            await _fail(tk, turn, err)
        raise
    await emit_media_completed(turn, described(message), ref, chosen_metadata)
    return await _finished(tk, turn)


def _call_message_id(turn_id: str, operation: str, token: str) -> str:
    """The message of the standalone call that holds ``token``: the same on every attempt of the request."""
    return "msg_" + hashlib.sha256(f"{turn_id}\x1f{operation}\x1f{token}".encode()).hexdigest()[:24]


async def _judged(store: Store, turn: TurnRecord, agent: Agent, answer: Result) -> AnswerAudit | None:
    """The painted answer's audit: each judge asked once, its answer committed with its charge before the next (a
    retried attempt asks only those that have not answered), then the constraints on the committed answers.

    Raises:
        BudgetError: ``"cost limit reached"``: the tree is over ``max_spend`` (no judge is asked then).
        LostClaim: The turn is no longer running.
    """
    if not agent.output_policy:
        return None
    key = f"paint:{turn.id}"
    while True:
        judged = await judge_next(store, turn, agent, key, answer)
        if judged.stopped:
            raise LostClaim(f"turn {turn.id} is no longer running: this call no longer holds its claim")
        if judged.denial is not None:
            raise BudgetError(judged.denial)
        if not judged.remaining:
            break
    current = await store.load_turn(turn.id)
    messages = await store.list_messages(turn.conversation_id, turn_id=turn.id)
    return await answered_audit(current, agent, answer, key, messages)


async def _authorized(store: Store, turn_id: str, action: Action, **resources: Any) -> None:
    """Ask the hook about a standalone call for the turn's stored principal, before the turn is claimed or anything
    paid for (behaviour §7.3: ``paint``, ``view_media``).

    Raises:
        AuthorizationError: ``"not authorized to <action>"``.
    """
    turn = await store.load_turn(turn_id)
    await authorize(action, turn.options.principal, turn=turn, **resources)


async def _claim(store: Store, turn_id: str, verb: str, token: str | None) -> tuple[TurnRecord, str]:
    turn = await store.load_turn(turn_id)
    if token is not None and turn.status == "running" and turn.claim_token == token:
        return turn, token  # an earlier attempt of this request claimed it (and announced its start)
    check_claimable(turn, verb)
    token = token or new_claim_token()
    now = utcnow()
    async with store.atomic(turn_id=turn.root_turn_id) as tx:
        claimed = await tx.claim_turn(
            turn.id, from_="pending", to="running", claim_token=token, started_at=now, heartbeat_at=now
        )
    if claimed is None:
        raise Error("turn is already running")
    await emit("turn.started", claimed.id, claimed.conversation_id, status=claimed.status, model=claimed.model)
    return claimed, token


def check_claimable(turn: TurnRecord, verb: str) -> None:
    """Raise unless ``turn`` is a prepared turn that a standalone call may claim: pending, never submitted.

    Raises:
        Error: ``"cannot <verb> for <status> turn"``, or ``"cannot <verb> for a submitted turn: …"``.
    """
    if turn.status != "pending":
        raise Error(f"cannot {verb} for {turn.status} turn")
    if turn.submitted_at is not None:
        raise Error(f"cannot {verb} for a submitted turn: its conversation runs it (use a prepared turn)")


def _claim_fence(turn_id: str, token: str) -> Fence:
    async def fence(tx: StoreTx) -> None:
        current = await tx.load_turn(turn_id)
        if current.status != "running" or current.claim_token != token:
            raise LostClaim(f"turn {turn_id} is {current.status}: this call no longer holds its claim")

    return fence


def _completion(
    turn: TurnRecord,
    output_text: str,
    output_data: dict[str, Any],
    *,
    agent: Agent | None = None,
    audit: AnswerAudit | None = None,
) -> Callable[[StoreTx, MessageRecord], Awaitable[None]]:
    """The terminal write. With an ``audit``: ``state.policy_audit`` is recorded and the agent's mode decides, as
    ``complete_with_output`` does (behaviour §3.2 phase output): ``fail`` with a dirty audit fails the turn with
    ``TurnKit::OutputAudit`` (the output still recorded); otherwise it completes. There is no model to ask for a
    revision, so ``revise`` ends like ``report`` (as it does once its revisions are used)."""

    async def finish(tx: StoreTx, message: MessageRecord) -> None:
        status: PublishedStatus = "completed"
        error: dict[str, Any] | None = None
        updates: dict[str, Any] = {}
        if audit is not None and agent is not None:
            current = await tx.load_turn(turn.id)
            state = current.state.model_copy(update={"policy_audit": audit.result.to_dict()})
            current = await tx.update_turn(turn.id, options=current.options.with_state(state))
            status, error = publication(agent, current)
            updates = {"error": error} if error is not None else {}
        ended = await tx.claim_turn(
            turn.id,
            from_="running",
            to=status,
            output_text=output_text,
            output_data=output_data,
            completed_at=utcnow(),
            claim_token=None,
            **updates,
        )
        if audit is not None:
            announce_audit_in(tx, turn, audit, published=True)  # before the turn's own event
        if status == "completed":
            announce(tx, "turn.completed", turn.id, turn.conversation_id, status="completed", output_text=output_text)
        else:
            announce(tx, "turn.failed", turn.id, turn.conversation_id, error=(ended.error if ended else error))

    return finish


def _chosen(client: Client | None, turn: TurnRecord, method: str) -> Client:
    chosen = client if client is not None else resolve_agent(turn.agent_name).effective_client
    if not callable(getattr(chosen, method, None)):
        raise ConfigError(f"{type(chosen).__name__} has no {method}: use a client that supports it")
    return chosen


async def _fail(tk: TurnKit, turn: TurnRecord, err: BaseException) -> None:
    error_class = getattr(type(err), "qualified_name", None) or f"{type(err).__name__}"
    await fail_unfinished_turn(tk.store, tk.client, tk.task_queue, turn.id, str(err), error_class=error_class)


async def _finished(tk: TurnKit, turn: TurnRecord) -> TurnRecord:
    await notify_waiters(tk.store, tk.client, turn.id)  # turns that wait for this one go on
    return await tk.store.load_turn(turn.id)
