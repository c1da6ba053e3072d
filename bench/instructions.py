"""Instructions per turn of a turn's store work or activities, counted by valgrind: ``python -m bench.instructions``.

This machine's speed moves by 20-40% between minutes, so a CPU time A/B of two builds cannot resolve a change of a
few percent, even with runs alternated (``bench.store_cpu``'s own advice). The instructions a process executes do not
move with the machine: this script runs :mod:`bench.store_cpu` under valgrind's callgrind (``--callgrind-out-file
/dev/null``: only its total is read), once with ``--small`` turns and once with ``--large``, and divides the
difference by the difference in turns. Start-up, imports, migrations and the warm-up are in both runs and cancel
out. With ``--baseline-tree DIR`` it does the same for another checkout (``git worktree add DIR REV``) and prints
this tree ÷ the baseline.

``--work activities`` counts :mod:`bench.turn_activities` instead: the turn's model and tool activities run without
Temporal, the store included (this tree's driver, on each tree's code).

Instructions are not time: a cache miss or a system call costs more than its instructions say. Use it for changes
to Python code on the store's path (the records, the statements' arguments and rows), and the CPU benches for what
they are. The count moves by ~0.1% between runs (random ids, a dict's layout); valgrind runs the process ~45x
slower, so a K = 8 run of 25 turns takes ~2 min, the runs of a tree two at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Count", "collected", "per_turn"]

ROOT = Path(__file__).resolve().parent.parent
_COLLECTED = re.compile(r"^==\d+== Collected : (\d+)$", re.MULTILINE)


@dataclass(frozen=True)
class Count:
    """The instructions of one run of ``bench.store_cpu`` and the turns it measured."""

    turns: int
    instructions: int


def collected(stderr: str) -> int:
    """The instructions callgrind says it collected, from its summary on ``stderr``."""
    found = _COLLECTED.findall(stderr)
    if len(found) != 1:
        raise ValueError(f"callgrind's summary not found in its output:\n{stderr[-2000:]}")
    return int(found[0])


def per_turn(small: Count, large: Count) -> float:
    """Instructions per turn: what the larger run executed beyond the smaller one, per turn more."""
    if large.turns <= small.turns:
        raise ValueError("the larger run must measure more turns")
    return (large.instructions - small.instructions) / (large.turns - small.turns)


async def _count(tree: Path, turns: int, args: argparse.Namespace, database_url: str | None) -> Count:
    # The store's calls: the tree's own bench.store_cpu. The activities: this tree's driver (which a baseline from
    # before it lacks) on the tree's code, which PYTHONPATH puts first.
    script = ["-m", "bench.store_cpu"] if args.work == "store" else [str(ROOT / "bench" / "turn_activities.py")]
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        *script,
        f"--k={args.k}",
        f"--turns={turns}",
        "--rounds=1",
        "--warmup=2",
    ]
    if database_url:
        command.append(f"--database-url={database_url}")
    # The same hash seed in every run: a set's or a dict's iteration order would otherwise vary the count a little.
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    process = await asyncio.create_subprocess_exec(
        *command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    _, stderr = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} in {tree} failed:\n{stderr.decode()[-2000:]}")
    return Count(turns, collected(stderr.decode()))


async def _tree(tree: Path, args: argparse.Namespace) -> float:
    """The tree's instructions per turn: its two runs side by side (valgrind runs on one core each)."""
    small, large = await asyncio.gather(
        _count(tree, args.small, args, args.database_url), _count(tree, args.large, args, args.database_url)
    )
    return per_turn(small, large)


async def main(args: argparse.Namespace) -> None:
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    store = "PostgreSQL" if args.database_url else "SQLite"
    script = "bench.store_cpu" if args.work == "store" else "bench.turn_activities"
    print(f"K = {args.k}, {store}, {script} with {args.small} and {args.large} turns under callgrind", flush=True)
    trees = [("this tree", ROOT)]
    if args.baseline_tree:
        trees.append(("baseline", Path(args.baseline_tree).resolve()))
    figures: dict[str, list[float]] = {}
    for _ in range(args.repeat):
        for name, tree in trees:
            figure = await _tree(tree, args)
            figures.setdefault(name, []).append(figure)
            print(f"  {name:10s} {figure / 1e6:8.2f} M instructions per turn ({tree})", flush=True)
    if args.baseline_tree:
        ours, theirs = min(figures["this tree"]), min(figures["baseline"])
        print(f"this tree ÷ baseline: {ours / theirs:.3f} (the lower count of each, {args.repeat} each)")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--k", type=int, default=8, help="tool-calling iterations per turn (default 8)")
    parser.add_argument(
        "--work",
        choices=("store", "activities"),
        default="store",
        help="what is counted: the turn's store calls (bench.store_cpu, the default) or its activities' own code, "
        "the store included (bench.turn_activities)",
    )
    parser.add_argument("--small", type=int, default=5, help="turns of the smaller run (default 5)")
    parser.add_argument("--large", type=int, default=25, help="turns of the larger run (default 25)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each tree (default 1)")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file per run)")
    parser.add_argument("--baseline-tree", metavar="DIR", help="another checkout to count the same way")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
