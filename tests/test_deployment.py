"""Issue 11, packaging and deployment: the ``Dockerfile`` and ``docker-compose.yml``, checked by what can run here.

Images cannot be pulled or built on these machines, so the compose file is parsed and its wiring checked against
the README's "Deploying" section (services, ports, environment, the worker's command) and against the code that
reads it (``worker.py``'s options, the variables TurnKit and Temporal's envconfig read); the Dockerfile is checked
for a wheel built in one stage and installed non-editably in another, a non-root user and the entry point.
"""

from __future__ import annotations

import re
import shlex
import tomllib
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

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"postgresql", "temporal", "temporal-setup", "temporal-ui", "worker"}
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
    Keyword, on the worker's namespace) in a one-off service the worker waits for."""
    setup = compose["temporal-setup"]
    script = " ".join(setup["command"])
    for key in ALL_SEARCH_ATTRIBUTES:
        assert key.name in script, f"{key.name} is not registered by temporal-setup"
    assert "--type Keyword" in script and "--namespace default" in script
    assert setup["environment"]["TEMPORAL_ADDRESS"] == compose["worker"]["environment"]["TEMPORAL_ADDRESS"]
    assert compose["worker"]["depends_on"]["temporal-setup"]["condition"] == "service_completed_successfully"


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
    assert ".whl" in install and "[postgres,providers,prices,otel,uvloop]" in install
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
