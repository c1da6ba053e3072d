"""Tools: functions the model may call (behaviour §4.1 and §3.8).

Two ways to define one:

* subclass :class:`Tool`, declare the parameters as a nested pydantic ``Arguments`` model and implement ``call``::

      class SaveReport(Tool):
          description = "Save the final report."
          terminal = "Report saved."

          class Arguments(BaseModel):
              title: str = Field(description="Report title")

          def call(self, context: ToolContext, *, title: str) -> dict[str, str]:
              return {"id": save(title, key=context.idempotency_key)}

* decorate a typed function with :func:`tool`; the parameters become the schema and the docstring the
  description::

      @tool(recovery="replay_safe")
      async def lookup(query: str, limit: int = 5) -> list[str]:
          '''Search the catalogue.

          Args:
              query: What to search for.
              limit: Maximum number of hits.
          '''

A tool body that raises :class:`turnkit.kernel.errors.ToolError` fails its execution on purpose: the model sees the
message and the turn continues. A returned mapping that contains ``"error"`` is still a *successful* result. Other
exceptions are crashes in background turns (behaviour §3.8 step 12).
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Final, Generic, Literal, ParamSpec, TypeVar, overload

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo

from turnkit.kernel.errors import Error, ToolValidationError
from turnkit.model import ToolSpec
from turnkit.store.storable import UnstorableValue, storable

if typing.TYPE_CHECKING:
    from turnkit._engine.tool_store import ToolStore
    from turnkit.kernel.records import MessageRecord

__all__ = [
    "RECOVERY_MODES",
    "RESERVED_PARAMETER",
    "TOOLS_TYPE_ERROR",
    "FunctionTool",
    "Recovery",
    "Terminal",
    "Tool",
    "ToolContext",
    "as_tool",
    "check_task_queue",
    "is_valid_tool_name",
    "normalize_result",
    "tool",
]

#: At-most-once tools run a single attempt; replay-safe tools may be retried with the same idempotency key.
Recovery = Literal["at_most_once", "replay_safe"]
RECOVERY_MODES: Final[tuple[Recovery, ...]] = ("at_most_once", "replay_safe")
#: The gem's name for the at-most-once mode; accepted as an alias.
_RECOVERY_ALIASES: Final = {"unknown": "at_most_once"}

#: ``False`` (an ordinary tool), ``True`` (ends the turn), a completion message, or a callable building the
#: completion message from the result (behaviour §3.8).
Terminal = bool | str | Callable[[dict[str, Any]], "str | None"]

RESERVED_PARAMETER: Final = "context"
TOOLS_TYPE_ERROR: Final = "tools must be TurnKit tools (Tool instances, Tool subclasses or @tool functions)"

_NAME_RE: Final = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_ARGS_SECTION_RE: Final = re.compile(r"(Args|Arguments|Parameters|Params)\s*:")
_SECTION_RE: Final = re.compile(r"[A-Z][A-Za-z ]*:")
_ARG_LINE_RE: Final = re.compile(r"\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)")
# Keys whose values are JSON data, not schemas: never rewrite them.
_SCHEMA_DATA_KEYS: Final = frozenset({"default", "enum", "const", "examples"})
# Keys whose values map names to schemas: the names are data (a property may be called "title").
_SCHEMA_MAP_KEYS: Final = frozenset({"properties", "patternProperties", "$defs", "definitions"})

P = ParamSpec("P")
R = TypeVar("R")


def is_valid_tool_name(name: str) -> bool:
    """True when ``name`` is a valid tool or parameter name (``[a-zA-Z_][a-zA-Z0-9_]*``)."""
    return _NAME_RE.fullmatch(name) is not None


def _snake_case(name: str) -> str:
    # Same rule as Ruby's String#underscore: "SaveReport" -> "save_report", "HTTPFetch" -> "http_fetch".
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name)
    return name.replace("-", "_").lower()


def _camel_case(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in name.split("_") if part) or "Function"


@dataclass(frozen=True, kw_only=True)
class ToolContext:
    """What a tool body knows about the call it is serving.

    ``idempotency_key`` is ``"turnkit:tool:<execution_id>"``: the same on every attempt of one execution, so a
    replay-safe tool can pass it to the systems it writes to and a retried attempt has no second effect.
    """

    turn_id: str
    conversation_id: str
    root_turn_id: str
    execution_id: str
    tool_call_id: str
    principal: Any = None
    """The authenticated principal persisted on the turn (never supplied by the model)."""
    agent_name: str = ""
    attempt: int = 1
    """1 for the first attempt; higher when a replay-safe tool is retried."""
    idempotency_key: str = ""
    """Derived from ``execution_id`` when not given; a given value must equal the derived one."""
    store: ToolStore | None = dataclasses.field(default=None, repr=False, compare=False)
    """The record as this call may read and change it (None outside a worker): reads pass through, and every write
    (``say``, ``append_message``, ``deliver``, ``put_media``) is fenced by this call's execution and raises
    :class:`~turnkit.kernel.errors.LostClaim` once the call was completed, failed, cancelled or interrupted, or its
    turn ended (behaviour §5.4). It is never the worker's store itself."""
    context: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The run's context (the ``context=`` of ``ask``/``run``, else the conversation's): a copy, so changing it
    changes nothing stored. Sub-agents' turns get an empty one (they get the task only)."""
    subject: dict[str, Any] | None = None
    """The conversation's subject reference ``{type, id}``, when it has one."""
    subject_prompt: str = ""
    """The subject's text snapshotted when the conversation was created (``""`` when none)."""

    async def say(
        self, text: str, *, metadata: Mapping[str, Any] | None = None, key: str | None = None
    ) -> MessageRecord:
        """Append a user message to this turn's conversation, fenced by this call (behaviour §5.4):
        ``context.store.say``.

        The write commits only while the call's execution is still open (pending or running) and its turn has not
        ended, checked under the root turn's lock, which cancellation takes too: a tool that goes on after its turn
        was cancelled, or after its execution was interrupted, cannot write into the conversation. A retried attempt
        that says the same things in the same order (or with the same ``key``) writes nothing twice.

        Raises:
            LostClaim: The execution is no longer open; nothing was written.
        """
        if self.store is None:
            raise Error("ToolContext.say needs the worker's store (this context was built outside a worker)")
        return await self.store.say(text, metadata=metadata, key=key)

    def __post_init__(self) -> None:
        """Derive (or check) the idempotency key from the execution id."""
        # It must never disagree with the execution record (behaviour §2.5): replay-safe tools rely on it being stable.
        expected = f"turnkit:tool:{self.execution_id}"
        if not self.idempotency_key:
            object.__setattr__(self, "idempotency_key", expected)
        elif self.idempotency_key != expected:
            raise ValueError(f"idempotency_key must be {expected!r}")


def _jsonable(value: Any) -> Any:
    # fallback=str keeps odd objects (paths, custom classes) from failing a tool that already ran.
    return pydantic_core.to_jsonable_python(value, fallback=str)


def normalize_result(value: Any) -> dict[str, Any]:
    """Normalise a tool's return value into the stored result payload (behaviour §3.8 step 11).

    * a mapping becomes a JSON-compatible dict with string keys (a dict holding ``"error"`` is still a success);
    * a list or tuple becomes ``{"items": [...]}``;
    * a pydantic model becomes ``model_dump(mode="json")``, and a dataclass instance its fields;
    * anything else becomes ``{"result": str(value)}``, the Python counterpart of the gem's ``to_s``; so ``None``
      gives ``{"result": "None"}`` and a string is kept as-is.

    The payload is storable on every backend alike (issue 8 item 11): NaN and infinities become ``null``, NUL and lone
    surrogates in strings become U+FFFD.

    Args:
        value: What the tool returned.

    Returns:
        The JSON-compatible payload.

    Raises:
        UnstorableValue: The value cannot be serialised at all (it is circular); retrying the tool cannot help.
    """
    try:
        return storable(_normalize(value))
    except (ValueError, RecursionError) as err:
        if isinstance(err, UnstorableValue):
            raise
        raise UnstorableValue(f"the tool result cannot be stored: {_short_reason(err)}") from None


def _normalize(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return {"items": _jsonable(list(value))}  # pyright: ignore[reportUnknownArgumentType]
    return {"result": str(value)}


def _short_reason(err: BaseException) -> str:
    text = str(err)
    if "ircular" in text:
        return "it is circular (it contains itself)"
    if isinstance(err, RecursionError) or "recursion" in text.lower():
        return "it is nested too deeply"
    return f"{type(err).__name__}: {text[:200]}"


class _NoArguments(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_declarations(cls: type[Tool]) -> None:
    """Definition-time checks shared by class creation and :meth:`Tool.validate_definition`."""
    if not is_valid_tool_name(cls.name):
        raise ValueError(f"invalid tool name: {cls.name!r} (must match [a-zA-Z_][a-zA-Z0-9_]*)")
    if cls.recovery not in RECOVERY_MODES:
        raise ValueError(f"unknown recovery mode for tool {cls.name}: {cls.recovery!r}")
    check_task_queue(cls.name, cls.task_queue)
    if cls.local and cls.task_queue is not None:
        raise ValueError(
            f"tool {cls.name}: a local tool runs in the worker that runs its turn, so it cannot have a task_queue "
            f"({cls.task_queue!r})"
        )
    arguments = cls.Arguments
    if not (isinstance(arguments, type) and issubclass(arguments, BaseModel)):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ValueError(f"tool {cls.name}: Arguments must be a pydantic BaseModel subclass")
    for field_name, info in arguments.model_fields.items():
        external = info.alias or field_name
        if RESERVED_PARAMETER in (field_name, external):
            raise ValueError("context is a reserved parameter name")
        if not is_valid_tool_name(external):
            raise ValueError(f"tool {cls.name}: invalid parameter name {external!r}")


def check_task_queue(tool_name: str, task_queue: object) -> None:
    """Check a tool's ``task_queue``: None (the turn's own queue) or a non-empty name without surrounding spaces.

    A name nobody serves would leave every call of the tool waiting for its timeout, so a typo must fail when the tool
    is defined or registered, not when the model first calls it.

    Raises:
        ValueError: ``"tool <name>: task_queue must be a non-empty string (or None for the turn's own queue), not …"``.
    """
    if task_queue is None:
        return
    if not isinstance(task_queue, str) or not task_queue.strip() or task_queue != task_queue.strip():
        raise ValueError(
            f"tool {tool_name}: task_queue must be a non-empty string (or None for the turn's own queue), "
            f"not {task_queue!r}"
        )


class Tool:
    """Base class of TurnKit tools.

    Declarations are class attributes; instances carry dependencies (pass them to your ``__init__``) and delegate
    the declarations to their class. Subclasses implement ``call(self, context, **arguments)``, sync or async; it
    receives the validated arguments as keywords plus ``context=`` (a :class:`ToolContext`).
    """

    name: ClassVar[str] = "tool"
    """Tool name shown to the model; defaults to the class name in snake case (``SaveReport`` → ``save_report``)."""
    description: ClassVar[str] = ""
    usage_hint: ClassVar[str] = ""
    """Rendered as "Use when:" in the system prompt."""
    recovery: ClassVar[Recovery] = "at_most_once"
    """``"at_most_once"`` (the gem's ``:unknown``, also accepted) or ``"replay_safe"``."""
    timeout: ClassVar[float] = 60.0
    """Seconds one attempt may take (start-to-close)."""
    max_attempts: ClassVar[int] = 5
    """Attempts for replay-safe tools; at-most-once tools always get exactly one."""
    initial_retry_interval: ClassVar[float] = 1.0
    maximum_retry_interval: ClassVar[float] = 30.0
    task_queue: ClassVar[str | None] = None
    """The Temporal task queue this tool's activity runs on (a box with a GPU, or with credentials), served by
    ``worker.py --queue NAME --only tools``; None: the turn's own queue."""
    local: ClassVar[bool] = False
    """Run each call as a Temporal *local* activity, in the worker that runs the turn's workflow task, instead of an
    activity task of its own: one workflow task fewer per call (its result and the next model call are in one task),
    which is ~50 ms on a default dev server. For quick tools (a lookup, a calculation, a store read): a local call has
    no heartbeat and holds the turn's workflow task while it runs, so a cancel reaches the turn when the call returns
    (or every ~8 s). Its first attempt runs locally; should it fail, a replay-safe tool's remaining attempts run as a
    regular activity, and an at-most-once tool's call is settled as any lost attempt is. Cannot be combined with
    ``task_queue``. docs/design.md, "Local tool calls"."""
    terminal: ClassVar[Terminal] = False
    """Whether a completed call ends the turn, and with which completion message (behaviour §3.8)."""
    read_only: ClassVar[bool] = False
    """True for a tool with no effect outside TurnKit (the specialists accept only such tools, behaviour §1.8)."""
    Arguments: ClassVar[type[BaseModel]] = _NoArguments
    """The parameters, as a pydantic model; subclasses declare ``class Arguments(BaseModel): ...``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Fill in the default name and check the declarations when a tool class is defined."""
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:
            cls.name = _snake_case(cls.__name__)
        alias = _RECOVERY_ALIASES.get(str(cls.recovery))
        if alias is not None:
            cls.recovery = alias  # pyright: ignore[reportAttributeAccessIssue]
        terminal = cls.__dict__.get("terminal")
        if inspect.isfunction(terminal):
            # A plain function stored on the class would become a bound method on instances.
            cls.terminal = staticmethod(terminal)  # pyright: ignore[reportAttributeAccessIssue]
        _check_declarations(cls)

    @property
    def reads_context(self) -> bool:
        """Whether ``call`` receives the :class:`ToolContext`: always for a subclass; for a function tool, only with a
        ``ToolContext`` parameter. The tool activity reads what only the context shows (the conversation's subject)
        only then."""
        return True

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the tool. Subclasses override this (sync or ``async def``).

        Args:
            *args: Unused; arguments are passed as keywords.
            **kwargs: ``context`` (a :class:`ToolContext`) and the validated arguments.

        Returns:
            Anything :func:`normalize_result` accepts.
        """
        raise NotImplementedError(f"tool {self.name} does not implement call")

    # -- declarations -------------------------------------------------------------------------------------------

    def _terminal(self) -> Terminal:
        # Read through the class: a callable is stored as a staticmethod and must not bind to the instance.
        value: Terminal = type(self).terminal
        return value

    @property
    def is_terminal(self) -> bool:
        """True when a completed call of this tool ends the turn."""
        terminal = self._terminal()
        # Anything but a bool is a message or a message builder, which marks the tool terminal too.
        return terminal if isinstance(terminal, bool) else True

    @property
    def effective_max_attempts(self) -> int:
        """Attempts the runtime may make: ``max_attempts`` for replay-safe tools, else exactly one."""
        return self.max_attempts if self.recovery == "replay_safe" else 1

    def input_schema(self) -> dict[str, Any]:
        """The JSON schema of the arguments: ``{"type": "object", "properties": {...}, "required": [...]}``.

        Titles are dropped and local ``$ref`` s are inlined, because several providers reject or ignore them.
        """
        return copy.deepcopy(_schema_for(self.Arguments))

    def spec(self) -> ToolSpec:
        """The tool as the model sees it."""
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters=self.input_schema(),
            usage_hint=self.usage_hint,
            terminal=self.is_terminal,
        )

    def completion_message(self, result: Mapping[str, Any]) -> str:
        """The output text of a turn ended by this (terminal) tool (behaviour §3.8).

        The declared message if ``terminal`` is a string, or the callable's answer; failing that
        ``result["result"]``; failing that ``"Completed via <name>."``.

        Args:
            result: The normalised result of the completed call.

        Returns:
            The completion message.
        """
        terminal = self._terminal()
        message: Any = None
        if isinstance(terminal, str):
            message = terminal
        elif not isinstance(terminal, bool):
            message = terminal(dict(result))
        if message is not None and str(message) != "":
            return str(message)
        fallback = result.get("result")
        if fallback is not None and str(fallback) != "":
            return str(fallback)
        return f"Completed via {self.name}."

    def validate_definition(self) -> None:
        """Check the whole definition: name, recovery, limits, parameters, schema, defaults and ``call``.

        Raises:
            ValueError: The definition is invalid.
        """
        _check_declarations(type(self))
        if self.timeout <= 0:
            raise ValueError(f"tool {self.name}: timeout must be positive")
        if self.max_attempts < 1:
            raise ValueError(f"tool {self.name}: max_attempts must be at least 1")
        if type(self).call is Tool.call:
            raise ValueError(f"tool {self.name} must implement call")
        try:
            _schema_for(self.Arguments)
        except Exception as exc:
            raise ValueError(f"tool {self.name}: cannot build a JSON schema for its arguments: {exc}") from exc
        for field_name, info in self.Arguments.model_fields.items():
            if info.is_required() or info.default is None or info.default_factory is not None:
                continue
            annotation: Any = Annotated[info.annotation, *info.metadata] if info.metadata else info.annotation
            try:
                TypeAdapter(annotation).validate_python(info.default)
            except ValidationError as exc:
                raise ValueError(f"tool {self.name}: invalid default for parameter {field_name}: {exc}") from exc

    # -- arguments and invocation --------------------------------------------------------------------------------

    def _parse_arguments(self, arguments: Any) -> BaseModel:
        if not isinstance(arguments, Mapping):
            raise ToolValidationError("arguments must be an object")
        data = {str(k): v for k, v in arguments.items()}  # pyright: ignore[reportUnknownVariableType]
        fields = self.Arguments.model_fields
        external = {(info.alias or name): info for name, info in fields.items()}
        unknown = [key for key in data if key not in external]
        if unknown:
            raise ToolValidationError(f"unknown argument(s): {', '.join(unknown)}")
        for key, info in external.items():
            if info.is_required() and key not in data:
                raise ToolValidationError(f"missing required argument: {key}")
        # The spec accepts null for optional parameters: treat it as absent so the default applies, instead of
        # failing `limit: int = 5` when a model sends {"limit": null}.
        data = {k: v for k, v in data.items() if v is not None or external[k].is_required()}
        try:
            return self.Arguments.model_validate(data)
        except ValidationError as exc:
            raise ToolValidationError(_describe_validation_error(exc)) from None

    def validate_arguments(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Validate the model's arguments (behaviour §4.1).

        Args:
            arguments: The arguments as proposed by the model.

        Returns:
            The normalised, JSON-compatible arguments with defaults filled in.

        Raises:
            ToolValidationError: ``"unknown argument(s): a, b"``, ``"missing required argument: x"``, or a message
                naming each invalid field.
        """
        return self._parse_arguments(arguments).model_dump(mode="json", by_alias=True)

    def _call_is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.call)

    async def invoke(self, arguments: Mapping[str, Any], context: ToolContext) -> dict[str, Any]:
        """Validate the arguments, run the tool and normalise its result.

        Sync ``call`` implementations run in a worker thread so they cannot block the event loop.

        Args:
            arguments: The model's arguments.
            context: The call's context.

        Returns:
            The normalised result payload.

        Raises:
            ToolValidationError: The arguments are invalid; the tool was not called.
        """
        parsed = self._parse_arguments(arguments)
        # Pass the validated, typed values (nested models, enums, dates), not their JSON dump.
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        if self._call_is_async():
            value = await self.call(context=context, **kwargs)
        else:
            value = await asyncio.to_thread(functools.partial(self.call, context=context, **kwargs))
            if inspect.isawaitable(value):
                value = await value
        return normalize_result(value)

    def __repr__(self) -> str:
        """Show the tool's name."""
        return f"<{type(self).__name__} tool {self.name!r}>"


def _describe_validation_error(exc: ValidationError) -> str:
    messages: list[str] = []
    for error in exc.errors(include_url=False):
        location = ".".join(str(part) for part in error["loc"])
        messages.append(f"invalid argument {location}: {error['msg']}" if location else str(error["msg"]))
    return "; ".join(messages)


# -- JSON schema ---------------------------------------------------------------------------------------------------


@functools.cache
def _schema_for(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema()
    defs: dict[str, Any] = raw.get("$defs", {})
    kept_defs: set[str] = set()
    cleaned = _clean_schema(raw, defs, (), kept_defs)
    schema: dict[str, Any] = {
        "type": "object",
        "properties": cleaned.get("properties", {}),
        "required": list(cleaned.get("required", [])),
    }
    if kept_defs:
        # Only recursive models keep references; ship the definitions they need.
        schema["$defs"] = {name: _clean_schema(defs[name], defs, (name,), kept_defs) for name in sorted(kept_defs)}
    return schema


def _clean_schema(node: Any, defs: Mapping[str, Any], stack: tuple[str, ...], kept: set[str]) -> Any:
    if isinstance(node, list):
        return [_clean_schema(item, defs, stack, kept) for item in node]  # pyright: ignore[reportUnknownVariableType]
    if not isinstance(node, dict):
        return node
    schema: dict[str, Any] = node  # pyright: ignore[reportUnknownVariableType]
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/"):
        target = ref.removeprefix("#/$defs/")
        if target in stack or target not in defs:
            kept.add(target)
            return {k: _clean_schema(v, defs, stack, kept) for k, v in schema.items() if k != "title"}
        resolved = _clean_schema(defs[target], defs, (*stack, target), kept)
        # Keys beside the $ref (description, default) refine the referenced schema.
        siblings = {k: v for k, v in schema.items() if k not in ("$ref", "title")}
        return {**resolved, **_clean_schema(siblings, defs, stack, kept)}
    cleaned: dict[str, Any] = {}
    for key, value in schema.items():
        if key in ("title", "$defs"):
            continue
        if key in _SCHEMA_DATA_KEYS:
            cleaned[key] = value
        elif key in _SCHEMA_MAP_KEYS and isinstance(value, dict):
            cleaned[key] = {k: _clean_schema(v, defs, stack, kept) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
        else:
            cleaned[key] = _clean_schema(value, defs, stack, kept)
    return cleaned


# -- @tool ---------------------------------------------------------------------------------------------------------


class FunctionTool(Tool, Generic[P, R]):
    """A tool built by :func:`tool` from a plain function.

    It is still callable like the function (``lookup("x")``), so the function can be unit tested directly.
    """

    # Copied from the function by functools.update_wrapper; declared so type checkers know about them.
    __name__: str
    __wrapped__: Callable[P, R]

    def __init__(self, fn: Callable[P, R], context_parameter: str | None) -> None:
        """Wrap ``fn``.

        Args:
            fn: The function.
            context_parameter: The name of the parameter that receives the :class:`ToolContext`, if any.
        """
        self._fn = fn
        self._context_parameter = context_parameter
        functools.update_wrapper(self, fn)

    @property
    def function(self) -> Callable[P, R]:
        """The wrapped function."""
        return self._fn

    @property
    def reads_context(self) -> bool:
        """Whether the function takes a :class:`ToolContext` parameter."""
        return self._context_parameter is not None

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """See base class."""
        context = kwargs.pop("context")
        if self._context_parameter is not None:
            kwargs[self._context_parameter] = context
        return self._fn(*args, **kwargs)  # pyright: ignore[reportCallIssue]

    def _call_is_async(self) -> bool:
        return inspect.iscoroutinefunction(self._fn)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the original function."""
        return self._fn(*args, **kwargs)


def _is_context_annotation(annotation: Any) -> bool:
    if annotation is ToolContext:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _is_context_annotation(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return any(arg is ToolContext for arg in typing.get_args(annotation))
    return False


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its first paragraph and its ``Args:`` descriptions."""
    lines = doc.splitlines()
    summary: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_RE.fullmatch(line.strip()):
            break
        summary.append(line.strip())
    descriptions: dict[str, str] = {}
    in_args = False
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if not in_args:
            in_args = indent == 0 and _ARGS_SECTION_RE.fullmatch(stripped) is not None
            continue
        if not stripped:
            continue
        if indent == 0:
            break  # the next section ("Returns:", ...) or plain text ends Args
        if entry_indent is None:
            entry_indent = indent
        match = _ARG_LINE_RE.fullmatch(stripped) if indent <= entry_indent else None
        if match is not None:
            current = str(match.group(1))
            descriptions[current] = str(match.group(2)).strip()
        elif current is not None:
            descriptions[current] = f"{descriptions[current]} {stripped}".strip()
    return " ".join(summary), descriptions


def _build_function_tool(
    fn: Callable[P, R],
    *,
    name: str | None,
    description: str | None,
    recovery: str,
    timeout: float,
    max_attempts: int,
    terminal: Terminal,
    usage_hint: str,
    initial_retry_interval: float,
    maximum_retry_interval: float,
    task_queue: str | None,
    local: bool,
) -> FunctionTool[P, R]:
    if isinstance(fn, Tool) or not callable(fn):
        raise TypeError("@tool decorates plain functions")
    tool_name = name or getattr(fn, "__name__", "")
    summary, argument_docs = _parse_docstring(inspect.getdoc(fn) or "")
    hints = typing.get_type_hints(fn, include_extras=True)
    fields: dict[str, Any] = {}
    context_parameter: str | None = None
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ValueError(f"tool {tool_name}: *args and **kwargs parameters are not supported")
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ValueError(f"tool {tool_name}: positional-only parameter {parameter.name} is not supported")
        annotation = hints.get(parameter.name, Any)
        if _is_context_annotation(annotation):
            if context_parameter is not None:
                raise ValueError(f"tool {tool_name}: only one parameter may take the ToolContext")
            context_parameter = parameter.name
            continue
        if parameter.name == RESERVED_PARAMETER:
            raise ValueError("context is a reserved parameter name")
        doc = argument_docs.get(parameter.name)
        # Pass a description only when the docstring has one: an explicit None would override a description
        # given through Annotated[..., Field(description=...)].
        extra: dict[str, Any] = {} if doc is None else {"description": doc}
        default = parameter.default
        if isinstance(default, FieldInfo):
            info = copy.copy(default)
            if info.description is None:
                info.description = doc
        elif default is inspect.Parameter.empty:
            info = Field(**extra)
        else:
            info = Field(default=default, **extra)
        fields[parameter.name] = (annotation, info)
    arguments_model = create_model(
        f"{_camel_case(tool_name)}Arguments",
        __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False),
        **fields,
    )
    namespace: dict[str, Any] = {
        "name": tool_name,
        "description": summary if description is None else description,
        "usage_hint": usage_hint,
        "recovery": recovery,
        "timeout": timeout,
        "max_attempts": max_attempts,
        "initial_retry_interval": initial_retry_interval,
        "maximum_retry_interval": maximum_retry_interval,
        "task_queue": task_queue,
        "local": local,
        "terminal": terminal,
        "Arguments": arguments_model,
        "__module__": getattr(fn, "__module__", __name__),
    }
    # One class per function keeps every declaration class-level, exactly like hand-written Tool subclasses.
    cls = typing.cast(
        "type[FunctionTool[P, R]]",
        type(f"{_camel_case(tool_name)}Tool", (FunctionTool,), namespace),
    )
    return cls(fn, context_parameter)


@overload
def tool(fn: Callable[P, R], /) -> FunctionTool[P, R]: ...


@overload
def tool(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    recovery: Recovery | Literal["unknown"] = "at_most_once",
    timeout: float = 60.0,
    max_attempts: int = 5,
    terminal: Terminal = False,
    usage_hint: str = "",
    initial_retry_interval: float = 1.0,
    maximum_retry_interval: float = 30.0,
    task_queue: str | None = None,
    local: bool = False,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    recovery: Recovery | Literal["unknown"] = "at_most_once",
    timeout: float = 60.0,
    max_attempts: int = 5,
    terminal: Terminal = False,
    usage_hint: str = "",
    initial_retry_interval: float = 1.0,
    maximum_retry_interval: float = 30.0,
    task_queue: str | None = None,
    local: bool = False,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Turn a typed function (sync or async) into a tool; usable bare (``@tool``) or with options.

    Parameters become the argument schema (from their type hints and defaults); a parameter annotated
    :class:`ToolContext`, whatever its name, receives the call context and is left out of the schema. The
    description is the docstring's first paragraph and each parameter's description comes from a Google-style
    ``Args:`` section (or from ``Field(description=...)`` / ``Annotated[..., Field(...)]``).

    Args:
        fn: The function, when used bare.
        name: Tool name; defaults to the function name.
        description: Tool description; defaults to the docstring's first paragraph.
        recovery: ``"at_most_once"`` (or its alias ``"unknown"``) or ``"replay_safe"``.
        timeout: Seconds one attempt may take.
        max_attempts: Attempts for replay-safe tools.
        terminal: Whether a completed call ends the turn, and the completion message (see :class:`Tool`).
        usage_hint: Prompt hint, rendered as "Use when:".
        initial_retry_interval: First retry delay in seconds (replay-safe tools).
        maximum_retry_interval: Longest retry delay in seconds (replay-safe tools).
        task_queue: The Temporal task queue the tool's activity runs on (served by ``worker.py --queue NAME --only
            tools``); None (the default) runs it on the turn's own queue.
        local: Run each call as a local activity in the turn's worker, one workflow task fewer per call; for quick
            tools (see :attr:`Tool.local`).

    Returns:
        A :class:`FunctionTool`, or a decorator producing one.

    Raises:
        ValueError: ``"context is a reserved parameter name"`` for a ``context`` parameter that is not a
            :class:`ToolContext`, an invalid name, ``*args``/``**kwargs``, an unknown recovery mode, or a
            ``task_queue`` that is not a non-empty string, or ``local`` together with a ``task_queue``.
    """

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        return _build_function_tool(
            function,
            name=name,
            description=description,
            recovery=recovery,
            timeout=timeout,
            max_attempts=max_attempts,
            terminal=terminal,
            usage_hint=usage_hint,
            initial_retry_interval=initial_retry_interval,
            maximum_retry_interval=maximum_retry_interval,
            task_queue=task_queue,
            local=local,
        )

    if fn is not None:
        return decorate(fn)
    return decorate


def as_tool(value: object) -> Tool:
    """Normalise an entry of an agent's ``tools`` list into a tool instance.

    Args:
        value: A :class:`Tool` instance (including ``@tool`` functions) or a :class:`Tool` subclass.

    Returns:
        The instance; a subclass is instantiated with no arguments.

    Raises:
        TypeError: ``value`` is not a TurnKit tool.
        ValueError: A subclass needs constructor arguments (``"<name> requires constructor arguments; register an
            instance instead"``).
    """
    if isinstance(value, Tool):
        return value
    if isinstance(value, type) and issubclass(value, Tool):
        try:
            inspect.signature(value).bind()
        except TypeError:
            raise ValueError(f"{value.name} requires constructor arguments; register an instance instead") from None
        except ValueError:
            pass  # no introspectable signature (C extension); just try it below
        return value()
    raise TypeError(TOOLS_TYPE_ERROR)
