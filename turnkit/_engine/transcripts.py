"""Transcripts read once per worker process (issue 37 target 4): a model call reads only what was appended since.

A turn's model request shows its frozen context (the conversation's messages through its
``context_message_sequence``) plus its own messages. Reading, decoding and projecting the whole transcript on every
call made a long conversation's turns slower with each turn. :class:`Transcripts` keeps, per conversation, the stored
messages from the first through the last one it read, each with its projection and token estimate, and extends them
by reading only the messages after that (``list_messages(after_sequence=...)``).

Why a kept prefix is never stale:

* Messages are append-only: no statement updates or deletes a message row, and a conversation's sequence is
  gap-free, assigned under the conversation's lock. Once committed, the messages through a sequence never change.
* Every read still goes to the store for everything after the kept prefix, in the caller's transaction, so appends
  by another worker, process or store handle are always seen.
* That read starts at the kept prefix's last message, which must come back with the id kept for it; otherwise (a
  database replaced under a running worker, say) the conversation's entry is dropped and it is read whole.
* Rows join the cache only once the reading transaction has committed (:meth:`StoreTx.after_commit`): the model
  activity's reserve may append a message itself, which a rollback takes back. A read inside a savepoint, or rows
  that do not continue the kept prefix without a gap, are not kept at all.

Besides each message's projection and token estimate, the kept prefix carries the running sums of the estimates
and of the projections' characters, where its summaries, delivered messages, media and renamed tool calls are, and
its tool calls' and results' ids one after the other. So a call's compaction check, its look for an earlier summary,
its scan for deliveries and the request's messages (:meth:`Transcript.replay`: the unanswered calls dropped, the
provider's call ids put back, the characters counted, the media found) pass over the turn's own messages only, not
the whole frozen context again. A long conversation's model call otherwise grew by one Python-level pass over every
message per step: at 1,950 messages those passes took ~3 ms of a call's CPU, more than the rest of its transcript
work.

Memory is bounded by :data:`MAX_KEPT_BYTES` over all conversations, the least recently read conversation going
first; a conversation bigger than that on its own is read whole on every call, as before. A kept message is counted
as its projected text's characters plus :data:`KEPT_MESSAGE_BYTES`: measured with ``tracemalloc``, a kept message
took its text plus 2.6 KB (a text message) to 3.3 KB (a tool call), whatever the text's length; the record, its
projection and what was derived of it.
"""

from __future__ import annotations

import copy
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, NoReturn

from turnkit._engine.call_ids import provider_call_ids
from turnkit._engine.compaction import message_tokens
from turnkit._engine.request import replay_messages
from turnkit.kernel.records import MessageRecord
from turnkit.prompt import drop_unanswered_calls, project_message
from turnkit.store.store import StoreTx

__all__ = ["KEPT_MESSAGE_BYTES", "MAX_KEPT_BYTES", "KeptMessage", "Replay", "Transcript", "Transcripts"]

#: About how much memory one :class:`Transcripts` keeps over all conversations (a worker has one per store).
MAX_KEPT_BYTES: Final = 64 * 2**20
#: What a kept message costs besides its projected text's characters (see the module docstring).
KEPT_MESSAGE_BYTES: Final = 3_000


class KeptMessage(dict[str, Any]):
    """A projected message a worker keeps, which every later model request of its conversation sends again: the
    requests share it, so it cannot be changed (a ``TypeError`` says so). A copy or a pickle of it is a plain dict."""

    __slots__ = ()

    def __setitem__(self, *args: Any) -> NoReturn:
        _read_only()

    def __delitem__(self, *args: Any) -> NoReturn:
        _read_only()

    def __ior__(self, *args: Any) -> NoReturn:
        _read_only()

    def update(self, *args: Any, **kwargs: Any) -> NoReturn:
        _read_only()

    def pop(self, *args: Any) -> NoReturn:
        _read_only()

    def popitem(self) -> NoReturn:
        _read_only()

    def clear(self) -> NoReturn:
        _read_only()

    def setdefault(self, *args: Any) -> NoReturn:
        _read_only()

    def __reduce__(self) -> tuple[type[dict[str, Any]], tuple[dict[str, Any]]]:
        return dict, (dict(self),)

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return copy.deepcopy(dict(self), memo)


def _read_only() -> NoReturn:
    raise TypeError(
        "a model request's messages are shared with the worker's kept transcript and cannot be changed: "
        "build a new dict instead ({**message, ...})"
    )


@dataclass(frozen=True)
class _Derived:
    """What a model call computes of one stored message: its projection and its token estimate, and of the
    projection what the request's messages need (:meth:`Transcript.replay`)."""

    projected: list[dict[str, Any]]
    tokens: int
    #: The characters of the projections' contents (the ``model.requested`` report's ``message_chars``).
    chars: int = 0
    #: The ids of the tool calls the projections make, and of the calls they answer (``role`` ``tool``).
    calls: tuple[Any, ...] = ()
    answers: tuple[Any, ...] = ()
    #: Whether a call carries the provider's own id (``provider_id``: renamed on ingest), and a projection media.
    renamed: bool = False
    media: bool = False


def _derive(message: MessageRecord) -> _Derived:
    projected: list[dict[str, Any]] = [KeptMessage(item) for item in project_message(message)]
    chars = 0
    calls: list[Any] = []
    answers: list[Any] = []
    renamed = media = False
    # The same reads as the passes they stand for: drop_unanswered_calls, provider_call_ids, the report's count and
    # with_media_data's look.
    for item in projected:
        chars += len(str(item.get("content") or ""))
        media = media or bool(item.get("media"))
        if item.get("role") == "tool":
            answers.append(item.get("tool_call_id"))
        for call in item.get("tool_calls") or ():
            calls.append(call.get("id"))
            renamed = renamed or "provider_id" in call
    return _Derived(projected, message_tokens(message), chars, tuple(calls), tuple(answers), renamed, media)


@dataclass(frozen=True)
class Replay:
    """A transcript's messages as a model request sends them (:meth:`Transcript.replay`), with what the model
    activity reports and checks of them."""

    #: ``provider_call_ids(drop_unanswered_calls(project_messages(messages)))``: read-only, shared with the kept
    #: transcript.
    messages: list[dict[str, Any]]
    #: The characters of their contents.
    chars: int
    #: Whether one of them references media (whose bytes the model activity adds).
    media: bool


@dataclass
class _Kept:
    """A conversation's committed messages, contiguous from its first, with what was derived of each (by id)."""

    messages: list[MessageRecord]
    derived: dict[str, _Derived] = field(default_factory=dict)
    #: The bytes they take, as estimated (the module docstring).
    size: int = 0
    #: ``tokens[i]``: the token estimates of ``messages[:i]`` summed (one more entry than ``messages``).
    tokens: list[int] = field(default_factory=lambda: [0])
    #: The positions in ``messages`` of its ``context_summary`` messages and of its delivered messages.
    summaries: list[int] = field(default_factory=list)
    deliveries: list[int] = field(default_factory=list)
    #: The projections of ``messages``, one after the other; ``offsets[i]``: how many of them are ``messages[:i]``'s.
    projected: list[dict[str, Any]] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])
    #: ``projected_chars[i]``: the characters of ``messages[:i]``'s projections summed.
    projected_chars: list[int] = field(default_factory=lambda: [0])
    #: The ids of the projections' tool calls and of the calls they answer, one after the other, and how many of
    #: them are ``messages[:i]``'s.
    calls: list[Any] = field(default_factory=list)
    call_offsets: list[int] = field(default_factory=lambda: [0])
    answers: list[Any] = field(default_factory=list)
    answer_offsets: list[int] = field(default_factory=lambda: [0])
    #: The positions in ``messages`` of those with a renamed tool call, and with media.
    renamed: list[int] = field(default_factory=list)
    media: list[int] = field(default_factory=list)

    @property
    def last(self) -> int:
        """The sequence of the last kept message."""
        return self.messages[-1].sequence

    def extend(self, rows: Sequence[MessageRecord], derived: Mapping[str, _Derived]) -> int:
        """Append ``rows`` (the messages right after :attr:`last`, in order), with what was derived of them (the
        rest is derived now: a later turn shows them); the bytes added, as estimated (the module docstring)."""
        added = 0
        for row in rows:
            known = derived.get(row.id) or _derive(row)
            if row.kind == "context_summary":
                self.summaries.append(len(self.messages))
            if row.metadata.get("delivery_id"):
                self.deliveries.append(len(self.messages))
            if known.renamed:
                self.renamed.append(len(self.messages))
            if known.media:
                self.media.append(len(self.messages))
            self.messages.append(row)
            self.derived[row.id] = known
            self.tokens.append(self.tokens[-1] + known.tokens)
            self.projected.extend(known.projected)
            self.offsets.append(len(self.projected))
            self.projected_chars.append(self.projected_chars[-1] + known.chars)
            self.calls.extend(known.calls)
            self.call_offsets.append(len(self.calls))
            self.answers.extend(known.answers)
            self.answer_offsets.append(len(self.answers))
            added += (known.tokens - 8) * 4 + KEPT_MESSAGE_BYTES  # the projected text, and the objects around it
        self.size += added
        return added


def _contiguous(rows: Sequence[MessageRecord], after: int) -> list[MessageRecord]:
    """The rows after sequence ``after`` that continue it without a gap, in order (``rows``: in sequence order)."""
    kept: list[MessageRecord] = []
    for row in rows:
        if row.sequence <= after:
            continue
        if row.sequence != after + 1:
            break
        kept.append(row)
        after = row.sequence
    return kept


class Transcript:
    """A turn's messages as a model call reads them, with each one's projection and token estimate computed once
    per worker process (:meth:`replay` for :func:`turnkit._engine.request.build_model_request`, :meth:`tokens` for
    :func:`turnkit._engine.compaction.should_compact`)."""

    def __init__(
        self, messages: list[MessageRecord], known: Mapping[str, _Derived], kept: _Kept | None = None, cut: int = 0
    ) -> None:
        #: The frozen context plus the turn's own messages, in sequence order (as ``StoreTx.list_messages`` with
        #: ``through_sequence`` and ``turn_id`` returns them).
        self.messages = messages
        #: What the cache derived (the kept conversation's): read only here.
        self.known = known
        #: What was derived of messages not kept yet (the cache takes it with them after the commit).
        self.derived_here: dict[str, _Derived] = {}
        # ``messages`` starts with the first ``cut`` messages of ``kept``: what the cache summed and placed of them is
        # read from it at ``cut`` (a kept prefix only grows, so nothing before ``cut`` changes; a replaced one is
        # another object).
        self._kept = kept if kept is not None and cut > 0 else _Kept([])
        self._prefix = cut if kept is not None else 0

    def _derived(self, message: MessageRecord) -> _Derived:
        found = self.known.get(message.id) or self.derived_here.get(message.id)
        if found is None:
            found = self.derived_here[message.id] = _derive(message)
        return found

    def project(self, message: MessageRecord) -> list[dict[str, Any]]:
        """:func:`turnkit.prompt.project_message` of ``message``, computed once (callers must not change it)."""
        found = self.known.get(message.id)  # the common case first: one lookup
        return (found or self._derived(message)).projected

    def tokens(self, message: MessageRecord) -> int:
        """:func:`turnkit._engine.compaction.message_tokens` of ``message``, computed once."""
        found = self.known.get(message.id)
        return (found or self._derived(message)).tokens

    def project_all(self, messages: Sequence[MessageRecord]) -> list[dict[str, Any]]:
        """:func:`turnkit.prompt.project_messages` of ``messages``: when they start with the kept prefix this
        transcript's messages start with (the same messages: no summary took their place), its projections are
        taken whole and only the rest is projected one by one."""
        cut = self._prefix
        if cut and len(messages) >= cut and messages[:cut] == self.messages[:cut]:  # identical objects: a C loop
            projected = self._kept.projected[: self._kept.offsets[cut]]
            rest = messages[cut:]
        else:
            projected, rest = [], messages
        for message in rest:
            projected.extend(self.project(message))
        return projected

    def replay(self, messages: Sequence[MessageRecord]) -> Replay:
        """``messages`` (:attr:`messages`, or what the compaction made of them) as a model request sends them.

        For :attr:`messages` without a summary, the kept prefix's projections are taken whole; whether any of its
        calls is unanswered or renamed, its characters and its media come from the kept sums and positions; only
        the rest is passed over. The two passes that change messages (unanswered calls dropped, the provider's call
        ids put back) run only when they would change something, as each leaves the messages as they are otherwise.
        With a summary, compaction's projection comes first: every pass runs (:func:`replay_messages`).
        """
        if messages is not self.messages or self.has_summary():
            sent = replay_messages(messages, project_all=self.project_all)
            chars = sum(len(str(message.get("content") or "")) for message in sent)
            return Replay(sent, chars, any(message.get("media") for message in sent))
        kept, cut = self._kept, self._prefix
        projected = kept.projected[: kept.offsets[cut]]
        chars, renamed, media = kept.projected_chars[cut], _before(kept.renamed, cut), _before(kept.media, cut)
        calls = set(kept.calls[: kept.call_offsets[cut]])
        answers = set(kept.answers[: kept.answer_offsets[cut]])
        for message in messages[cut:]:
            derived = self.known.get(message.id) or self._derived(message)
            projected.extend(derived.projected)
            chars += derived.chars
            calls.update(derived.calls)
            answers.update(derived.answers)
            renamed = renamed or derived.renamed
            media = media or derived.media
        sent = projected
        if not calls <= answers:
            sent = drop_unanswered_calls(sent)
        if renamed:
            sent = provider_call_ids(sent)
        return Replay(sent, chars, media)

    def total_tokens(self) -> int:
        """The token estimates of :attr:`messages` summed (:func:`turnkit._engine.compaction.estimate_tokens`)."""
        tokens = self.tokens
        return self._kept.tokens[self._prefix] + sum(tokens(message) for message in self.messages[self._prefix :])

    def has_summary(self) -> bool:
        """Whether any of :attr:`messages` is a ``context_summary``."""
        if _before(self._kept.summaries, self._prefix):
            return True
        return any(message.kind == "context_summary" for message in self.messages[self._prefix :])

    def delivered(self) -> list[MessageRecord]:
        """The messages of :attr:`messages` with a ``delivery_id`` in their metadata, in order."""
        kept, cut = self._kept, self._prefix
        earlier = [kept.messages[i] for i in kept.deliveries[: bisect_left(kept.deliveries, cut)]]
        return earlier + [message for message in self.messages[cut:] if message.metadata.get("delivery_id")]


def _before(positions: list[int], cut: int) -> bool:
    """Whether any of ``positions`` (ascending) is before ``cut``."""
    return bool(positions) and positions[0] < cut


class Transcripts:
    """Conversations' transcripts kept in memory by one worker (its model activities' own, so one per store).

    Only committed messages are kept; see the module docstring for why a kept prefix is never stale.
    """

    def __init__(self, max_bytes: int = MAX_KEPT_BYTES) -> None:
        """Keep about ``max_bytes`` at most over all conversations."""
        self.max_bytes = max_bytes
        self._kept: OrderedDict[str, _Kept] = OrderedDict()
        self._size = 0
        #: Message rows read from the store so far (benches and tests compare it with what was served).
        self.rows_read = 0

    def __len__(self) -> int:
        """How many conversations are kept."""
        return len(self._kept)

    @property
    def size(self) -> int:
        """The bytes kept over all conversations, as estimated (the module docstring)."""
        return self._size

    def kept_through(self, conversation_id: str) -> int | None:
        """The sequence through which ``conversation_id`` is kept, or None."""
        kept = self._kept.get(conversation_id)
        return None if kept is None else kept.last

    async def read(self, tx: StoreTx, conversation_id: str, *, through_sequence: int, turn_id: str) -> Transcript:
        """The messages of ``turn_id`` in ``conversation_id`` (those through ``through_sequence`` plus its own), as
        ``tx.list_messages(conversation_id, through_sequence=..., turn_id=...)`` returns them, reading only what
        this worker has not kept yet. What was read joins the cache once ``tx`` commits."""
        kept = self._kept.get(conversation_id)
        rows: list[MessageRecord] = []
        if kept is not None:
            self._kept.move_to_end(conversation_id)
            # From the last kept message on: it must still be there with the same id (else: read whole).
            rows = await tx.list_messages(conversation_id, after_sequence=kept.last - 1)
            if rows and rows[0].sequence == kept.last and rows[0].id == kept.messages[-1].id:
                rows = rows[1:]
            else:
                self._forget(conversation_id)
                kept = None
        if kept is None:
            rows = await tx.list_messages(conversation_id)
        self.rows_read += len(rows)
        view, cut = _view(kept.messages if kept is not None else [], rows, through_sequence, turn_id)
        transcript = Transcript(view, kept.derived if kept is not None else {}, kept, cut)
        if not tx.connection.in_nested_transaction():  # a savepoint's rollback could take back what it read
            tx.after_commit(lambda: self._keep(conversation_id, kept, rows, transcript))
        return transcript

    async def _keep(
        self, conversation_id: str, base: _Kept | None, rows: list[MessageRecord], transcript: Transcript
    ) -> None:
        """Keep ``rows``, committed now, read after ``base`` (None: the conversation from its first message on)."""
        current = self._kept.get(conversation_id)
        if current is None:
            if base is not None or not rows:
                return  # forgotten meanwhile (evicted, or found stale): the next read starts afresh
            current = self._kept[conversation_id] = _Kept([])
            fresh = _contiguous(rows, rows[0].sequence - 1)
        else:
            # Whatever is kept now (another call may have extended or replaced it meanwhile): continue it.
            fresh = _contiguous(rows, current.last)
        self._size += current.extend(fresh, transcript.derived_here)
        transcript.known = current.derived  # what the call derives next is found there
        self._kept.move_to_end(conversation_id)
        while self._size > self.max_bytes and self._kept:
            self._forget(next(iter(self._kept)))

    def _forget(self, conversation_id: str) -> None:
        gone = self._kept.pop(conversation_id, None)
        if gone is not None:
            self._size -= gone.size


def _view(
    kept: list[MessageRecord], rows: list[MessageRecord], through_sequence: int, turn_id: str
) -> tuple[list[MessageRecord], int]:
    """The turn's messages out of the kept prefix and the rows read after it: those through ``through_sequence``
    (a slice of the kept ones, which are contiguous) and the turn's own after it; with how many of them are the kept
    prefix's first ones."""
    first = kept[0].sequence if kept else 0
    cut = max(0, min(len(kept), through_sequence - first + 1))
    view = kept[:cut]
    view.extend(m for m in kept[cut:] if m.turn_id == turn_id)
    view.extend(m for m in rows if m.sequence <= through_sequence or m.turn_id == turn_id)
    return view, cut
