"""Every Python block of README.md runs as printed: one test per block, named by its index and its section.

The README's conventions, which this test reads (and so enforces):

- **A block is a whole file.** Its first line names it (``# first_agent.py``, ``# myapp/agents.py``). All the blocks
  of a section are written, as printed, into one fresh directory under their names, and run there as the section
  says, as a reader would run them.
- **The section's console blocks say how.** Each ``$ COMMAND`` line that runs one of the section's files with
  ``python`` (or ``.venv/bin/python``; this interpreter here) is run in that directory, and the lines after it, up to
  the next ``$``, are what it must print on stdout, line for line, TurnKit's random ids (``tool_<24 hex>``, …)
  masked. A command that ends in ``&`` is a server: it is started before the others, must still be running when they
  are done, and is then stopped with SIGTERM. Other console lines (``export …``, ``temporal server start-dev …``)
  are the reader's setup, which the environment below stands in for.
- **A file that no command runs** (a module of agents, a workflow definition) is run as ``python FILE`` and must exit
  0: it only defines and registers.
- **A fragment** (a block that is not a whole program) has ``<!-- fragment: KEY -->`` on the line before its fence;
  ``FRAGMENTS[KEY]`` completes it (code before and after it), and the result runs as ``python KEY.py`` and must exit
  0. There are none today: keep it so where a whole program is short enough to read. A block that is neither named
  nor marked fails its test.

Every section runs against the session's dev server (``TEMPORAL_ADDRESS``, so ``turnkit.connect()`` starts no server
of its own), a fresh SQLite store in its directory (``TURNKIT_DATABASE_URL``) and a task queue of its own
(``TURNKIT_TASK_QUEUE``): sections share no worker and no record. The README's models are ``turnkit.testing``'s
scripted ones, so nothing reaches the internet. A section runs once, for the first of its blocks' tests.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import signal
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"

#: Completions of fragments, by their marker's key: (code before the block, code after it).
FRAGMENTS: dict[str, tuple[str, str]] = {}

#: How long one command may take (a turn on a busy 2-core machine takes seconds).
COMMAND_TIMEOUT = 120.0

_FRAGMENT_MARKER = re.compile(r"<!-- fragment: ([\w-]+) -->")
_FILE_NAME = re.compile(r"# ([\w/]+\.py)\b")
_PROMPT = re.compile(r"^[\w.-]*\$ (.*)$")
#: TurnKit's ids that differ from run to run (media ids are content hashes: they do not).
_RANDOM_ID = re.compile(r"\b(turn|tool|conv|msg|delivery)_[0-9a-f]{24}\b")


@dataclass
class Block:
    """A fenced block of the README."""

    section: str
    language: str
    code: str
    line: int
    fragment: str | None = None

    @property
    def name(self) -> str | None:
        """The file the block is: its first line's name, or a fragment's ``KEY.py``."""
        if self.fragment is not None:
            return f"{self.fragment}.py"
        found = _FILE_NAME.match(self.code)
        return found.group(1) if found else None


@dataclass
class Command:
    """A console line that runs one of the section's files, and what the README shows it printing."""

    argv: list[str]
    file: str
    server: bool
    expected: list[str]


@dataclass
class Ran:
    """How a file's run went."""

    command: str
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    expected: list[str] = field(default_factory=list[str])
    server: bool = False
    running_when_stopped: bool = False


def readme_blocks(text: str) -> list[Block]:
    """The README's fenced blocks, in order, with the ``## `` section each is in."""
    blocks: list[Block] = []
    section = ""
    opened: Block | None = None
    lines: list[str] = []
    previous = ""
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if opened is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif stripped.startswith("```"):
                marker = _FRAGMENT_MARKER.fullmatch(previous.strip())
                opened = Block(section, stripped[3:].strip(), "", number, marker.group(1) if marker else None)
                lines = []
            previous = line
        elif stripped == "```":
            indent = len(line) - len(line.lstrip())
            opened.code = "".join(f"{raw[indent:]}\n" for raw in lines)
            blocks.append(opened)
            opened = None
            previous = line
        else:
            lines.append(line)
    return blocks


def python_blocks() -> list[Block]:
    return [block for block in readme_blocks(README.read_text()) if block.language == "python"]


def section_commands(section: str, files: set[str], text: str | None = None) -> list[Command]:
    """The section's console lines that run its files, with the output shown after each (README.md, or ``text``)."""
    commands: list[Command] = []
    for block in readme_blocks(README.read_text() if text is None else text):
        if block.section != section or block.language != "console":
            continue
        current: Command | None = None
        for line in block.code.replace("\\\n", " ").splitlines():
            prompt = _PROMPT.match(line)
            if prompt is None:
                if current is not None:
                    current.expected.append(line)
                continue
            current = None
            words = shlex.split(prompt.group(1))
            server = words[-1] == "&"
            words = words[:-1] if server else words
            if len(words) >= 2 and Path(words[0]).name == "python" and words[1] in files:
                current = Command([sys.executable, *words[1:]], words[1], server, [])
                commands.append(current)
    return commands


def masked(lines: list[str]) -> list[str]:
    return [_RANDOM_ID.sub(r"\1_…", line) for line in lines]


def _temporal_client_abort_at_exit(returncode: int | None, stderr: str) -> bool:
    """A plain Temporal client script (the README's ``start_approval.py``) can abort at interpreter exit after its
    work is done: a Rust thread of the Temporal SDK's client releases the GIL while CPython finalizes
    (temporalio/sdk-python#300). It is the SDK's bug and no line of the README's, so the test accepts exactly that."""
    return returncode == -signal.SIGABRT and "PyGILState_Release" in stderr and "finalizing" in stderr


async def _finish(process: asyncio.subprocess.Process, ran: Ran, timeout: float | None) -> Ran:
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout)
    except TimeoutError:
        process.kill()
        out, err = await process.communicate()
        err += f"\n[test_readme: killed after {timeout} s]".encode()
    ran.returncode, ran.stdout, ran.stderr = process.returncode, out.decode(), err.decode()
    return ran


async def _finish_unless(process: asyncio.subprocess.Process, ran: Ran, servers: list[asyncio.Task[Ran]]) -> Ran:
    """Run a command to its end, unless a server it needs exits first (a client would wait for it in vain)."""
    finishing = asyncio.ensure_future(_finish(process, ran, COMMAND_TIMEOUT))
    await asyncio.wait([finishing, *servers], return_when=asyncio.FIRST_COMPLETED)
    if not finishing.done():
        process.kill()
        ran = await finishing
        ran.stderr += "\n[test_readme: killed, a server of the section had exited]"
    return await finishing


async def run_section(section: str, directory: Path, temporal_address: str) -> dict[str, Ran]:
    """Write the section's blocks into ``directory`` and run them as the section says: its runs, by file name."""
    files: dict[str, str] = {}
    for block in python_blocks():
        if block.section == section and block.name is not None:
            before, after = FRAGMENTS[block.fragment] if block.fragment is not None else ("", "")
            files[block.name] = before + block.code + after
    for name, code in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_text(code)
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_address,
        "TURNKIT_DATABASE_URL": f"sqlite+aiosqlite:///{directory / 'store.db'}",
        "TURNKIT_TASK_QUEUE": f"readme-{uuid.uuid4().hex[:12]}",
    }

    async def start(argv: list[str]) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *argv,
            cwd=directory,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,  # a stdio MCP server run on its own reads EOF and exits
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )

    commands = section_commands(section, set(files))
    runs: dict[str, Ran] = {}
    for name in files:  # the files no command runs: modules, which only define and register
        if name not in {command.file for command in commands}:
            runs[name] = await _finish(await start([sys.executable, name]), Ran(f"python {name}"), COMMAND_TIMEOUT)
    servers: dict[str, tuple[asyncio.subprocess.Process, asyncio.Task[Ran]]] = {}
    for command in commands:
        if command.server:
            ran = Ran(shlex.join(["python", *command.argv[1:]]) + " &", expected=command.expected, server=True)
            process = await start(command.argv)
            servers[command.file] = (process, asyncio.ensure_future(_finish(process, ran, None)))
    try:
        for command in commands:
            if not command.server:
                ran = Ran(shlex.join(["python", *command.argv[1:]]), expected=command.expected)
                watched = [task for _, task in servers.values()]
                runs[command.file] = await _finish_unless(await start(command.argv), ran, watched)
    finally:
        for name, (process, task) in servers.items():
            running = process.returncode is None
            if running:
                process.send_signal(signal.SIGTERM)
            runs[name] = await asyncio.wait_for(task, 30)
            runs[name].running_when_stopped = running
    return runs


_SECTION_RUNS: dict[str, dict[str, Ran]] = {}


@pytest.mark.slow
@pytest.mark.parametrize(
    "block", python_blocks(), ids=[f"{i}-{b.section}-{b.name}" for i, b in enumerate(python_blocks(), start=1)]
)
async def test_the_block_runs_as_printed(
    block: Block, temporal_address: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The block's file, run as its section says with the section's other files, exits 0 and prints what the README
    shows (a server runs until it is stopped)."""
    assert block.name is not None, (
        f"README.md line {block.line}: a Python block starts with its file's name (# name.py), or is marked as a "
        "fragment (<!-- fragment: KEY --> on the line before, completed by FRAGMENTS[KEY] in tests/test_readme.py)"
    )
    if block.fragment is not None:
        assert block.fragment in FRAGMENTS, f"README.md line {block.line}: no FRAGMENTS[{block.fragment!r}]"
    if block.section not in _SECTION_RUNS:
        directory = tmp_path_factory.mktemp("readme")
        _SECTION_RUNS[block.section] = await run_section(block.section, directory, temporal_address)
    ran = _SECTION_RUNS[block.section][block.name]
    said = f"$ {ran.command}\n--- exit {ran.returncode}; stdout:\n{ran.stdout}--- stderr:\n{ran.stderr[-4000:]}"
    if ran.server:
        assert ran.running_when_stopped, f"the server had exited before the section's other commands were done\n{said}"
        assert ran.returncode == -signal.SIGTERM, said
    else:
        assert ran.returncode == 0 or _temporal_client_abort_at_exit(ran.returncode, ran.stderr), said
    if ran.expected:
        assert masked(ran.stdout.splitlines()) == masked(ran.expected), said


SAMPLE = """## Run it

<!-- fragment: one-option -->
```python
Agent("a", model="m")
```

  ```python
  # app/server.py
  serve()
  ```

```console
$ export TEMPORAL_ADDRESS=…
$ .venv/bin/python app/server.py &
box$ python client.py --twice
hello tool_0123456789abcdef01234567
bye
$ python elsewhere.py
```
"""


def test_the_readme_conventions_are_read_as_documented() -> None:
    """The parser behind the tests above: names from first lines (indented fences too), fragment markers, servers,
    the output after each command, setup lines and commands of files outside the section skipped; and the README's
    fragments are exactly those FRAGMENTS completes."""
    fragment, server = [b for b in readme_blocks(SAMPLE) if b.language == "python"]
    assert (fragment.section, fragment.name, fragment.fragment) == ("Run it", "one-option.py", "one-option")
    assert (server.name, server.code) == ("app/server.py", "# app/server.py\nserve()\n")
    commands = section_commands("Run it", {"app/server.py", "client.py"}, SAMPLE)
    assert [(c.argv[1:], c.server, c.expected) for c in commands] == [
        (["app/server.py"], True, []),
        (["client.py", "--twice"], False, ["hello tool_0123456789abcdef01234567", "bye"]),
    ]
    assert masked(commands[1].expected) == ["hello tool_…", "bye"]
    marked = sorted(b.fragment for b in python_blocks() if b.fragment is not None)
    assert marked == sorted(FRAGMENTS), "each fragment of README.md has a completion, and each completion a fragment"


TOOLS_SECTION = "Running against a real Temporal cluster and PostgreSQL"


@pytest.mark.slow
async def test_the_tools_only_worker_line_serves_the_readmes_module(temporal_address: str, tmp_path: Path) -> None:
    """The section's ``gpu-box$ python worker.py --app myapp.agents --queue gpu --only tools``, run beside its
    ``myapp/agents.py``: the worker starts and prints the ready line the README shows (at the test server's address
    instead of ``temporal:7233``; the README says ``(uvloop)`` is added on uvloop), then stops on SIGTERM."""
    [agents] = [b for b in python_blocks() if b.section == TOOLS_SECTION and b.name == "myapp/agents.py"]
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "agents.py").write_text(agents.code)
    [(words, shown)] = [
        (shlex.split(prompt.group(1)), block.code.splitlines()[number + 1])
        for block in readme_blocks(README.read_text())
        if block.section == TOOLS_SECTION and block.language == "console"
        for number, line in enumerate(block.code.splitlines())
        if (prompt := _PROMPT.match(line)) and "--only" in line
    ]
    assert words[:2] == ["python", "worker.py"]
    env = {
        **os.environ,
        "TEMPORAL_ADDRESS": temporal_address,
        "TURNKIT_DATABASE_URL": f"sqlite+aiosqlite:///{tmp_path / 'store.db'}",
    }
    worker = await asyncio.create_subprocess_exec(
        sys.executable, str(ROOT / words[1]), *words[2:], cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert worker.stdout is not None
        ready = (await asyncio.wait_for(worker.stdout.readline(), COMMAND_TIMEOUT)).decode().rstrip("\n")
    finally:
        if worker.returncode is None:
            worker.send_signal(signal.SIGTERM)
        await asyncio.wait_for(worker.wait(), 30)
    assert ready.replace(" (uvloop)", "") == shown.replace("temporal:7233", temporal_address)
    assert worker.returncode == 0
