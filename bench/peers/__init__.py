"""The same agent workload on TurnKit and on the two Temporal agent integrations a team compares it with.

``make bench-peers`` (= ``python -m bench.peers``) runs, round-robin in one command:

- the OpenAI Agents SDK on Temporal (``temporalio-openai-agents``, :mod:`bench.peers.openai_agents_app`);
- Pydantic AI's Temporal durable execution (``pydantic-ai-slim[temporal]``, :mod:`bench.peers.pydantic_ai_app`);
- TurnKit (:mod:`bench.peers.turnkit_app`), on SQLite and optionally PostgreSQL.

The workload (:mod:`bench.peers.workload`) is one turn of K tool-calling iterations and a final answer, with an
offline scripted model that still runs as a Temporal activity in each system. Each system runs in a subprocess of
its own (:mod:`bench.peers.serve`) with a dev server of its own; the driver (:mod:`bench.peers.__main__`) sends
them the same measurements in turn and prints one table. The peers come with the optional ``bench`` extra.
"""
