"""Patch markers only where a history needs them: ``workflow.patched`` for one run, with its input's patch level.

A patch marker lets a run that began on older code replay on newer code. A run started by this release has no such
history, yet ``workflow.patched`` records a marker for it anyway, and the SDK pairs every marker with an upsert of
``TemporalChangeVersion`` (an event and a visibility write on the server): a new conversation's lane recorded six
of each in its first workflow task, and its turn one more (temporalio 1.35).

So a run's input says which code started it (``patch_level``, :data:`turnkit.payloads.PATCH_LEVEL` for runs started
now; 0 when decoded from the input of an older run). A run of level N takes every patch of the levels up to N as
applied, without asking and without a marker. Its replay reads the same input, so it decides the same way. A run of
level 0 asks ``workflow.patched`` as before, so the checked-in histories replay unchanged.

A patch added later belongs to no existing level: it is asked for as usual, and the next level lists it.
"""

from __future__ import annotations

from collections.abc import Mapping

from temporalio import workflow

__all__ = ["Patches"]


class Patches:
    """``workflow.patched`` for one run: the patches its level implies are applied without a marker."""

    def __init__(self, levels: Mapping[int, frozenset[str]], level: int) -> None:
        """``levels``: the patches each level added, for this workflow; ``level``: the run's input's patch level."""
        self._implied = frozenset[str]().union(*(patches for at, patches in levels.items() if at <= level))

    def __call__(self, patch_id: str) -> bool:
        """Whether this run takes the behaviour of ``patch_id`` (``workflow.patched``'s meaning)."""
        return patch_id in self._implied or workflow.patched(patch_id)
