"""Application module for the skill restart test: imported by real worker processes (``worker.py --app
tests.skills_app``).

It imports :mod:`tests.crash_app` for its traces (``$TURNKIT_CRASH_DIR``) and for its event hook, which freezes a worker
right after the first committed event named by ``TURNKIT_CRASH_AFTER``, so the test can kill it there.
"""

from __future__ import annotations

from typing import Any

import turnkit
from tests.crash_app import record
from turnkit.testing import ScriptedClient, call_tools


@turnkit.tool(recovery="replay_safe", timeout=4)
def skill_read(path: str) -> dict[str, Any]:
    """Read a document (owned by the ``reading`` skill).

    Args:
        path: Which document.
    """
    record("skill_read", path)
    return {"text": f"contents of {path}"}


reading = turnkit.Skill(
    "reading", name="Reading", description="Read documents.", content="Read before answering.", tools=[skill_read]
)


def _script(request: turnkit.ModelRequest) -> turnkit.Result:
    """Load the skill, then call its tool, then answer; every request's tool names are traced."""
    record("skill_model", ",".join(request.tool_names))
    results = [m for m in request.messages if m["role"] == "tool"]
    if not results:
        return call_tools(("load_skill", {"key": "reading"}))
    if len(results) == 1:
        return call_tools(("skill_read", {"path": "a.txt"}))
    return turnkit.Result.build(text="read it")


reader = turnkit.register(
    turnkit.Agent("skill_reader", model="scripted", available_skills=[reading], client=ScriptedClient(_script))
)
