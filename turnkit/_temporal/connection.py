"""Temporal connection settings: explicit options over Temporal's environment configuration.

Every entry point (``turnkit.connect()``, ``worker.py`` and each ``turnkit`` verb) builds its ``Client.connect``
keyword arguments here, so they all read the same settings the same way. The sources, weakest first:

1. the profile in Temporal's TOML config file (``$TEMPORAL_CONFIG_FILE``, else ``~/.config/temporalio/temporal.toml``;
   profile ``$TEMPORAL_PROFILE``, else ``default``);
2. the ``TEMPORAL_*`` environment variables (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
   ``TEMPORAL_TLS``, ``TEMPORAL_TLS_CLIENT_CERT_PATH``, …), read by :mod:`temporalio.envconfig`;
3. explicit arguments (``--address``, ``connect(temporal_address=…)``).

The store and the task queue stay TurnKit's own (``TURNKIT_DATABASE_URL``, ``TURNKIT_TASK_QUEUE``).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from temporalio.envconfig import ClientConfig

from turnkit.kernel.errors import ConfigError

__all__ = ["add_connection_arguments", "client_options", "client_options_from_arguments"]


def client_options(
    *,
    address: str | None = None,
    namespace: str | None = None,
    api_key: str | None = None,
    profile: str | None = None,
    config_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The keyword arguments for ``temporalio.client.Client.connect``: envconfig's profile, then the arguments given.

    ``target_host`` is absent when no address is configured anywhere (``connect()`` then starts the embedded dev
    server); ``namespace`` is always present (``default`` unless configured). An API key turns TLS on, as in
    envconfig.

    Args:
        address: ``host:port`` of the Temporal frontend; wins over the profile and ``TEMPORAL_ADDRESS``.
        namespace: Wins over the profile and ``TEMPORAL_NAMESPACE``.
        api_key: Wins over the profile and ``TEMPORAL_API_KEY``.
        profile: The config file's profile; default ``$TEMPORAL_PROFILE``, else ``default``.
        config_file: The TOML config file; default ``$TEMPORAL_CONFIG_FILE``, else Temporal's default location.
        environ: The environment to read instead of ``os.environ`` (tests).

    Raises:
        ConfigError: The config file named does not exist, the profile named is not in it, or it does not parse.
    """
    env = dict(os.environ if environ is None else environ)
    named = config_file or env.get("TEMPORAL_CONFIG_FILE")
    # envconfig silently ignores a missing file; a typo in its name must not fall back to an embedded dev server.
    if named and not Path(named).is_file():
        raise ConfigError(f"Temporal config file not found: {named}")
    try:
        loaded = ClientConfig.load_client_connect_config(
            profile=profile,
            config_file=str(config_file) if config_file else None,
            override_env_vars=env,
        )
    except RuntimeError as error:  # the SDK bridge's ConfigError (a RuntimeError): bad TOML, unknown profile
        raise ConfigError(f"Temporal connection settings: {error}") from error
    options: dict[str, Any] = dict(loaded)
    if address:
        options["target_host"] = address
    if namespace:
        options["namespace"] = namespace
    if api_key:
        options["api_key"] = api_key
        options.setdefault("tls", True)
    options.setdefault("namespace", "default")
    return options


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    """Add ``--address``, ``--namespace``, ``--profile`` and ``--config-file`` (each defaults to envconfig).

    API keys and TLS files are deliberately not options (they would show in process lists): they come from the
    profile or ``TEMPORAL_API_KEY`` / ``TEMPORAL_TLS_*``.
    """
    group = parser.add_argument_group(
        "Temporal connection", "default: Temporal's envconfig (TEMPORAL_* variables, the config file's profile)"
    )
    group.add_argument("--address", default=None, help="host:port of the Temporal frontend (TEMPORAL_ADDRESS)")
    group.add_argument("--namespace", default=None, help="Temporal namespace (TEMPORAL_NAMESPACE; default 'default')")
    group.add_argument("--profile", default=None, help="profile in the config file (TEMPORAL_PROFILE)")
    group.add_argument("--config-file", default=None, help="Temporal's TOML config file (TEMPORAL_CONFIG_FILE)")


def client_options_from_arguments(args: argparse.Namespace) -> dict[str, Any]:
    """:func:`client_options` for arguments parsed with :func:`add_connection_arguments`."""
    return client_options(
        address=args.address, namespace=args.namespace, profile=args.profile, config_file=args.config_file
    )
