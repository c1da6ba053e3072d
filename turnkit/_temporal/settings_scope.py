"""A worker's own settings: every activity it runs reads the settings its plugin carries, over the process defaults.

Activities read ``settings.<knob>`` (the model call's client and timeouts, budgets, hooks); the plugin of a worker
built with ``TurnKitPlugin(store, settings={...})`` puts those overrides in scope for each activity it runs, so two
workers in one process can serve different applications (see :mod:`turnkit.config`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from turnkit.config import using_settings

__all__ = ["SettingsScope"]


class SettingsScope(Interceptor):
    """Runs each activity with ``overrides`` (checked by :func:`turnkit.config.settings_overrides`) in effect."""

    def __init__(self, overrides: Mapping[str, Any]) -> None:
        self._overrides = dict(overrides)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Scoped(next, self._overrides)


class _Scoped(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, overrides: Mapping[str, Any]) -> None:
        super().__init__(next)
        self._overrides = overrides

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        with using_settings(self._overrides):
            return await super().execute_activity(input)
