"""The agents of ``bench.scale`` (issue 37 target 7), imported by its worker and client processes alike.

``scale_lead`` answers each turn in two model calls on the scripted offline model: the first asks both sub-agents
at once (two tool calls in one response, so they run in parallel), the second answers from their results. Each
sub-agent (``scale_scout``, ``scale_checker``) answers in one model call. A root turn is four model calls.

Every model call is counted in :data:`MODEL_CALLS` (by agent), so that a worker process can say how many it made.
"""

from __future__ import annotations

import threading
from collections import Counter

import turnkit
from turnkit.testing import ScriptedClient, call_tools

#: Model calls made in this process, by agent name (the worker processes report theirs).
MODEL_CALLS: Counter[str] = Counter()
_lock = threading.Lock()  # the scripted clients may be called from the activity executor's threads

#: Model calls per root turn: the lead's two and one per sub-agent.
CALLS_PER_TURN = 4


def _count(agent: str) -> None:
    with _lock:
        MODEL_CALLS[agent] += 1


def _sub_agent(name: str, answer: str) -> turnkit.Agent:
    def respond(_request: turnkit.ModelRequest) -> turnkit.Result:
        _count(name)
        return turnkit.Result.build(text=answer, usage=turnkit.Usage(input_tokens=10, output_tokens=3))

    return turnkit.Agent(
        name, description=f"The {name} sub-agent.", model="scripted", client=ScriptedClient(respond, record=False)
    )


scout = _sub_agent("scale_scout", "scouted")
checker = _sub_agent("scale_checker", "checked")


def _lead(request: turnkit.ModelRequest) -> turnkit.Result:
    _count("scale_lead")
    # A turn starts from its user message; the sub-agents' results come back as tool messages. Earlier turns'
    # messages are in the request too, so only the last message tells which step this call is.
    if request.messages[-1]["role"] == "tool":
        return turnkit.Result.build(text="done", usage=turnkit.Usage(input_tokens=20, output_tokens=2))
    return call_tools(("scale_scout", {"task": "scout"}), ("scale_checker", {"task": "check"}))


lead = turnkit.register(
    turnkit.Agent(
        "scale_lead", model="scripted", sub_agents=[scout, checker], client=ScriptedClient(_lead, record=False)
    )
)
