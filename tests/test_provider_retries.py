"""Provider calls as Temporal users expect (issue 11): the model activity's retry policy is the only retry loop.

The clients build their SDK clients with ``max_retries=0``, so one model activity attempt makes exactly one HTTP
call; a provider's ``retry-after`` (``retry-after-ms`` / ``retry-after`` on 429, 503 or 529) becomes the delay of the
activity's next attempt (``ApplicationError(next_retry_delay=...)``) instead of the retry policy's backoff. Every
request goes to :class:`tests.provider_server.ProviderServer`, which records when each attempt arrived.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

import turnkit
from tests.provider_server import (
    ProviderServer,
    Reply,
    anthropic_error,
    anthropic_message,
    anthropic_text,
    gemini_error,
    gemini_response,
    openai_error,
    openai_response,
    openai_text,
)
from turnkit.model import ModelRequest
from turnkit.providers import AnthropicClient, GeminiClient, OpenAIClient, TransientModelError
from turnkit.providers._common import retry_after
from turnkit.runtime import TurnKit

# The model activity's retry policy starts at 1 s: a provider delay well above it shows which one was used.
DELAY = 3.0
# The dev server's timer, task dispatch and the worker's poll: how late an attempt may come after the delay.
LATE = 2.5


@pytest.fixture
def server() -> Iterator[ProviderServer]:
    with ProviderServer() as running:
        yield running


def openai_client(server: ProviderServer) -> OpenAIClient:
    """A client built by TurnKit (no ready SDK client): the SDK's retries are TurnKit's default."""
    return OpenAIClient(api_key="sk-test", base_url=f"{server.url}/v1")


def anthropic_client(server: ProviderServer) -> AnthropicClient:
    return AnthropicClient(api_key="sk-ant-test", base_url=server.url)


def throttled(reply: Reply, **headers: str) -> Reply:
    reply.headers.update(headers)
    return reply


def request() -> ModelRequest:
    return ModelRequest(model="test-model", messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "2500"}, 2.5),
        ({"retry-after-ms": "2500", "retry-after": "9"}, 2.5),  # the precise header wins
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": "soon"}, None),
        ({"retry-after": "-1"}, None),
        ({"retry-after": "inf"}, None),
        ({}, None),
    ],
)
def test_retry_after_headers(headers: dict[str, str], expected: float | None) -> None:
    """Issue 11: the delay a provider asks for, from either header; nonsense is no delay."""
    assert retry_after(headers) == expected


def test_retry_after_as_an_http_date() -> None:
    """Issue 11: ``retry-after`` may be an HTTP date; the delay is measured from now (never negative)."""
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    later = format_datetime(now + timedelta(seconds=7), usegmt=True)
    assert retry_after({"retry-after": later}, now=now.timestamp()) == 7.0
    assert retry_after({"retry-after": later}, now=(now + timedelta(seconds=60)).timestamp()) == 0.0


async def test_openai_429_is_one_http_attempt_with_the_providers_delay(server: ProviderServer) -> None:
    """Issue 11: a 429 reaches TurnKit after one HTTP call (no SDK retries), carrying the provider's delay."""
    server.script(throttled(openai_error(429, "slow down", type="rate_limit_error"), **{"retry-after": "3"}))
    client = openai_client(server)
    try:
        with pytest.raises(TransientModelError, match="RateLimitError") as caught:
            await client.chat(request())
    finally:
        await client.close()
    assert caught.value.retry_after == 3.0
    assert len(server.requests) == 1


async def test_anthropic_529_is_one_http_attempt_with_the_providers_delay(server: ProviderServer) -> None:
    """Issue 11: an overloaded (529) answer reaches TurnKit after one HTTP call, with ``retry-after-ms``."""
    server.script(throttled(anthropic_error(529, "overloaded", type="overloaded_error"), **{"retry-after-ms": "1500"}))
    client = anthropic_client(server)
    try:
        with pytest.raises(TransientModelError, match="overloaded") as caught:
            await client.chat(request())
    finally:
        await client.close()
    assert caught.value.retry_after == 1.5
    assert len(server.requests) == 1


async def test_a_500_without_retry_after_has_no_delay(server: ProviderServer) -> None:
    """Issue 11: without the header the retry policy's own backoff applies (no delay is invented)."""
    server.script(openai_error(500, "boom", type="server_error"))
    client = openai_client(server)
    try:
        with pytest.raises(TransientModelError) as caught:
            await client.chat(request())
    finally:
        await client.close()
    assert caught.value.retry_after is None
    assert len(server.requests) == 1


def agent(client: turnkit.Client) -> turnkit.Agent:
    return turnkit.Agent("retry-after", model="test-model", instructions="Answer.", client=client)


async def model_attempts(tk: TurnKit, turn_id: str) -> list[int]:
    """The attempt number that finished each ``turnkit.model`` activity of a turn, from its workflow history."""
    model_events: set[int] = set()
    attempts: list[int] = []
    async for event in tk.client.get_workflow_handle(turn_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_type.name == "turnkit.model":
                model_events.add(event.event_id)
        elif event.HasField("activity_task_started_event_attributes"):
            started = event.activity_task_started_event_attributes
            if started.scheduled_event_id in model_events:
                attempts.append(started.attempt)
    return attempts


async def test_openai_retry_after_is_the_model_activitys_next_retry_delay(tk: TurnKit, server: ProviderServer) -> None:
    """Issue 11, on a real dev server turn: a 429 with ``retry-after: 3`` costs one HTTP call, and the next model
    activity attempt reaches the provider 3 s later (not after the policy's 1 s backoff)."""
    server.script(
        throttled(openai_error(429, "slow down", type="rate_limit_error"), **{"retry-after": f"{DELAY:g}"}),
        openai_response(openai_text("Back.")),
    )
    turn = await (await tk.conversation(agent(openai_client(server)))).ask("hi")

    assert turn.status == "completed", turn.error
    assert turn.output_text == "Back."
    assert await model_attempts(tk, turn.id) == [2]  # the model activity's retry, not the SDK's
    first, second = server.requests  # one HTTP attempt per activity attempt
    gap = second.at - first.at
    assert DELAY - 0.1 <= gap <= DELAY + LATE, gap


async def test_anthropic_retry_after_ms_is_the_model_activitys_next_retry_delay(
    tk: TurnKit, server: ProviderServer
) -> None:
    """Issue 11, on a real dev server turn: Anthropic's 529 with ``retry-after-ms`` delays the next attempt."""
    server.script(
        throttled(
            anthropic_error(529, "overloaded", type="overloaded_error"), **{"retry-after-ms": f"{DELAY * 1e3:g}"}
        ),
        anthropic_message(anthropic_text("Back.")),
    )
    turn = await (await tk.conversation(agent(anthropic_client(server)))).ask("hi")

    assert turn.status == "completed", turn.error
    assert await model_attempts(tk, turn.id) == [2]
    first, second = server.requests
    gap = second.at - first.at
    assert DELAY - 0.1 <= gap <= DELAY + LATE, gap


async def test_gemini_retry_info_is_the_model_activitys_next_retry_delay(tk: TurnKit, server: ProviderServer) -> None:
    """Issue 11 and 39, on a real dev server turn: Gemini's 429 carries its delay in the body (``RetryInfo``), not in
    a header; it delays the next model activity attempt all the same, and the SDK made one HTTP call."""
    server.script(
        gemini_error(429, "quota exceeded", code="RESOURCE_EXHAUSTED", retry_delay=f"{DELAY:g}s"),
        gemini_response({"text": "Back."}),
    )
    turn = await (await tk.conversation(agent(GeminiClient(api_key="g-test", base_url=server.url)))).ask("hi")

    assert turn.status == "completed", turn.error
    assert await model_attempts(tk, turn.id) == [2]
    first, second = server.requests
    gap = second.at - first.at
    assert DELAY - 0.1 <= gap <= DELAY + LATE, gap


async def test_attempts_run_out_after_retry_after_delays_and_the_turn_fails(
    tk: TurnKit, server: ProviderServer
) -> None:
    """Issue 11: with ``model_max_attempts=2`` a provider that keeps answering 429 gets exactly two HTTP calls, one
    retry-after apart, and the turn fails as a ModelError."""
    turnkit.configure(model_max_attempts=2)
    server.script(
        *[throttled(openai_error(429, "slow down", type="rate_limit_error"), **{"retry-after": "2"}) for _ in range(2)]
    )
    turn = await (await tk.conversation(agent(openai_client(server)))).ask("hi")

    assert turn.status == "failed"
    assert turn.error is not None and turn.error["class"] == "TurnKit::ModelError"
    assert turn.error["message"].startswith("RateLimitError: ")
    first, second = server.requests
    assert 1.9 <= second.at - first.at <= 2.0 + LATE
