"""A team's own workflows that ask TurnKit agents as steps (``turnkit.workflow``), for tests/test_team_workflows.py,
the history scenario ``team-approval`` and the README ("Use TurnKit from your own workflow", whose
``ApprovalWorkflow`` is this one, line for line: a test compares them).

Workflow code only, as a team's workflow module would be: it imports temporalio, pydantic and ``turnkit.workflow``
(which the worker's sandbox passes through), so the sandbox can import it for every run. The agents live elsewhere
(``tests/team_agents.py`` for the worker processes, the tests' own for in-process workers).
"""

import asyncio

from pydantic import BaseModel, Field
from temporalio import workflow

import turnkit.workflow


@workflow.defn
class ApprovalWorkflow:
    """Draft an approval with an agent, wait for a human's decision, have two agents review it in parallel, then
    ask the drafter, in the draft's conversation, to combine the reviews."""

    def __init__(self) -> None:
        self.approved: bool | None = None

    @workflow.signal
    def decide(self, approved: bool) -> None:
        self.approved = approved

    @workflow.run
    async def run(self, request: str) -> str:
        draft = await turnkit.workflow.ask(agent="drafter", text=f"Draft an approval request: {request}")
        await workflow.wait_condition(lambda: self.approved is not None)
        if not self.approved:
            return "rejected"
        legal, finance = await asyncio.gather(
            turnkit.workflow.run(agent="legal", task="Review for legal risk.", input=draft.output_text),
            turnkit.workflow.run(agent="finance", task="Review for cost.", input=draft.output_text),
        )
        summary = await turnkit.workflow.ask(
            conversation_id=draft.conversation_id,
            text=f"Combine the reviews.\nLegal: {legal.output_text}\nFinance: {finance.output_text}",
        )
        return summary.output_text


class AskPlan(BaseModel):
    """What :class:`AskWorkflow` asks, and the controls it applies to the turn once signalled ``proceed``."""

    text: str
    agent: str | None = None
    conversation_id: str | None = None
    output_limit: int = turnkit.workflow.DEFAULT_OUTPUT_LIMIT
    #: ``pause``, ``resume``, ``cancel`` or ``steer:<text>``, applied in order after ``proceed``.
    controls: list[str] = Field(default_factory=list[str])
    #: Raise the turn's error when it did not complete (``TurnResult.raise_for_status``).
    raise_for_status: bool = False


@workflow.defn
class AskWorkflow:
    """Start one turn, report its id (query ``asked``), apply the plan's controls, return the turn's result."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.go = False
        self.applied: list[str] = []

    @workflow.query
    def asked(self) -> str | None:
        return self.turn_id

    @workflow.query
    def controlled(self) -> list[str]:
        """What each control returned: a status, or the number of steering receipts."""
        return self.applied

    @workflow.signal
    def proceed(self) -> None:
        self.go = True

    @workflow.run
    async def run(self, plan: AskPlan) -> turnkit.workflow.TurnResult:
        handle = await turnkit.workflow.start(
            text=plan.text, agent=plan.agent, conversation_id=plan.conversation_id, output_limit=plan.output_limit
        )
        self.turn_id = handle.turn_id
        if plan.controls:
            await workflow.wait_condition(lambda: self.go)
        for control in plan.controls:
            if control.startswith("steer:"):
                receipts = await handle.steer(control.removeprefix("steer:"))
                self.applied.append(f"{len(receipts)} receipt(s)")
            elif control == "pause":
                self.applied.append(await handle.pause())
            elif control == "resume":
                self.applied.append(await handle.resume())
            else:
                self.applied.append(await handle.cancel())
        result = await handle.result()
        return result.raise_for_status() if plan.raise_for_status else result


@workflow.defn
class OwnSignalWorkflow:
    """A team's workflow with a ``target_finished`` signal handler of its own, the name TurnKit's waiters use."""

    def __init__(self) -> None:
        self.turn_id: str | None = None
        self.heard: list[str] = []

    @workflow.signal(name="target_finished")
    def target_finished(self, turn_id: str) -> None:
        self.heard.append(turn_id)

    @workflow.query
    def asked(self) -> str | None:
        return self.turn_id

    @workflow.run
    async def run(self, agent: str) -> list[str]:
        handle = await turnkit.workflow.start(text="hi", agent=agent)
        self.turn_id = handle.turn_id
        result = await handle.result()
        return [result.status, *self.heard]
