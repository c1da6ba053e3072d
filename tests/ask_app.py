"""Application module for the ``turnkit ask`` tests (``--app tests.ask_app``): a lead agent that calls a tool, then
a sub-agent, then answers; and an agent whose model fails. Both on the scripted offline model."""

from __future__ import annotations

import os
from typing import Any

import turnkit
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe")
def lookup(topic: str) -> dict[str, Any]:
    """Look a topic up.

    Args:
        topic: What to look up.
    """
    return {"topic": topic, "fact": f"{topic} is durable", "pid": os.getpid()}


def _lead(request: turnkit.ModelRequest) -> turnkit.Result:
    results = [m for m in request.messages if m["role"] == "tool"]
    if not results:
        return call_tools(("lookup", {"topic": "temporal"}), text="Looking it up.")
    if len(results) == 1:
        return call_tools(("checker", {"task": "check the fact"}))
    return turnkit.Result.build(text=f"The answer: {results[0]['content']} (checked)")


checker = turnkit.Agent(
    "checker", model="scripted", client=ScriptedClient(lambda request: turnkit.Result.build(text="the fact holds"))
)
lead = turnkit.register(
    turnkit.Agent("lead", model="scripted", tools=[lookup], sub_agents=[checker], client=ScriptedClient(_lead))
)


def _broken(request: turnkit.ModelRequest) -> turnkit.Result:
    raise turnkit.ModelError("the provider said no")


broken = turnkit.register(turnkit.Agent("broken", model="scripted", client=ScriptedClient(_broken)))
