"""Benchmarks: ``python -m bench.turn_latency`` (``make bench``)."""
