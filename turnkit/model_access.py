"""Model access checked when a worker starts: a missing API key or an unknown model is reported then, as a
:class:`~turnkit.kernel.errors.ModelAccessError` naming the agent and the model, instead of as a failed turn at the
first model call.

Which agents: those defined with ``Agent(..., validate=True)``, and every registered agent when
``settings.validate_models`` is on (``turnkit worker --validate-models``). Each distinct (client, effective model)
pair is checked once with ``await client.validate(model=...)`` (the provider clients of :mod:`turnkit.providers`
make one cheap call: a model lookup). A client without ``validate`` (a scripted test client, an application's own)
is skipped. Off by default, so offline workers and the demo never call out.

``Agent()`` and ``turnkit.register`` are synchronous and run at import time, before any event loop, so the check
runs at the worker's start (``turnkit worker``, ``tk.worker()``), where it can await. An agent with ``validate=True``
first registered by ``tk.conversation(agent)`` while that connection runs a worker is checked then, once.
:func:`validate_models` runs the check anywhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from turnkit.agent import Agent, registered_agents
from turnkit.config import settings
from turnkit.kernel.errors import ModelAccessError, TransientModelError

__all__ = ["ValidatingClient", "validate_models"]

log = logging.getLogger("turnkit.model_access")


@runtime_checkable
class ValidatingClient(Protocol):
    """A model client that can check its access to a model (the provider clients of :mod:`turnkit.providers`)."""

    async def validate(self, *, model: str) -> None:
        """Raise :class:`~turnkit.kernel.errors.ModelAccessError` naming ``model`` when it cannot be called."""
        ...


async def validate_models(agents: Iterable[Agent] | None = None, *, every: bool | None = None) -> list[str]:
    """Validate the client and effective model of agents.

    Args:
        agents: The agents to consider; default the registered ones.
        every: Validate all of them; default ``settings.validate_models``. Either way an agent defined with
            ``validate=True`` is validated.

    Returns:
        The models validated, in order (each ``"<agent>: <model>"``).

    Raises:
        ModelAccessError: A client has no key, or the provider refused the key or does not know the model; the
            message names the agent and the model.
        ConfigError: A chosen agent has no client (neither its own nor ``settings.client``).

    A provider that does not answer (or answers 429 / 5xx) is logged as a warning and not held against the model: the
    turns' own retries deal with an outage.
    """
    every = settings.validate_models if every is None else every
    chosen = list(registered_agents().values() if agents is None else agents)
    checked: set[tuple[int, str]] = set()
    validated: list[str] = []
    for agent in chosen:
        if not (every or agent.validate):
            continue
        client = agent.effective_client
        model = agent.effective_model
        if not isinstance(client, ValidatingClient) or (id(client), model) in checked:
            continue
        checked.add((id(client), model))
        try:
            await client.validate(model=model)
        except ModelAccessError as err:
            raise ModelAccessError(f'agent "{agent.name}": {err}') from err
        except TransientModelError as err:
            log.warning('could not validate model %s of agent "%s": %s', model, agent.name, err)
            continue
        validated.append(f"{agent.name}: {model}")
    if validated:
        log.info("models validated: %s", ", ".join(validated))
    return validated
