"""Output policies and audit (behaviour §3.9; T26-T29): constraints and LLM judges audit a turn's final answer inside
the model activity, on a real dev server with the scripted model."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

import turnkit
from tests.engine import Engine, HeldModel, eventually, turn_for_activities
from turnkit._activities.audit import AuditActivities
from turnkit._activities.model import ModelActivities
from turnkit._activities.turns import TurnActivities
from turnkit.events import Event
from turnkit.kernel.payloads import AuditCall, FinishTurn, ModelCall, TurnOutcome
from turnkit.model import ModelRequest, Result, Usage
from turnkit.output_policy import INVALID_JSON, JUDGE_SCHEMA, OutputPolicy, Violation, check_output_policy
from turnkit.runtime import TurnKit
from turnkit.skills import Skill
from turnkit.testing import ScriptedClient, call_tools, image, say

REVISION_TEXT = "previous output failed policy checks"


def needs_recommendation(output: str) -> dict[str, Any] | None:
    """Flags output without a "Recommendation" (the T26 constraint)."""
    if "Recommendation" in output:
        return None
    return {"rule": "needs_recommendation", "message": "output has no Recommendation"}


def recorded(events: list[Event]) -> Any:
    turnkit.configure(on_event=events.append)


def of_type(events: list[Event], prefix: str) -> list[Event]:
    return [e for e in events if e.type.startswith(prefix)]


async def test_report_mode_completes_and_records_the_audit(tk: TurnKit) -> None:
    """T26: a constraint that flags output without "Recommendation" in report mode; the run outputs "Draft only";
    it completes, policy_clean is false and the violation rule is recorded."""
    events: list[Event] = []
    recorded(events)
    agent = turnkit.Agent(
        "reporter",
        model="scripted",
        client=ScriptedClient(["Draft only"]),
        output_policy=needs_recommendation,
        output_policy_mode="report",
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Draft only"
    assert run.policy_clean is False
    assert run.policy_audit == {
        "clean": False,
        "violations": [{"rule": "needs_recommendation", "message": "output has no Recommendation", "metadata": {}}],
    }
    assert run.record.options.state.policy_audit == run.policy_audit  # where the spec keeps it: options.state
    assert run.error is None
    audit_events = of_type(events, "output_policy.")
    assert [(e.type, e.payload) for e in audit_events] == [
        ("output_policy.completed", {"clean": False, "violation_count": 1})
    ]
    types = [e.type for e in events]
    assert types.index("model.completed") < types.index("output_policy.completed") < types.index("turn.completed")


async def test_fail_mode_fails_the_turn_and_keeps_the_output(tk: TurnKit) -> None:
    """T27: a violating constraint in fail mode; the run is failed, output_text keeps the output, and the error class
    is "TurnKit::OutputAudit" with the policy_audit violations."""
    events: list[Event] = []
    recorded(events)
    agent = turnkit.Agent(
        "strict", model="scripted", client=ScriptedClient(["Draft only"]), output_policy=[needs_recommendation]
    )
    assert agent.output_policy_mode == "fail" and agent.output_retries == 0  # the spec's defaults
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.output_text == "Draft only"
    assert run.error is not None
    assert run.error["class"] == "TurnKit::OutputAudit" == turnkit.OutputAudit.qualified_name
    assert run.error["message"] == "output has no Recommendation"
    assert run.error["policy_audit"]["violations"][0]["rule"] == "needs_recommendation"
    assert run.policy_clean is False
    # The workflow's own result says so too (not "completed" with a failed record).
    outcome = await tk.client.get_workflow_handle(run.id, result_type=TurnOutcome).result()
    assert (outcome.status, outcome.error_class) == ("failed", "TurnKit::OutputAudit")
    failed = [e for e in events if e.type == "turn.failed"]
    assert len(failed) == 1 and failed[0].payload["error"]["class"] == "TurnKit::OutputAudit"
    assert not [e for e in events if e.type == "turn.completed"]


async def test_one_revision_then_a_clean_answer(tk: TurnKit) -> None:
    """T28: output_retries 1, a dirty first draft and a clean second one; the run completes with the second text
    after 2 model calls, and the transcript contains "previous output failed policy checks"."""
    events: list[Event] = []
    recorded(events)
    client = ScriptedClient(["Draft only", "Recommendation: ship it"])
    agent = turnkit.Agent(
        "reviser", model="scripted", client=client, output_policy=needs_recommendation, output_retries=1
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Recommendation: ship it"
    assert client.calls == 2
    assert run.policy_clean is True
    messages = await run.messages()
    revisions = [m for m in messages if m.role == "user" and REVISION_TEXT in m.text]
    assert len(revisions) == 1
    assert revisions[0].metadata["source"] == "output_policy" and revisions[0].metadata["attempt"] == 1
    assert "1. needs_recommendation: output has no Recommendation" in revisions[0].text
    # The revision request is what the model was asked the second time.
    assert REVISION_TEXT in str(client.requests[1].messages[-1]["content"])
    created = [e.payload for e in events if e.type == "message.created"]
    assert {"message_id": revisions[0].id, "role": "user", "kind": "text"} in created
    assert run.record.options.state.revisions_used == 1
    assert run.record.options.state.iterations == 2  # a revision loop is a model-phase entry
    assert [(e.type, e.payload) for e in of_type(events, "output_policy.")] == [
        ("output_policy.revision", {"violation_count": 1, "attempt": 1}),
        ("output_policy.completed", {"clean": True, "violation_count": 0}),
    ]


async def test_an_answer_held_at_a_pause_is_published_by_its_audit(tk: TurnKit) -> None:
    """An answer held back by a pause keeps its audit: on resume, fail mode publishes it as failed (OutputAudit)."""
    model = HeldModel(turnkit.Result.build(text="Draft only"))
    agent = turnkit.Agent("held", model="scripted", client=model, output_policy=needs_recommendation)
    turn = await (await tk.conversation(agent)).ask("Write the memo", wait=False)
    await asyncio.wait_for(model.entered.wait(), 30)
    await turn.pause()
    model.released.set()

    async def paused() -> bool:
        await turn.refresh()
        return turn.status == "paused"

    await eventually(paused, what="the turn to pause before publishing")
    assert turn.output_text == "" and turn.policy_clean is False  # audited, not published
    await turn.resume()
    done = await turn.result(timeout=60)
    assert done.status == "failed" and done.output_text == "Draft only"
    assert done.error is not None and done.error["class"] == "TurnKit::OutputAudit"
    assert len(model.requests) == 1


async def test_revise_mode_completes_once_revisions_run_out(tk: TurnKit) -> None:
    """Revise mode: one revision by default; a second dirty draft completes with the audit recorded (not failed)."""
    client = ScriptedClient(["Draft only", "Still a draft"])
    agent = turnkit.Agent(
        "reviser2", model="scripted", client=client, output_policy=needs_recommendation, output_policy_mode="revise"
    )
    assert agent.output_retries == 1
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Still a draft"
    assert client.calls == 2 and run.policy_clean is False
    assert run.record.options.state.revisions_used == 1


def judge_and_main(judge: str, *, main: Result) -> Any:
    """A scripted responder: the judge's answer for ``output_policy`` calls, ``main`` for the turn's own."""

    def respond(request: ModelRequest) -> Result:
        if request.metadata.get("purpose") == "output_policy":
            return Result.build(text=judge, usage=Usage(input_tokens=5, output_tokens=1, cost=0.02))
        return main

    return respond


async def test_judge_call_is_charged_to_the_turn(tk: TurnKit) -> None:
    """T29: an OutputPolicy whose judge call costs 0.02 and a main call that costs 0.01; the run completes,
    run.cost is 0.03, usage includes both calls, and there is only 1 turn record."""
    events: list[Event] = []
    recorded(events)
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, output_tokens=3, cost=0.01))
    client = ScriptedClient(judge_and_main('{"approved": true, "violations": []}', main=main))
    policy = OutputPolicy("Every memo ends with a Recommendation.", name="memo_policy")
    agent = turnkit.Agent(
        "judged", model="scripted", client=client, output_policy=policy, output_policy_model="judge-model"
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.policy_clean is True
    assert run.cost.total == pytest.approx(0.03)
    assert (await run.tree_cost()).total == pytest.approx(0.03)
    assert (run.usage.input_tokens, run.usage.output_tokens) == (15, 4)
    assert len(await run.turn_records()) == 1
    judge = client.requests[1]
    assert judge.model == "judge-model" and judge.tools == [] and judge.output_schema == JUDGE_SCHEMA
    assert "Every memo ends with a Recommendation." in judge.instructions
    assert judge.thinking == {"effort": "low"}  # settings.output_policy_thinking
    assert judge.metadata["turn_id"] == run.id
    assert [e.type for e in of_type(events, "output_policy.")] == [
        "output_policy.model.requested",
        "output_policy.model.completed",
        "output_policy.completed",
    ]
    completed = next(e for e in events if e.type == "output_policy.model.completed")
    assert completed.payload["cost"] == pytest.approx(0.02) and completed.payload["model"] == "judge-model"


async def test_judge_cost_counts_against_max_spend(tk: TurnKit) -> None:
    """The judge's cost counts against the tree's budget: 0.01 + 0.02 over a max_spend of 0.025 fails the turn."""
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, cost=0.01))
    client = ScriptedClient(judge_and_main('{"approved": true, "violations": []}', main=main))
    agent = turnkit.Agent(
        "thrifty", model="scripted", client=client, output_policy=OutputPolicy("Be brief."), max_spend=0.025
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed"
    assert run.error is not None and run.error["class"] == "TurnKit::BudgetError"
    assert run.cost.total == pytest.approx(0.03)


async def test_judge_violations_and_invalid_json(tk: TurnKit) -> None:
    """A judge's violations (fenced JSON) are the audit's; a judge answering prose is one "invalid JSON" violation."""
    verdict = '```json\n{"approved": false, "violations": [{"rule": "tone", "message": "too casual"}]}\n```'
    main = say("hey, ship it")
    both = [OutputPolicy("Formal tone.", name="tone_policy"), OutputPolicy("Anything.", name="prose")]
    answers = iter([verdict, "looks fine to me"])

    def respond(request: ModelRequest) -> Result:
        if request.metadata.get("purpose") == "output_policy":
            return Result.build(text=next(answers))
        return main

    agent = turnkit.Agent(
        "judged2", model="scripted", client=ScriptedClient(respond), output_policy=both, output_policy_mode="report"
    )
    run = await tk.run(agent, "Write")
    assert run.status == "completed"
    assert run.policy_audit is not None
    assert [(v["rule"], v["message"]) for v in run.policy_audit["violations"]] == [
        ("tone", "too casual"),
        ("prose", INVALID_JSON),
    ]


async def test_a_retried_model_activity_does_not_audit_twice(engine: Engine) -> None:
    """A model activity retried after its audit committed neither audits again (no second constraint or judge call)
    nor appends a second revision request; the judge is charged once."""
    tk = engine.tk
    checks: list[str] = []

    def constraint(output: str, output_text: str) -> str | None:
        checks.append(output_text)
        return None if "Recommendation" in output else "no Recommendation"

    main = say("Draft only", usage=Usage(input_tokens=10, cost=0.01))
    client = ScriptedClient(judge_and_main('{"approved": true, "violations": []}', main=main))
    agent = turnkit.Agent(
        "retried",
        model="scripted",
        client=client,
        output_policy=[constraint, OutputPolicy("Be brief.")],
        output_retries=1,
    )
    turnkit.register(agent)
    conversation = await tk.conversation(agent)
    record = await turn_for_activities(tk, conversation, "Write the memo")
    model_call = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id="req_1", iteration=1)
    activities = ModelActivities(tk.store)
    env = ActivityEnvironment()

    first = await env.run(activities.model, model_call)
    again = await env.run(activities.model, model_call)  # the retry, after the commit

    assert first.outcome == again.outcome == "tools" and first.tool_calls == again.tool_calls == []
    assert first.message_id == again.message_id
    assert checks == ["Draft only"] and client.calls == 2  # one main call, one judge call: nothing twice
    revisions = [m for m in await conversation.messages() if m.role == "user" and REVISION_TEXT in m.text]
    assert len(revisions) == 1
    turn = await tk.store.load_turn(record.id)
    assert turn.options.state.revisions_used == 1 and turn.options.state.phase == "model"
    assert turn.cost == pytest.approx(0.03) and turn.usage["input_tokens"] == 15


async def test_a_constraint_that_raises_fails_the_turn_without_retrying(tk: TurnKit) -> None:
    """A constraint that raises is an application bug: the turn fails with ConfigError naming it, the model is asked
    once (the activity is not retried)."""

    def broken(output: str) -> None:
        raise RuntimeError("policy store unreachable")

    client = ScriptedClient(["Draft only", "Draft only"])
    agent = turnkit.Agent("broken", model="scripted", client=client, output_policy=broken)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.error is not None
    assert run.error["class"] == "TurnKit::ConfigError"
    assert "output policy" in run.error["message"] and "policy store unreachable" in run.error["message"]
    assert client.calls == 1


async def test_check_output_policy_outside_a_turn() -> None:
    """check_output_policy: constraints' return values map to violations (the §3.9 table); judges use their client."""

    def many(output: str, **context: Any) -> list[Any]:
        assert context == {"turn": None, "output_text": "text", "output_data": None}
        return [
            "plain",
            {"rule": "r1", "error": "from error", "extra": 1},
            Violation("r2", "given"),
            True,
            None,
        ]

    class Checker:
        def check(self, output: str) -> bool:
            return False

    audit = await check_output_policy("text", constraints=[many, Checker()])
    assert [v.to_dict() for v in audit.violations] == [
        {"rule": "output_constraint", "message": "plain", "metadata": {}},
        {"rule": "r1", "message": "from error", "metadata": {"extra": 1}},
        {"rule": "r2", "message": "given", "metadata": {}},
    ]
    assert not audit.clean and audit.messages == ["plain", "from error", "given"]

    judge = OutputPolicy("Rules.", client=ScriptedClient(['{"approved": true, "violations": []}']))
    assert (await check_output_policy({"a": 1}, constraints=judge)).clean

    with pytest.raises(turnkit.ConfigError, match=r"output policy .* failed"):
        await check_output_policy("text", constraints=lambda output: 42)


def test_agent_output_policy_options(tmp_path: Path) -> None:
    """The options are checked at definition: modes, retries, policy sources (a .md path becomes a judge)."""
    policy_file = tmp_path / "memo.md"
    policy_file.write_text("Memos end with a Recommendation.\n")
    agent = turnkit.Agent("a", output_policy=[str(policy_file), needs_recommendation])
    assert isinstance(agent.output_policy[0], OutputPolicy) and agent.output_policy[0].name == "memo"
    assert agent.output_policy[0].content == "Memos end with a Recommendation."
    with pytest.raises(ValueError, match=r"\.md, \.markdown or \.txt paths"):
        turnkit.Agent("b", output_policy="be nice")
    with pytest.raises(TypeError, match="output_policy entries"):
        turnkit.Agent("c", output_policy=[42])
    with pytest.raises(ValueError, match="output_policy_mode must be one of fail, report, revise"):
        turnkit.Agent("d", output_policy_mode="warn")
    with pytest.raises(ValueError, match="output_retries must be an integer >= 0"):
        turnkit.Agent("e", output_retries=-1)
    with pytest.raises(ValueError, match='"revise" needs output_retries >= 1'):
        turnkit.Agent("f", output_policy_mode="revise", output_retries=0)


async def test_a_skill_is_an_output_policy_source(tk: TurnKit) -> None:
    """Behaviour §3.9 "Skill → OutputPolicy.from_skill": a Skill given as output_policy is a judge of the skill's
    content, named by its key; its revision request re-embeds that content as <skill key="memo_rules">."""
    rules = Skill("memo_rules", description="How memos end.", content="Every memo ends with a Recommendation.")
    verdicts = iter(
        [
            '{"approved": false, "violations": [{"rule": "recommendation", "message": "no Recommendation"}]}',
            '{"approved": true, "violations": []}',
        ]
    )
    drafts = iter(["Draft only", "Recommendation: ship it"])

    def respond(request: ModelRequest) -> Result:
        if request.metadata.get("purpose") == "output_policy":
            return Result.build(text=next(verdicts))
        return say(next(drafts))

    client = ScriptedClient(respond)
    agent = turnkit.Agent("skilled", model="scripted", client=client, output_policy=rules, output_retries=1)
    [policy] = agent.output_policy
    assert isinstance(policy, OutputPolicy) and (policy.name, policy.content) == ("memo_rules", rules.content)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Recommendation: ship it" and run.policy_clean is True
    judges = [r for r in client.requests if r.metadata.get("purpose") == "output_policy"]
    assert len(judges) == 2
    assert '<policy name="memo_rules">\nEvery memo ends with a Recommendation.\n</policy>' in judges[0].instructions
    [revision] = [m for m in await run.messages() if m.role == "user" and REVISION_TEXT in m.text]
    assert '<skill key="memo_rules">\nEvery memo ends with a Recommendation.\n</skill>' in revision.text
    assert "1. recommendation: no Recommendation" in revision.text
    with pytest.raises(ValueError, match="output policy content is required"):
        turnkit.Agent("empty_skill", output_policy=[Skill("blank")])


# -- answers given by a terminal tool (behaviour §3.2 phase tools → output, §3.9) -------------------------------------


@turnkit.tool(terminal=True)
def submit_memo(memo: str) -> str:
    """Submit the memo: ends the turn with it (the completion message falls back to the result)."""
    return memo


@turnkit.tool
def notify_team() -> str:
    """Proposed after the terminal tool: skipped."""
    return "notified"


def terminal_agent(name: str, *memos: str, **options: Any) -> tuple[turnkit.Agent, ScriptedClient]:
    """An agent whose model answers through ``submit_memo`` once per memo (a ``notify_team`` call after each)."""
    client = ScriptedClient([call_tools(("submit_memo", {"memo": m}), ("notify_team", {})) for m in memos])
    agent = turnkit.Agent(
        name,
        model="scripted",
        client=client,
        tools=[submit_memo, notify_team],
        output_policy=needs_recommendation,
        **options,
    )
    return agent, client


async def test_a_terminal_tools_answer_is_audited_in_fail_mode(tk: TurnKit) -> None:
    """T27 through a terminal tool: its completion message "Draft only" is the answer audited; the turn fails with
    TurnKit::OutputAudit, keeps the output and the audit, and output_policy.completed comes before turn.failed."""
    events: list[Event] = []
    recorded(events)
    agent, client = terminal_agent("terminal_strict", "Draft only")
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.output_text == "Draft only"
    assert run.error is not None and run.error["class"] == "TurnKit::OutputAudit"
    assert run.error["message"] == "output has no Recommendation"
    assert run.policy_clean is False and run.policy_audit is not None
    assert run.policy_audit["violations"][0]["rule"] == "needs_recommendation"
    assert client.calls == 1
    outcome = await tk.client.get_workflow_handle(run.id, result_type=TurnOutcome).result()
    assert (outcome.status, outcome.error_class) == ("failed", "TurnKit::OutputAudit")
    statuses = sorted(e.status for e in await run.tool_executions())
    assert statuses == ["cancelled", "completed"]  # the call after the terminal tool is still skipped
    types = [e.type for e in events]
    assert types.index("output_policy.completed") < types.index("turn.failed")
    assert not [e for e in events if e.type == "turn.completed"]


async def test_a_terminal_tools_answer_is_audited_in_report_mode(tk: TurnKit) -> None:
    """T26 through a terminal tool: report mode completes the turn with the completion message and records the
    dirty audit."""
    agent, _ = terminal_agent("terminal_report", "Draft only", output_policy_mode="report")
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Draft only"
    assert run.policy_clean is False and run.error is None
    assert run.policy_audit == {
        "clean": False,
        "violations": [{"rule": "needs_recommendation", "message": "output has no Recommendation", "metadata": {}}],
    }


async def test_a_terminal_tools_answer_gets_a_revision_request(tk: TurnKit) -> None:
    """T28 through a terminal tool: a dirty answer with a revision left goes back to the model as a revision request
    ending "Resubmit via submit_memo."; the second submission is clean and completes the turn after 2 model calls."""
    events: list[Event] = []
    recorded(events)
    agent, client = terminal_agent("terminal_reviser", "Draft only", "Recommendation: ship it", output_retries=1)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Recommendation: ship it"
    assert client.calls == 2 and run.policy_clean is True
    revisions = [m for m in await run.messages() if m.role == "user" and REVISION_TEXT in m.text]
    assert len(revisions) == 1 and revisions[0].metadata == {"source": "output_policy", "attempt": 1}
    assert revisions[0].text.endswith("Resubmit via submit_memo.")
    assert REVISION_TEXT in str(client.requests[1].messages[-1]["content"])
    state = run.record.options.state
    assert (state.revisions_used, state.iterations, state.terminal_tool_name) == (1, 2, "submit_memo")
    assert [(e.type, e.payload) for e in of_type(events, "output_policy.")] == [
        ("output_policy.revision", {"violation_count": 1, "attempt": 1}),
        ("output_policy.completed", {"clean": True, "violation_count": 0}),
    ]


async def test_a_constraint_that_raises_on_a_terminal_answer_fails_the_turn(tk: TurnKit) -> None:
    """A constraint that raises while auditing a terminal tool's answer fails the turn with ConfigError naming it,
    as it does for a plain answer (the finish activity records it; the model is asked once)."""

    def broken(output: str) -> None:
        raise RuntimeError("policy store unreachable")

    client = ScriptedClient([call_tools(("submit_memo", {"memo": "Draft only"}))])
    agent = turnkit.Agent("terminal_broken", model="scripted", client=client, tools=[submit_memo], output_policy=broken)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.error is not None
    assert run.error["class"] == "TurnKit::ConfigError"
    assert "output policy" in run.error["message"] and "policy store unreachable" in run.error["message"]
    assert client.calls == 1


async def test_a_terminal_answers_judge_cost_counts_against_max_spend(tk: TurnKit) -> None:
    """T34 through a terminal tool's audit: the main call (0.01) and the judge (0.02) over a max_spend of 0.025 fail
    the turn with "cost limit reached" right after the judge is charged, as on the model path: nothing is
    published, the cost stays, and the audit's verdict is not announced."""
    events: list[Event] = []
    recorded(events)
    main = call_tools(("submit_memo", {"memo": "Recommendation: ship it"}))
    main = main.model_copy(update={"usage": Usage(input_tokens=10, cost=0.01)})
    client = ScriptedClient(judge_and_main('{"approved": true, "violations": []}', main=main))
    agent = turnkit.Agent(
        "terminal_thrifty",
        model="scripted",
        client=client,
        tools=[submit_memo],
        output_policy=OutputPolicy("Memos end with a Recommendation."),
        max_spend=0.025,
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.output_text == ""  # Turn.output_text: "" when none was recorded
    assert run.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}
    assert run.cost.total == pytest.approx(0.03) and client.calls == 2
    assert [e.type for e in of_type(events, "output_policy.")] == [
        "output_policy.model.requested",
        "output_policy.model.completed",
    ]
    assert [e.type for e in events if e.type.startswith("turn.")][-1] == "turn.failed"


async def test_a_retried_terminal_finish_does_not_audit_or_revise_twice(engine: Engine) -> None:
    """turnkit.finish_turn retried after it committed a terminal answer's revision request: keyed by the execution
    id, it neither calls the judge again nor appends a second request, and the judge is charged once."""
    tk = engine.tk
    client = ScriptedClient(judge_and_main('{"approved": false, "violations": []}', main=say("unused")))
    agent = turnkit.Agent(
        "terminal_retried",
        model="scripted",
        client=client,
        tools=[submit_memo],
        output_policy=OutputPolicy("Memos end with a Recommendation."),
        output_retries=1,
    )
    turnkit.register(agent)
    conversation = await tk.conversation(agent)
    record = await turn_for_activities(tk, conversation, "Write the memo", status="running")
    async with tk.store.atomic() as tx:
        execution, _ = await tx.create_tool_execution(
            turn_id=record.id,
            tool_call_id="call_1",
            tool_name="submit_memo",
            arguments={"memo": "Draft only"},
            status="completed",
            result={"result": "Draft only"},
        )
    finish = FinishTurn(turn_id=record.id, status="completed", terminal_execution_id=execution.id)
    env = ActivityEnvironment()
    first = await env.run(TurnActivities(tk.store).finish_turn, finish)
    again = await env.run(TurnActivities(tk.store).finish_turn, finish)  # the retry, after the commit

    assert first.revised and again.revised
    assert client.calls == 1  # one judge call, never repeated
    messages = await conversation.messages()
    assert len([m for m in messages if m.role == "user" and REVISION_TEXT in m.text]) == 1
    assert [m.text for m in messages if m.role == "assistant"] == ["Draft only"]  # one completion message
    turn = await tk.store.load_turn(record.id)
    assert (turn.status, turn.options.state.phase, turn.options.state.revisions_used) == ("running", "model", 1)
    assert turn.cost == pytest.approx(0.02)


# -- every paid call once: the answer is committed before its audit (issue: judge failing once) -----------------------


def paid_calls(client: ScriptedClient, purpose: str | None) -> int:
    """How many of ``client``'s calls were answered for ``purpose`` (None: the turn's own model calls)."""
    return sum(1 for r in client.requests if r.metadata.get("purpose") == purpose)


async def test_a_judge_failing_once_does_not_pay_the_main_model_twice(tk: TurnKit) -> None:
    """Behaviour §3.9, a paid response is committed before anything else can fail: the judge's first call fails with
    an overloaded provider (a transient 529); the answer was committed before the judge was asked, so the retry asks
    the judge again and never the main model. The provider answered one main call (0.01) and one judge call (0.02):
    exactly what the turn was charged."""
    failed: list[str] = []
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, output_tokens=3, cost=0.01))

    def respond(request: ModelRequest) -> Result:
        if request.metadata.get("purpose") == "output_policy":
            if not failed:
                failed.append(request.model)
                raise turnkit.TransientModelError("overloaded (529)")
            return Result.build(text='{"approved": true, "violations": []}', usage=Usage(input_tokens=5, cost=0.02))
        return main

    client = ScriptedClient(respond)
    agent = turnkit.Agent("judged_flaky", model="scripted", client=client, output_policy=OutputPolicy("Be brief."))
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.policy_clean is True, run.error
    assert failed and paid_calls(client, None) == 1  # the main model: asked once
    assert paid_calls(client, "output_policy") == 2  # the judge: failed once, answered once
    assert run.cost.total == pytest.approx(0.03)  # 1 main + 1 answered judge: every answered call charged once
    assert [m.text for m in await run.messages() if m.role == "assistant"] == ["Recommendation: ship it"]


async def test_judges_are_not_asked_once_the_answer_is_over_budget(tk: TurnKit) -> None:
    """Behaviour §6.2, budgets are checked before every paid call: an answer (0.05) that takes the tree over
    max_spend (0.025) fails the turn with "cost limit reached" before any judge is asked, so the spend passes the
    limit by the one call that was in flight and no more (0.05, not 0.07)."""
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, cost=0.05))
    client = ScriptedClient(judge_and_main('{"approved": true, "violations": []}', main=main))
    agent = turnkit.Agent(
        "judged_broke", model="scripted", client=client, output_policy=OutputPolicy("Be brief."), max_spend=0.025
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}
    assert paid_calls(client, "output_policy") == 0 and paid_calls(client, None) == 1
    assert run.cost.total == pytest.approx(0.05)


def two_judges(main: Result, *, flaky: str | None = None) -> tuple[ScriptedClient, list[str]]:
    """A client for an agent with the judges ``first`` and ``second`` (each approving, 0.02 a call) and ``main`` for
    the turn's own calls; the judge named ``flaky`` fails its first call with a transient error. Returns the client
    and the names of the judges asked, one per call."""
    asked: list[str] = []

    def respond(request: ModelRequest) -> Result:
        name = request.metadata.get("output_policy")
        if name is None:
            return main
        asked.append(str(name))
        if name == flaky and asked.count(name) == 1:
            raise turnkit.TransientModelError("overloaded (529)")
        return Result.build(text='{"approved": true, "violations": []}', usage=Usage(input_tokens=5, cost=0.02))

    return ScriptedClient(respond), asked


JUDGES = [OutputPolicy("Be brief.", name="first"), OutputPolicy("Be kind.", name="second")]


async def test_a_judge_failing_once_does_not_pay_the_judges_before_it_again(tk: TurnKit) -> None:
    """Each judge call is its own activity whose answer and charge commit together: the second judge fails once, and
    the retry asks only it again; the first judge and the main model are each asked once and charged once."""
    events: list[Event] = []
    recorded(events)
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, cost=0.01))
    client, asked = two_judges(main, flaky="second")
    agent = turnkit.Agent("judged_twice", model="scripted", client=client, output_policy=JUDGES)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.policy_clean is True, run.error
    assert asked == ["first", "second", "second"] and paid_calls(client, None) == 1
    assert run.cost.total == pytest.approx(0.05)  # 0.01 + 0.02 + 0.02: the failed call was never answered
    assert len(of_type(events, "output_policy.model.completed")) == 2


async def test_no_judge_is_asked_once_a_judges_charge_passed_the_limit(tk: TurnKit) -> None:
    """Behaviour §6.2 before every paid call: the first judge's charge takes the tree (0.01 + 0.02) over max_spend
    0.025; the second judge is never asked and the turn fails "cost limit reached", its answer kept."""
    main = say("Recommendation: ship it", usage=Usage(input_tokens=10, cost=0.01))
    client, asked = two_judges(main)
    agent = turnkit.Agent("judged_stop", model="scripted", client=client, output_policy=JUDGES, max_spend=0.025)
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}
    assert asked == ["first"] and run.cost.total == pytest.approx(0.03)
    assert [m.text for m in await run.messages() if m.role == "assistant"] == ["Recommendation: ship it"]


async def test_a_terminal_answers_judge_failing_once_is_asked_again_alone(tk: TurnKit) -> None:
    """A terminal tool's answer is judged one call per finish attempt: the second judge fails once; the retry asks
    only it again (the first judge's answer and charge were committed), the tool runs once."""
    main = call_tools(("submit_memo", {"memo": "Recommendation: ship it"}))
    main = main.model_copy(update={"usage": Usage(input_tokens=10, cost=0.01)})
    client, asked = two_judges(main, flaky="second")
    agent = turnkit.Agent(
        "terminal_judged_twice", model="scripted", client=client, tools=[submit_memo], output_policy=JUDGES
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "completed" and run.output_text == "Recommendation: ship it", run.error
    assert asked == ["first", "second", "second"] and paid_calls(client, None) == 1
    assert run.cost.total == pytest.approx(0.05) and run.policy_clean is True
    assert [e.status for e in await run.tool_executions()] == ["completed"]


async def test_a_terminal_answers_second_judge_is_not_asked_over_the_limit(tk: TurnKit) -> None:
    """The terminal path checks the budget before each judge too: after the first judge's charge (0.01 + 0.02 over
    0.025) the second is never asked, and the turn fails "cost limit reached"."""
    main = call_tools(("submit_memo", {"memo": "Recommendation: ship it"}))
    main = main.model_copy(update={"usage": Usage(input_tokens=10, cost=0.01)})
    client, asked = two_judges(main)
    agent = turnkit.Agent(
        "terminal_judged_stop",
        model="scripted",
        client=client,
        tools=[submit_memo],
        output_policy=JUDGES,
        max_spend=0.025,
    )
    run = await tk.run(agent, "Write the memo")
    assert run.status == "failed" and run.error == {"class": "TurnKit::BudgetError", "message": "cost limit reached"}
    assert asked == ["first"] and run.cost.total == pytest.approx(0.03)


async def test_a_retried_audit_activity_asks_no_judge_twice(engine: Engine) -> None:
    """turnkit.model commits the answer and says "audit"; turnkit.audit asks the judge, commits its answer and charge
    and asks for the revision. Retried after each commit (the same request id), neither activity calls a model
    again, and neither a second revision request nor a second charge is written."""
    tk = engine.tk
    main = say("Draft only", usage=Usage(input_tokens=10, cost=0.01))
    client = ScriptedClient(judge_and_main('{"approved": false, "violations": []}', main=main))
    agent = turnkit.Agent(
        "audit_retried", model="scripted", client=client, output_policy=OutputPolicy("Be brief."), output_retries=1
    )
    turnkit.register(agent)
    conversation = await tk.conversation(agent)
    record = await turn_for_activities(tk, conversation, "Write the memo")
    model_call = ModelCall(turn_id=record.id, root_turn_id=record.id, request_id="req_1", iteration=1, audit_apart=True)
    audit_call = AuditCall(turn_id=record.id, root_turn_id=record.id, request_id="req_1")
    env = ActivityEnvironment()

    answered = await env.run(ModelActivities(tk.store).model, model_call)
    assert answered.outcome == "audit"
    held = await tk.store.load_turn(record.id)
    assert held.cost == pytest.approx(0.01) and held.options.state.awaiting_audit  # committed before any judge
    assert (await env.run(ModelActivities(tk.store).model, model_call)).outcome == "audit"  # the model's retry
    first = await env.run(AuditActivities(tk.store).audit, audit_call)
    again = await env.run(AuditActivities(tk.store).audit, audit_call)  # the audit's retry, after its commit

    assert first.outcome == again.outcome == "tools" and first.message_id == again.message_id == answered.message_id
    assert client.calls == 2  # one main call, one judge call
    revisions = [m for m in await conversation.messages() if m.role == "user" and REVISION_TEXT in m.text]
    assert len(revisions) == 1
    turn = await tk.store.load_turn(record.id)
    state = turn.options.state
    assert (state.revisions_used, state.phase, state.awaiting_audit) == (1, "model", False)
    assert [a["policy"] for a in state.judge_answers] == ["output_policy"]
    assert turn.cost == pytest.approx(0.03)


async def test_a_standalone_paints_judge_failing_once_does_not_paint_again(tk: TurnKit) -> None:
    """Behaviour §3.12 step 6 with a paid call committed before anything can fail: a standalone paint's judge fails
    once (a transient 529); the image and its charge were committed first, so the retried attempt finds the image
    and asks only the judge again. The image provider painted once, and the turn is charged the image (0.05) and
    the one answered judge call (0.02)."""
    png = b"\x89PNG\r\n\x1a\n" + b"IHDR" + bytes(range(64))
    images = ScriptedClient([], images=[image(png, usage=Usage(output_tokens=5, cost=0.05))] * 2)
    failed: list[str] = []

    def respond(request: ModelRequest) -> Result:
        if not failed:
            failed.append(request.model)
            raise turnkit.TransientModelError("overloaded (529)")
        return Result.build(text='{"approved": true, "violations": []}', usage=Usage(input_tokens=5, cost=0.02))

    judge = OutputPolicy("Images only.", model="judge", client=ScriptedClient(respond))
    agent = turnkit.Agent("judged_standalone", model="scripted", client=ScriptedClient([]), output_policy=[judge])
    prepared = await (await tk.conversation(agent)).build_turn("paint a cat")
    painted = await prepared.paint("a cat", model="scripted-image", client=images)
    assert painted.status == "completed" and painted.policy_clean is True, painted.error
    assert failed and len(images.paint_requests) == 1  # painted once, judged twice (once failed)
    assert painted.cost.total == pytest.approx(0.07)
    assert [m.kind for m in await painted.messages()].count("image") == 1


async def test_steering_while_the_output_is_checked_revises_before_publishing(tk: TurnKit) -> None:
    """T95: steering inserted while the output policy's judge checks the first candidate: that candidate is not
    published, a second model call has "revise before publishing" as its last message, and the output is
    "revised" (itself checked before it is published)."""
    approve = '{"approved": true, "violations": []}'
    judge_client = HeldModel(Result.build(text=approve), then=approve)
    judge = OutputPolicy("Be accurate.", model="judge", client=judge_client)
    model = ScriptedClient(["first draft", "revised"])
    agent = turnkit.Agent("t95_writer", model="scripted", client=model, output_policy=[judge])
    conversation = await tk.conversation(agent)
    turn = await conversation.ask("write", wait=False)
    await asyncio.wait_for(judge_client.entered.wait(), 30)  # the judge holds the first candidate's check

    await turn.steer("revise before publishing", key="t95")
    judge_client.released.set()
    done = await turn.result(timeout=60)

    assert done.status == "completed" and done.output_text == "revised", done.error
    assert model.calls == 2
    assert model.requests[1].messages[-1] == {"role": "user", "content": "revise before publishing"}
    assert len(judge_client.requests) == 2  # each candidate checked once
    assert "first draft" in judge_client.requests[0].messages[-1]["content"]
    assert "revised" in judge_client.requests[1].messages[-1]["content"]
    assert [m.text for m in await conversation.messages() if m.role == "user"] == ["write", "revise before publishing"]
