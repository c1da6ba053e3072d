"""Application module for the streaming tests (``--app tests.stream_app``): an agent on :class:`OpenAIClient`, pointed
at the wire-format provider server whose address the test gives in ``$TURNKIT_STREAM_PROVIDER_URL``."""

from __future__ import annotations

import os

import turnkit
from turnkit.providers import OpenAIClient

#: The provider server's address (``tests.provider_server.ProviderServer.url``); unset in a process that only asks.
PROVIDER_URL = os.environ.get("TURNKIT_STREAM_PROVIDER_URL", "http://127.0.0.1:9")

streamer = turnkit.register(
    turnkit.Agent(
        "remote-streamer", model="gpt-stream", client=OpenAIClient(api_key="sk-test", base_url=f"{PROVIDER_URL}/v1")
    )
)
