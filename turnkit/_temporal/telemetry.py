"""The Temporal runtime of a process that exports metrics or logs JSON: Prometheus and Core's log forwarding.

Temporal's SDK keeps its metrics (and the meter TurnKit records its own through, :mod:`turnkit.kernel.metrics`) in a
``Runtime``, which must exist before a client connects: ``TurnKitPlugin(metrics=...)`` hands it to the connection,
so ``connect(metrics_port=...)`` and ``turnkit worker --metrics-port`` both serve ``http://<bind>:<port>/metrics``.
One runtime per bind address per process: a second connection with the same one shares it (a second HTTP server on
the same port could not bind).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from temporalio.runtime import (
    LogForwardingConfig,
    LoggingConfig,
    PrometheusConfig,
    Runtime,
    TelemetryConfig,
    TelemetryFilter,
)

from turnkit._temporal.logs import json_logging
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.metrics import BUCKETS

__all__ = ["DEFAULT_METRICS_BIND", "metrics_address", "telemetry_runtime"]

#: Where a metrics endpoint listens unless told otherwise: every interface, so that Prometheus can scrape a worker
#: in a container (``$TURNKIT_METRICS_BIND`` or ``metrics_bind`` to narrow it).
DEFAULT_METRICS_BIND = "0.0.0.0"

_runtimes: dict[str | None, Runtime] = {}


def metrics_address(
    port: int | None, bind: str | None = None, *, environ: Mapping[str, str] | None = None
) -> str | None:
    """``host:port`` of the metrics endpoint for ``port`` (None: no endpoint), on ``bind`` (default
    ``$TURNKIT_METRICS_BIND``, else all interfaces).

    Raises:
        ConfigError: ``port`` is not a port number (1 to 65535).
    """
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise ConfigError(f"metrics port must be a port number (1 to 65535), got {port!r}")
    env = os.environ if environ is None else environ
    host = bind or env.get("TURNKIT_METRICS_BIND") or DEFAULT_METRICS_BIND
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def telemetry_runtime(metrics: str | None) -> Runtime | None:
    """The runtime a client of this process connects with: Prometheus at ``metrics`` (``host:port``) when given, and
    Core's own log lines forwarded to Python's logging (logger ``temporalio.core``) when logs are JSON; None when
    neither (the SDK's default runtime then).

    Raises:
        ConfigError: the metrics endpoint cannot listen there (the port is taken, the address is not this host's).
    """
    forward = json_logging()
    if metrics is None and not forward:
        return None
    runtime = _runtimes.get(metrics)  # by endpoint: a second server could not bind its port
    if runtime is None:
        logging_config = LoggingConfig.default
        if forward:
            logging_config = LoggingConfig(
                filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                forwarding=LogForwardingConfig(logger=logging.getLogger("temporalio.core")),
            )
        prometheus = None
        if metrics:
            buckets = {name: list(bounds) for name, bounds in BUCKETS.items()}
            prometheus = PrometheusConfig(bind_address=metrics, histogram_bucket_overrides=buckets)
        try:
            runtime = Runtime(telemetry=TelemetryConfig(logging=logging_config, metrics=prometheus))
        except Exception as err:  # the bridge's error: a port in use, an address that is not ours
            raise ConfigError(f"the metrics endpoint cannot listen on {metrics}: {err}") from err
        _runtimes[metrics] = runtime
    return runtime
