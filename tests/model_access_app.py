"""A worker app for tests/test_model_access.py: one agent on a Gemini client that validates at the worker's start.

``$MODEL_ACCESS_BASE_URL`` is the local wire-format server the client talks to.
"""

import os

import turnkit
from turnkit.providers import GeminiClient

turnkit.register(
    turnkit.Agent(
        "checked-at-start",
        model="gemini-checked",
        client=GeminiClient(base_url=os.environ.get("MODEL_ACCESS_BASE_URL")),
    )
)
