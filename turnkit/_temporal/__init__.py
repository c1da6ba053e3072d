"""Temporal glue (private): connecting to a cluster or the embedded dev server, the worker process, the sandbox runner,
heartbeat pacing, tracing interceptors, search-attribute registration, and fetching and replaying histories.

Applications use :class:`turnkit.TurnKitPlugin`, :func:`turnkit.connect` and ``turnkit worker`` instead.
"""
