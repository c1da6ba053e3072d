"""The workflow sandbox, without its per-payload re-entry (docs/design.md, "The sandbox, entered once per activation").

Temporal's ``SandboxedWorkflowRunner`` runs each activation inside the sandbox: one ``exec`` that installs the
restricted ``__import__``, ``sys.modules`` and builtins, then removes them. Around every activation the worker also
asks the workflow instance, for each payload sequence of the activation and of its completion and in each of the
converter's passes (decode, external storage, codec), which serialization context and which external-storage target
that payload belongs to. The sandboxed instance answers each question by entering the sandbox again, the same way:
about 60 entries per one-iteration turn, ~10 ms of a turn's ~65 ms of worker CPU (``python -m bench.cpu_profile``).

The answers are data the SDK computes from its own bookkeeping (the workflow's info and its pending activities,
children, signals and operations), with no workflow code, no import and no builtin involved. This runner asks the
instance that lives in the sandbox directly instead. The activations themselves, where workflow code runs, still
enter the sandbox as before.

It reaches into the SDK's sandbox runner (``workflow_sandbox._runner._Instance``, documented there as unstable), so it
checks at import what it relies on; when a temporalio release changes it, :data:`DIRECT_CONTEXTS` is False and the
SDK's own path is used unchanged (``tests/test_plugin.py`` fails then, so the loss is seen).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.worker import WorkflowInstance
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

try:
    from temporalio.worker.workflow_sandbox._runner import (
        _Instance as _SandboxInstance,  # pyright: ignore[reportPrivateUsage]
    )
except ImportError:  # pragma: no cover - a temporalio release without it: the SDK's path, unchanged
    _SandboxInstance = None

__all__ = ["DIRECT_CONTEXTS", "TurnKitSandboxRunner"]

#: The name under which the SDK's sandbox keeps its in-sandbox instance (``_runner._Instance._create_instance``).
_IN_SANDBOX = "__temporal_in_sandbox"

_Answering: type[WorkflowInstance] | None = None

if _SandboxInstance is not None and all(
    hasattr(_SandboxInstance, name)
    for name in ("get_serialization_context", "get_external_store_context", "_create_instance")
):

    class _AnsweringInstance(_SandboxInstance):
        """A sandboxed workflow instance that answers the converter's context questions without entering the sandbox."""

        _in_sandbox: Any = None

        def _create_instance(self) -> None:
            super()._create_instance()
            self._in_sandbox = self.globals_and_locals.get(_IN_SANDBOX)

        def get_serialization_context(self, command_info: Any) -> Any:
            if self._in_sandbox is None:
                return super().get_serialization_context(command_info)
            return self._in_sandbox.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: Any) -> Any:
            if self._in_sandbox is None:
                return super().get_external_store_context(command_info)
            return self._in_sandbox.get_external_store_context(command_info)

    _Answering = _AnsweringInstance

#: Whether this temporalio release has what the direct answers rely on.
DIRECT_CONTEXTS: bool = _Answering is not None


@dataclass(frozen=True)
class TurnKitSandboxRunner(SandboxedWorkflowRunner):
    """Temporal's sandboxed runner, whose instances answer the converter's per-payload questions directly.

    Workflow code runs in the sandbox exactly as with :class:`SandboxedWorkflowRunner` (same restrictions, same
    pass-through modules); only the SDK's own serialization-context lookups stay outside it.
    """

    def create_instance(self, det: Any) -> WorkflowInstance:
        """Implements :py:meth:`WorkflowRunner.create_instance`."""
        if _Answering is None:
            return super().create_instance(det)
        return _Answering(det, self.runner_class, self.restrictions)  # pyright: ignore[reportCallIssue]
