"""Output policies and their audit (docs/behaviour.md §3.9).

A turn's final answer is audited before it is published by the agent's *constraints*: callables (or objects with a
``check`` method) that return what they found, and :class:`OutputPolicy` LLM judges, which ask a model whether the
answer follows a written policy. What they return becomes a list of :class:`Violation`; the :class:`AuditResult` is
clean when that list is empty.

This module holds the constraint protocol and the judge; it does no I/O of its own except the judge's model call,
which the caller supplies (inside a turn that is the ``turnkit.model`` activity, so the call is charged to the turn:
see :mod:`activities.output_audit`). :func:`check_output_policy` audits an output outside any turn.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from turnkit._engine.callbacks import call_application
from turnkit.config import settings
from turnkit.kernel.errors import ConfigError
from turnkit.model import Client, ModelRequest, Result
from turnkit.skills import Skill

__all__ = [
    "OUTPUT_POLICY_MODES",
    "AuditResult",
    "Constraint",
    "JudgeAsk",
    "OutputPolicy",
    "OutputPolicyMode",
    "Violation",
    "audit_output",
    "check_output_policy",
    "judged_text",
    "normalize_output_policy",
    "require_image",
    "require_media_analysis",
    "revision_request",
]

#: How a dirty audit ends the turn once no revision is left: ``fail`` (the turn fails with ``TurnKit::OutputAudit``),
#: ``report`` (it completes, the audit recorded) or ``revise`` (like ``report``, with one revision by default).
OutputPolicyMode = Literal["fail", "report", "revise"]
OUTPUT_POLICY_MODES: Final = ("fail", "report", "revise")

#: A constraint: a callable or an object with ``check``, sync or ``async def``; or an :class:`OutputPolicy`.
Constraint = Any

#: How a judge asks its model: the request in, the result out (inside a turn it also charges the turn).
JudgeAsk = Callable[[ModelRequest, "OutputPolicy"], Awaitable[Result]]

_POLICY_SUFFIXES: Final = (".md", ".markdown", ".txt")
_DEFAULT_RULE: Final = "output_constraint"
_CONTEXT_KEYS: Final = ("turn", "output_text", "output_data", "messages")

#: The judge's structured answer (behaviour §3.9).
JUDGE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "properties": {
        "approved": {"type": "boolean"},
        "violations": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"rule": {"type": "string"}, "message": {"type": "string"}},
                "required": ["rule", "message"],
            },
        },
    },
    "required": ["approved", "violations"],
}

INVALID_JSON: Final = "output policy returned invalid JSON"
REVISION_PREAMBLE: Final = (
    "Your previous output failed policy checks. Revise it so that it satisfies the policies, without adding new claims."
)


@dataclass(frozen=True)
class Violation:
    """One thing an audit found wrong: the rule broken, a message, and anything else the constraint said."""

    rule: str
    message: str
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """``{rule, message, metadata}`` (JSON)."""
        return {"rule": self.rule, "message": self.message, "metadata": dict(self.metadata)}


@dataclass(frozen=True)
class AuditResult:
    """An audit's outcome (the spec's ``OutputAudit::Result``): clean when no constraint found a violation."""

    violations: tuple[Violation, ...] = ()

    @property
    def clean(self) -> bool:
        """No violation was found."""
        return not self.violations

    @property
    def messages(self) -> list[str]:
        """The violation messages, in order."""
        return [each.message for each in self.violations]

    def to_dict(self) -> dict[str, Any]:
        """``{clean, violations: [{rule, message, metadata}]}``: what ``turn.policy_audit`` holds."""
        return {"clean": self.clean, "violations": [each.to_dict() for each in self.violations]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AuditResult:
        """The result recorded by :meth:`to_dict`."""
        violations = data.get("violations") or []
        return cls(
            tuple(
                Violation(str(v.get("rule")), str(v.get("message")), dict(v.get("metadata") or {})) for v in violations
            )
        )


def _produced(kind: str, output_data: Any, messages: Sequence[Any]) -> bool:
    if isinstance(output_data, Mapping) and output_data.get("type") == kind:  # pyright: ignore[reportUnknownMemberType]
        return True
    return any(getattr(message, "kind", None) == kind for message in messages)


def require_image(output: Any, *, output_data: Any = None, messages: Sequence[Any] = ()) -> Violation | None:
    """Built-in constraint (behaviour §3.9): passes when the output data or the turn's messages hold an image."""
    if _produced("image", output_data, messages):
        return None
    return Violation("require_image", "the turn produced no image")


def require_media_analysis(output: Any, *, output_data: Any = None, messages: Sequence[Any] = ()) -> Violation | None:
    """Built-in constraint (behaviour §3.9): passes when the output data or the turn's messages hold a media
    analysis."""
    if _produced("media_analysis", output_data, messages):
        return None
    return Violation("require_media_analysis", "the turn produced no media analysis")


class OutputPolicy:
    """An LLM judge: asks a model whether an output follows the policy ``content`` (behaviour §3.9).

    The judge call has no tools, the fixed JSON schema ``{approved, violations: [{rule, message}]}`` and instructions
    that embed the policy. Inside a turn it is a model call of the turn (``purpose: "output_policy"``), charged to the
    turn's usage and cost and to the tree's budget. Its model is the policy's own, else the agent's
    ``output_policy_model``, else ``settings.output_policy_model``, else the turn's model.
    """

    def __init__(
        self,
        content: str,
        *,
        name: str = "output_policy",
        model: str | None = None,
        thinking: Mapping[str, Any] | None = None,
        client: Client | None = None,
    ) -> None:
        """Define a judge.

        Args:
            content: The policy text the output must follow.
            name: The policy's name: its default rule and its ``<skill key=...>`` in revision requests.
            model: The judge model (see the class docstring for the fallbacks).
            thinking: Thinking for the judge call; None falls back to the agent's, then the setting's.
            client: The judge's client; None uses the agent's (or, outside a turn, ``settings.client``).

        Raises:
            ValueError: ``content`` is empty.
        """
        if not isinstance(content, str) or not content.strip():  # pyright: ignore[reportUnnecessaryIsInstance]
            raise ValueError("output policy content is required")
        self.content = content.strip()
        self.name = name
        self.model = model
        self.thinking = None if thinking is None else dict(thinking)
        self.client = client

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], **options: Any) -> OutputPolicy:
        """A judge whose policy is the text of a ``.md``, ``.markdown`` or ``.txt`` file (read now), named after it."""
        file = Path(path)
        options.setdefault("name", file.stem)
        return cls(file.read_text(encoding="utf-8"), **options)

    @classmethod
    def from_skill(cls, skill: Skill, **options: Any) -> OutputPolicy:
        """A judge whose policy is a skill's content (behaviour §3.9), named after the skill's key: its revision
        requests re-embed that content as ``<skill key="<key>">``.

        Raises:
            ValueError: The skill has no content.
        """
        options.setdefault("name", skill.key)
        return cls(skill.content, **options)

    def request(self, output_text: str, *, model: str, thinking: dict[str, Any] | None) -> ModelRequest:
        """The judge's model request for ``output_text``."""
        instructions = (
            "You audit an assistant's output against a policy. Answer only with a JSON object "
            '{"approved": true|false, "violations": [{"rule": "...", "message": "..."}]}: approved when the output '
            "follows the policy, otherwise one violation per broken rule.\n\n"
            f'<policy name="{self.name}">\n{self.content}\n</policy>'
        )
        return ModelRequest(
            model=model,
            messages=[{"role": "user", "content": f"Output to audit:\n\n{output_text}"}],
            instructions=instructions,
            thinking=thinking,
            output_schema=JUDGE_SCHEMA,
            metadata={"purpose": "output_policy", "output_policy": self.name},
        )

    def violations(self, result: Result) -> list[Violation]:
        """The violations a judge's answer reports (``output_data``, else JSON parsed from its text)."""
        verdict = result.output_data if isinstance(result.output_data, dict) else _parse_json(result.text)
        if not isinstance(verdict, dict):
            return [Violation(self.name, INVALID_JSON)]
        if verdict.get("approved") is True:  # pyright: ignore[reportUnknownMemberType]
            return []
        found: list[Violation] = []
        for item in verdict.get("violations") or []:  # pyright: ignore[reportUnknownVariableType, reportUnknownMemberType]
            if isinstance(item, dict):
                rule = str(item.get("rule") or self.name)  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
                found.append(Violation(rule, str(item.get("message") or "output policy violated")))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
            else:
                found.append(Violation(self.name, str(item)))  # pyright: ignore[reportUnknownArgumentType]
        # Not approved but nothing named: still dirty, or a judge that forgot the list would pass everything.
        return found or [Violation(self.name, "output policy did not approve the output")]

    require_image = staticmethod(require_image)
    """``OutputPolicy.require_image``: the built-in constraint :func:`require_image`."""
    require_media_analysis = staticmethod(require_media_analysis)
    """``OutputPolicy.require_media_analysis``: the built-in constraint :func:`require_media_analysis`."""

    def __repr__(self) -> str:
        """Show the name and model."""
        return f"OutputPolicy(name={self.name!r}, model={self.model!r})"


def normalize_output_policy(policy: Any) -> tuple[Constraint, ...]:
    """An agent's ``output_policy`` option as a tuple of constraints (behaviour §1.2).

    Args:
        policy: None, one constraint or an iterable of them. Each is a ``.md``/``.markdown``/``.txt`` path (a string
            or ``PathLike``, read now into an :class:`OutputPolicy`), a :class:`~turnkit.skills.Skill` (its content
            becomes an :class:`OutputPolicy`, :meth:`OutputPolicy.from_skill`), an :class:`OutputPolicy`, or any
            object with a ``check`` method or that is callable.

    Raises:
        ValueError: A string that is not a policy file path.
        TypeError: An entry that is none of the above.
    """
    if policy is None:
        return ()
    items: Iterable[Any] = (
        [policy]
        if isinstance(policy, str | os.PathLike | OutputPolicy | Skill) or not isinstance(policy, Iterable)
        else policy  # pyright: ignore[reportUnknownVariableType]
    )
    constraints: list[Constraint] = []
    for each in items:
        if isinstance(each, str | os.PathLike):
            path = os.fspath(each)  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]
            if not str(path).lower().endswith(_POLICY_SUFFIXES):
                raise ValueError(f"output_policy strings must be .md, .markdown or .txt paths, not {str(path)!r}")
            constraints.append(OutputPolicy.from_file(path))  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(each, Skill):
            constraints.append(OutputPolicy.from_skill(each))
        elif isinstance(each, OutputPolicy) or callable(getattr(each, "check", None)) or callable(each):
            constraints.append(each)
        else:
            raise TypeError(
                "output_policy entries must be policy file paths, skills, OutputPolicy objects, callables or objects "
                f"with a check method, not {type(each).__name__}"
            )
    return tuple(constraints)


async def audit_output(
    constraints: Sequence[Constraint],
    *,
    output_text: str,
    output_data: Any = None,
    turn: Any = None,
    messages: Sequence[Any] = (),
    ask: JudgeAsk,
    judge_model: Callable[[OutputPolicy], str],
    judge_thinking: Callable[[OutputPolicy], dict[str, Any] | None],
) -> AuditResult:
    """Run every constraint on an output (behaviour §3.9) and collect their violations.

    The audit input is ``output_data`` when it is not None, else ``output_text``. A constraint is called through its
    ``check`` method, else itself, with the input and those of the keywords ``turn``, ``output_text`` and
    ``output_data`` that it declares (all of them when it takes ``**kwargs``), and ``messages`` (the turn's own
    messages) when it declares that by name. Judges ask their model through ``ask``.

    Raises:
        ConfigError: A constraint raised, or returned a value that cannot be read as violations.
    """
    subject = output_data if output_data is not None else output_text
    context = {"turn": turn, "output_text": output_text, "output_data": output_data, "messages": list(messages)}
    found: list[Violation] = []
    for constraint in constraints:
        if isinstance(constraint, OutputPolicy):
            text = judged_text(output_text, output_data)
            request = constraint.request(text, model=judge_model(constraint), thinking=judge_thinking(constraint))
            found.extend(constraint.violations(await ask(request, constraint)))
            continue
        target = constraint.check if callable(getattr(constraint, "check", None)) else constraint
        name = getattr(target, "__qualname__", type(constraint).__name__)
        try:
            returned = await call_application(target, subject, **_declared(target, context))
            found.extend(_violations(returned))
        except Exception as err:
            # An application bug, not a transient failure: the turn fails with it rather than being retried.
            raise ConfigError(f"output policy {name} failed: {err}") from err
    return AuditResult(tuple(found))


def judged_text(output_text: str, output_data: Any = None) -> str:
    """What a judge reads of an output: its ``output_data`` as JSON when set, else its text."""
    return output_text if output_data is None else json.dumps(output_data, sort_keys=True, default=str)


async def check_output_policy(
    output: Any, *, constraints: Any, context: Mapping[str, Any] | None = None
) -> AuditResult:
    """Audit ``output`` with ``constraints`` outside any turn (the spec's ``check_output_policy``).

    Args:
        output: A string (the output text) or structured output data.
        constraints: What an agent's ``output_policy`` accepts (see :func:`normalize_output_policy`).
        context: Optional ``turn``, ``output_text`` and ``output_data`` passed to constraints that declare them.

    Returns:
        The audit. Judges use their own client, else ``settings.client``; their model is their own, else
        ``settings.output_policy_model``, else ``settings.default_model``. Their usage is not recorded anywhere.

    Raises:
        ConfigError: A judge has no client, or a constraint failed.
    """
    given = dict(context or {})
    text = given.get("output_text")
    data = given.get("output_data")
    if text is None:
        text = output if isinstance(output, str) else json.dumps(output, sort_keys=True, default=str)
    if data is None and not isinstance(output, str):
        data = output

    async def ask(request: ModelRequest, policy: OutputPolicy) -> Result:
        client = policy.client if policy.client is not None else settings.client
        if client is None:
            raise ConfigError(f'no model client configured for output policy "{policy.name}"')
        return await client.chat(request)

    return await audit_output(
        normalize_output_policy(constraints),
        output_text=str(text),
        output_data=data,
        turn=given.get("turn"),
        ask=ask,
        judge_model=lambda p: p.model or settings.output_policy_model or settings.default_model,
        judge_thinking=lambda p: p.thinking if p.thinking is not None else settings.output_policy_thinking,
    )


def revision_request(audit: AuditResult, constraints: Sequence[Constraint], *, terminal_tool: str | None = None) -> str:
    """The revision request sent to the model after a dirty audit (behaviour §3.9).

    It says the previous output failed policy checks, re-embeds each judge's policy as ``<skill key="...">``, lists
    the violations as ``n. rule: message`` and, when the answer came from a terminal tool, asks to resubmit through it.
    """
    lines = [REVISION_PREAMBLE, ""]
    for each in constraints:
        if isinstance(each, OutputPolicy):
            lines += [f'<skill key="{each.name}">\n{each.content}\n</skill>', ""]
    lines.append("Violations:")
    lines += [f"{n}. {v.rule}: {v.message}" for n, v in enumerate(audit.violations, start=1)]
    if terminal_tool:
        lines += ["", f"Resubmit via {terminal_tool}."]
    return "\n".join(lines)


def _declared(target: Callable[..., Any], context: dict[str, Any]) -> dict[str, Any]:
    """The context keywords ``target`` declares (all of them when it takes ``**kwargs``)."""
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature: give them the output only
        return {}
    names = {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
        # The spec's three keywords; ``messages`` (TurnKit for Python's addition) only when declared by name.
        return {key: value for key, value in context.items() if key != "messages" or key in names}
    return {key: value for key, value in context.items() if key in names and key in _CONTEXT_KEYS}


def _violations(returned: Any) -> list[Violation]:
    """A constraint's return value as violations (the table of behaviour §3.9)."""
    if returned is None or isinstance(returned, bool):
        return []
    if isinstance(returned, Violation):
        return [returned]
    if isinstance(returned, AuditResult):
        return list(returned.violations)
    if isinstance(returned, str):
        return [Violation(_DEFAULT_RULE, returned)]
    if isinstance(returned, Mapping):
        data: dict[str, Any] = {str(k): v for k, v in returned.items()}  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        message = data.get("message") or data.get("error") or "output constraint failed"
        metadata = data.get("metadata")
        if metadata is None:
            metadata = {k: v for k, v in data.items() if k not in ("rule", "message", "error")}
        return [Violation(str(data.get("rule") or _DEFAULT_RULE), str(message), dict(metadata))]
    if isinstance(returned, list | tuple):
        return [found for item in returned for found in _violations(item)]  # pyright: ignore[reportUnknownVariableType]
    raise ValueError(
        f"an output constraint returned {type(returned).__name__}; expected None, a bool, a string, "
        "a mapping, a Violation, an AuditResult or a list of them"
    )


def _parse_json(text: str) -> Any:
    """JSON from a judge's text: a bare object, a fenced ``json`` block, or the first ``{...}``; None if none."""
    candidates = [text.strip()]
    fenced = re.search(r"```json\s*(.*?)```", text, re.DOTALL)
    if fenced:
        candidates.append(fenced.group(1).strip())
    start, end = text.find("{"), text.rfind("}")
    if 0 <= start < end:
        candidates.append(text[start : end + 1])
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except ValueError:
            continue
    return None
