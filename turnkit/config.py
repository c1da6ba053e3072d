"""TurnKit settings (behaviour §9): the process's defaults, and the overrides a connection or a worker carries.

:func:`configure` changes the process's defaults and :func:`reset_settings` puts them back (for tests). A connection
(``turnkit.connect(settings={...})``) and a worker's plugin (``TurnKitPlugin(store, settings={...})``) carry settings
of their own, layered over those defaults: inside the connection's ``async with`` block, and in every activity the
plugin's worker runs, ``settings.<knob>`` reads the override where one is set and the process default otherwise. So
two workers in one process (two applications, two tenants) can run under different models, budgets or hooks.

Code reads ``settings.<knob>`` at the moment it needs a value, never copies it at import time, so that ``configure``
calls made after import, and the overrides in scope, still apply.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Generator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, cast

from turnkit._engine.compaction_options import normalize_compaction
from turnkit._engine.limits import check_limits
from turnkit._engine.prompt_sections import check_prompt_sections
from turnkit.kernel.errors import ConfigError
from turnkit.skills import check_skills

if TYPE_CHECKING:
    # Only for annotations: turnkit.cost imports this module, so a runtime import would be circular.
    from turnkit.cost import Cost
    from turnkit.model import Client, Usage

__all__ = [
    "TASK_QUEUE",
    "CostCalculator",
    "EventCallback",
    "Settings",
    "configure",
    "reset_settings",
    "settings",
    "settings_overrides",
    "using_settings",
]

#: The Temporal task queue TurnKit workflows and activities run on.
TASK_QUEUE: Final = "turnkit"

#: Receives each lifecycle event (behaviour §3.11).
EventCallback = Callable[[Any], Any]

#: ``(usage, model) -> Cost | dict | number | None`` (behaviour §6.5 rule 2).
CostCalculator = Callable[["Usage", "str | None"], "Cost | Mapping[str, Any] | float | int | None"]


@dataclass
class Settings:
    """The TurnKit configuration knobs used by the runtime (behaviour §9)."""

    default_model: str = "claude-sonnet-4-5"
    """Model used when neither the agent nor the conversation sets one."""

    client: Client | None = None
    """Default model client; an agent's own ``client`` wins."""

    max_iterations: int = 25
    """Model-phase entries allowed over a root tree (behaviour §6.1)."""

    timeout: float = 300.0
    """Seconds of wall time allowed since the root turn was submitted or started."""

    max_depth: int = 3
    """Deepest sub-agent level allowed; the root is depth 0."""

    max_tool_executions: int = 100
    """Tool executions allowed over a root tree."""

    max_tool_executions_by_name: dict[str, int | None] = field(default_factory=dict)
    """Per-tool-name execution limits over a root tree."""

    max_spend: float | None = None
    """Observed USD spend allowed over a root tree; None means no limit."""

    cost_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    """``model -> {input, output, cache_read, cache_write, thinking}`` in USD per million tokens."""

    cost_calculator: CostCalculator | None = None
    """Callable ``(usage, model)`` that prices a model call; see :func:`turnkit.cost.cost_from_usage`."""

    authorize: Callable[..., Any] | None = None
    """Authorization hook ``authorize(action, principal=..., **resources)`` (sync or ``async def``, or an object with
    such an ``.authorize``); must return literally ``True``, anything else (an exception included) denies. None allows
    everything (behaviour §7; see :mod:`turnkit._engine.authorization`)."""

    maintenance_batch_size: int = 100
    """Upper bound on rows handled by one maintenance pass (drain, reconcile, stale sweeps)."""

    lost_submit_grace: float | None = 10.0
    """Seconds after which a worker takes a submitted root turn of its task queue that has no workflow and no place in
    its lane (its submission was lost with its caller, worker and server) and submits it to its lane again; workers
    search about twice as often. None: workers do not search (``turnkit repair`` still queues such a turn; see
    docs/design.md, "Lost submissions")."""

    on_event: EventCallback | list[EventCallback] | tuple[EventCallback, ...] | None = None
    """Event callback(s) (sync or ``async def``), called with each :class:`turnkit.events.Event` after its write
    committed (behaviour §3.11); sync ones run in a thread; exceptions are logged (see :mod:`turnkit.events`)."""

    model_timeout: float = 300.0
    """Seconds one model request may take (the ``turnkit.model`` activity's start-to-close timeout)."""

    model_heartbeat_timeout: float = 30.0
    """Seconds without a heartbeat after which a model call's worker is presumed dead and the call retried."""

    model_max_attempts: int = 5
    """Attempts per model request (transient errors); ``ModelError`` and ``ConfigError`` are never retried."""

    model_local_activity: bool = False
    """Run each model request's first attempt as a local activity, in the worker that runs its turn (what the OpenAI
    Agents integration calls ``use_local_activity``): an iteration with a local tool then costs one workflow task, and
    each model call three history events fewer. The attempt has no heartbeat and holds the turn's workflow task (a
    cancel or steer reaches the turn when the call returns, or at the SDK's task heartbeat, ~8 s); its retries run as
    regular ``turnkit.model`` activities. For fast models; read by the process that creates each turn (docs/design.md,
    "Local model calls")."""

    stream_model_calls: bool = True
    """Stream each turn's main model calls (the providers' streaming APIs) and publish their text and thinking deltas
    to the turn's watchers (``Turn.stream()``, :mod:`turnkit.streaming`): across processes on PostgreSQL, within the
    process on SQLite. The committed response is the same either way. Read by the worker that makes the call."""

    tool_heartbeat_timeout: float = 30.0
    """Upper bound on a tool call's heartbeat timeout (a dead worker is noticed after this long)."""

    max_input_bytes: int | None = 256 * 1024
    """Largest input accepted at the API, in UTF-8 bytes per field (ask/say/post text, metadata, context); checked
    before anything is sent, well below Temporal's 2 MB payload limit. None disables the check (issue 8 item 12)."""

    search_attributes: bool = True
    """Start lanes and turns with TurnKit's search attributes (:mod:`turnkit.kernel.search_attributes`) and have
    workers check at start-up that the namespace has them. False: no attributes (for a namespace where they cannot be
    registered); workflows started without them never set any."""

    validate_models: bool = False
    """Validate every registered agent's client and model when a worker starts (``client.validate(model=...)``: one
    cheap provider call each); a missing key or unknown model stops the start with a ``ModelAccessError`` naming it.
    Off by default, so that offline workers do not call out; agents defined with ``validate=True`` are validated
    either way (:mod:`turnkit.model_access`). ``turnkit worker --validate-models`` turns it on."""

    direct_first_turns: bool = True
    """``ask`` starts a fresh conversation's first turn itself, without the conversation's lane (one workflow start
    instead of the lane's start, update and workflow task; :mod:`turnkit._engine.direct_turn`). False: every turn goes
    through the lane (``direct_idle_turns`` too)."""

    direct_idle_turns: bool = True
    """With ``direct_first_turns``: ``ask`` also starts a conversation's next turn itself when none of its turns is
    unfinished (the previous one has ended and nothing is queued), so a conversation that goes on costs what a fresh
    one does. False: only a fresh conversation's first turn skips the lane."""

    compaction: bool | dict[str, Any] = True
    """Context compaction (behaviour §3.10): True (the defaults), False (disabled) or a mapping of options from
    :data:`turnkit._engine.compaction.DEFAULTS`; an agent's ``compaction`` is merged over it."""

    prompt_sections: tuple[str, ...] | list[str] | None = None
    """The system prompt's section list in ``full`` mode when the agent sets none; None means
    :data:`turnkit.prompt.DEFAULT_SECTIONS` (see docs/design.md, "The system prompt")."""

    prompt_behavior: str | None = None
    """Replaces the text of the prompt's ``behavior`` section in every mode; None keeps TurnKit's."""

    prompt_data_max_chars: int = 20_000
    """Characters kept of each subject or live-context block; longer ones are truncated."""

    context_contributors: list[Any] = field(default_factory=list)
    """Callables that add live context to root prompts; copied into each agent at construction (in front of the
    agent's own) unless the agent says ``inherit_globals=False``."""

    available_skills: list[Any] = field(default_factory=list)
    """:class:`~turnkit.skills.Skill` objects every agent lists as loadable: copied into each agent at construction (in
    front of its own ``available_skills``, de-duplicated by key) unless it says ``inherit_globals=False``."""

    output_policy_model: str | None = None
    """Default judge model of file-based output policies (behaviour §3.9); None: the turn's model."""

    output_policy_thinking: dict[str, Any] | None = field(default_factory=lambda: {"effort": "low"})
    """Default thinking of output-policy judge calls."""


#: The process's defaults. Mutated through :func:`configure` only.
_defaults: Final = Settings()

_FIELD_NAMES: Final = frozenset(f.name for f in dataclasses.fields(Settings))

#: The overrides in scope: a connection's inside its ``async with`` block, a worker plugin's in its activities.
_overrides: ContextVar[Mapping[str, Any]] = ContextVar("turnkit_settings", default=MappingProxyType({}))


class _Effective:
    """The settings as code in scope sees them: an override where one is set, the process default otherwise."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        overrides = _overrides.get()
        if name in overrides:
            return overrides[name]
        return getattr(_defaults, name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"settings are read-only: use turnkit.configure({name}=...) or a connection's settings")

    def __repr__(self) -> str:
        return f"Settings({', '.join(f'{n}={getattr(self, n)!r}' for n in sorted(_FIELD_NAMES))})"


#: The settings in effect: read ``settings.<knob>`` where a value is needed.
settings: Final = cast(Settings, _Effective())


def configure(**kwargs: Any) -> Settings:
    """Set TurnKit settings.

    Example:
        ``configure(client=MyClient(), max_spend=2.0)``

    Args:
        **kwargs: Setting names and their new values.

    Returns:
        The settings in effect (:data:`settings`).

    Raises:
        ConfigError: A name is not a known setting (``"unknown setting: x"``), ``compaction`` is invalid, or a budget
            limit is one a turn cannot run under (negative; zero ``max_iterations`` or ``timeout``).
            Nothing is changed in that case.
    """
    for key, value in settings_overrides(kwargs).items():
        setattr(_defaults, key, value)
    return settings


def settings_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` checked and normalised as :func:`configure` checks them, changing nothing: what a connection or a
    plugin carries. Raises :class:`~turnkit.kernel.errors.ConfigError` as ``configure`` does."""
    # Check every name before using any, so a typo never leaves the settings half-applied.
    kwargs = dict(values)
    for key in kwargs:
        if key not in _FIELD_NAMES:
            raise ConfigError(f"unknown setting: {key}")
    check_limits(kwargs)  # zero or negative budgets are refused before any setting changes
    grace = kwargs.get("lost_submit_grace")
    if grace is not None and (isinstance(grace, bool) or not isinstance(grace, int | float) or grace <= 0):
        raise ConfigError(f"lost_submit_grace must be a positive number of seconds or None, not {grace!r}")
    _check_prompt_settings(kwargs)
    if "compaction" in kwargs:
        normalized = normalize_compaction(kwargs["compaction"])
        kwargs["compaction"] = True if normalized is None else normalized
    value = kwargs.get("max_tool_executions_by_name")
    if isinstance(value, Mapping):
        # The spec stringifies these keys; tool names are strings everywhere else.
        by_name = {str(name): limit for name, limit in value.items()}  # pyright: ignore[reportUnknownVariableType]
        kwargs["max_tool_executions_by_name"] = by_name
    return kwargs


@contextmanager
def using_settings(overrides: Mapping[str, Any]) -> Generator[None]:
    """Read ``overrides`` (checked by :func:`settings_overrides`) over the settings in effect, in this context:
    the code run inside, and the tasks it starts. Nested scopes layer, the innermost winning."""
    if not overrides:
        yield
        return
    token = _overrides.set({**_overrides.get(), **overrides})
    try:
        yield
    finally:
        _overrides.reset(token)


def _check_prompt_settings(kwargs: dict[str, Any]) -> None:
    """Refuse prompt settings no prompt can be built with, before any setting changes."""
    sections = kwargs.get("prompt_sections")
    if sections is not None:
        try:
            kwargs["prompt_sections"] = check_prompt_sections(sections)
        except (TypeError, ValueError) as err:
            raise ConfigError(str(err)) from err
    if "prompt_data_max_chars" in kwargs:
        limit = kwargs["prompt_data_max_chars"]
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
            raise ConfigError(f"prompt_data_max_chars must be an integer >= 0, not {limit!r}")
    contributors = kwargs.get("context_contributors")
    if contributors is not None:
        if isinstance(contributors, str | bytes) or not all(callable(each) for each in contributors):
            raise ConfigError("context_contributors must be a list of callables")
        kwargs["context_contributors"] = list(contributors)
    skills = kwargs.get("available_skills")
    if skills is not None:
        try:
            kwargs["available_skills"] = list(check_skills(skills, "available_skills"))
        except TypeError as err:
            raise ConfigError(str(err)) from err
    behavior = kwargs.get("prompt_behavior")
    if behavior is not None and not isinstance(behavior, str):
        raise ConfigError("prompt_behavior must be a string or None")


def reset_settings() -> Settings:
    """Restore every process default (for tests).

    The same :data:`settings` object is kept, so modules that imported it see the reset.

    Returns:
        The settings in effect (:data:`settings`).
    """
    defaults = Settings()
    for name in _FIELD_NAMES:
        setattr(_defaults, name, getattr(defaults, name))
    return settings
