"""Temporal connection settings: explicit options over Temporal's environment configuration.

Every entry point (``turnkit.connect()``, ``worker.py`` and each ``turnkit`` verb) builds its ``Client.connect``
keyword arguments here, so they all read the same settings the same way. The sources, weakest first:

1. the profile in Temporal's TOML config file (``$TEMPORAL_CONFIG_FILE``, else ``~/.config/temporalio/temporal.toml``;
   profile ``$TEMPORAL_PROFILE``, else ``default``);
2. the ``TEMPORAL_*`` environment variables (``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``,
   ``TEMPORAL_TLS``, ``TEMPORAL_TLS_CLIENT_CERT_PATH``, …), read by :mod:`temporalio.envconfig`;
3. explicit arguments (``--address``, ``connect(temporal_address=…)``).

The store and the task queue stay TurnKit's own (``TURNKIT_DATABASE_URL``, ``TURNKIT_TASK_QUEUE``).

Settings that cannot work are one clear :class:`~turnkit.kernel.errors.ConfigError` each, never a traceback from the
SDK: a TLS file named but missing (:func:`client_options`), a server that does not answer (:func:`connect_client`),
a worker on a cluster without a store of its own (:func:`require_database_url`).
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from temporalio.envconfig import ClientConfig

from turnkit.kernel.errors import ConfigError

if TYPE_CHECKING:
    from temporalio.client import Client, Plugin

__all__ = [
    "TemporalUnreachable",
    "add_connection_arguments",
    "client_options",
    "client_options_from_arguments",
    "connect_client",
    "require_database_url",
]


class TemporalUnreachable(ConfigError, RuntimeError):
    """No Temporal frontend answered at the address (refused, unresolvable, a TLS handshake that failed):
    ``"cannot reach Temporal at host:port: Connection refused"``. A ``ConfigError`` (the command-line entry points
    print it as one line) and the ``RuntimeError`` the SDK raised before, for code that caught that."""


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
        ConfigError: The config file named does not exist, the profile named is not in it, or it does not parse;
            a TLS certificate or key file it names (or ``TEMPORAL_TLS_*_PATH`` names) does not exist.
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
    except OSError as error:  # envconfig reads the TLS files (client cert and key, server CA) named by *_PATH
        what = "not found" if isinstance(error, FileNotFoundError) else f"unreadable ({error.strerror})"
        raise ConfigError(
            f"Temporal TLS file {what}: {error.filename} (named by the profile or a TEMPORAL_TLS_*_PATH variable)"
        ) from error
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


async def connect_client(address: str, *, plugins: Sequence[Plugin] = (), **options: Any) -> Client:
    """``Client.connect(address, **options)``; a server that does not answer is a :class:`TemporalUnreachable`.

    The SDK reports it as ``RuntimeError("Failed client connect: Server connection error: tonic::transport::Error(
    …))``; the message here names the address and, when the error says one, the operating system's reason.
    """
    from temporalio.client import Client  # here: `turnkit --help` and the verbs that only read the store stay light

    try:
        return await Client.connect(address, plugins=list(plugins), **options)
    except RuntimeError as error:
        text = str(error)
        if not text.startswith("Failed client connect"):
            raise
        reason = re.search(r'message: "([^"]+)"', text)
        detail = reason.group(1) if reason else text.removeprefix("Failed client connect: ")
        raise TemporalUnreachable(f"cannot reach Temporal at {address}: {detail}") from error


def require_database_url(database_url: str | None, address: str, *, option: str = "--database-url") -> str:
    """``database_url``, which a worker (or an operator verb) on a cluster it did not start must have: the default
    (SQLite under ``./.turnkit/``) is the embedded dev server's, a store no worker or client of that cluster sees.

    Raises:
        ConfigError: ``database_url`` is empty; nothing has been created on disk.
    """
    if database_url:
        return database_url
    raise ConfigError(
        f"no store given for the Temporal cluster at {address}: set TURNKIT_DATABASE_URL (or {option}) to the "
        "database that the cluster's workers and clients use (the default, SQLite under ./.turnkit/, is only for "
        "the embedded dev server)"
    )
