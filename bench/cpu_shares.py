"""Where the process's Python CPU goes in a turn, sampled: ``python -m bench.cpu_shares``.

``bench.cpu_profile`` times the process's CPU per turn and, with cProfile, lists functions; but cProfile doubles
what it profiles and charges coroutines oddly, and a wall-clock sampler charges the event loop's waits for the GIL
(the workflow threads hold it) to whatever C call it was in (SQLite's ``BEGIN IMMEDIATE`` looked like 10% that
way, and is 0.7%). This runs ``bench.cpu_profile --no-profile`` (the same workload: fresh conversations, K
tool-calling iterations, 40 turns at once, then 10 back to back) under ``py-spy record --gil``, which samples only
the thread holding the GIL, so the samples split the process's Python CPU, and sorts each sample into one share:

- the store (``turnkit/store/``: its SQL on the driver, rows to records, JSON);
- TurnKit's activity code besides the store (``activities/``: prompts, tool dispatch, payload models);
- the client (``ask``, the first turn's write, the result);
- workflow activations (the sandbox, ``workflows/``, the SDK's workflow worker);
- the SDK's activity worker around the activities, and its bridge (polls, completions);
- the event loop and the rest.

A sample goes to the first share in that order whose marker its stack holds (a store call inside an activity is
the store's). The start-up's imports are left out. Needs py-spy (``pip install py-spy``), which samples the Python
process it starts (as root, or where ptrace is allowed).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: Each share and the markers (substrings of a py-spy frame) that put a sample in it, first match wins.
SHARES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the store (turnkit/store/: SQL on the driver, rows to records, JSON)", ("turnkit/store/",)),
    ("TurnKit's activity code besides the store (activities/)", ("activities/",)),
    ("the client: ask, the first turn's write, the result", ("turnkit/handles.py", "bench/peers/turnkit_app.py")),
    (
        "workflow activations (sandbox, workflows/, the SDK's workflow worker)",
        ("Thread._bootstrap", "worker/_workflow.py"),
    ),
    ("the SDK's activity worker around the activities", ("worker/_activity.py",)),
    ("the SDK's bridge (polls, completions)", ("temporalio/bridge/",)),
)
REST = "the event loop and the rest"
#: A sample of the start-up (the imports of ``bench.cpu_profile`` and of what it imports) is no turn's.
STARTUP = "bench/cpu_profile.py:"


@dataclass
class Shares:
    """Samples by share, and by the function each sample was in (its leaf frame)."""

    total: int
    by_share: Counter[str]
    by_function: Counter[str]


def _is_startup(frames: Sequence[str]) -> bool:
    """Whether a sample is of ``bench.cpu_profile``'s own imports: its module-level frame calling into importlib
    (the run itself is its module-level frame calling ``asyncio.run``)."""
    for i, frame in enumerate(frames[:-1]):
        if frame.startswith("<module> (" + STARTUP):
            return any(mark in frames[i + 1] for mark in ("importlib", "_find_and_load", "exec_module"))
    return False


def shares(lines: Iterable[str]) -> Shares:
    """Sort py-spy's raw (collapsed) samples, ``frame;frame;… count`` per line, into :data:`SHARES`."""
    total = 0
    by_share: Counter[str] = Counter()
    by_function: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        if _is_startup(frames):
            continue
        n = int(count)
        total += n
        by_function[frames[-1]] += n
        for name, markers in SHARES:
            if any(marker in frame for frame in frames for marker in markers):
                by_share[name] += n
                break
        else:
            by_share[REST] += n
    return Shares(total, by_share, by_function)


def report(result: Shares, *, top: int) -> str:
    """The shares as a table, then the ``top`` functions by samples."""
    if not result.total:
        return "no samples (did py-spy attach?)"
    lines = [f"{result.total} samples of the thread holding the GIL", "", "| share | of the samples |", "|---|---|"]
    names = [name for name, _ in SHARES] + [REST]
    lines += [f"| {name} | {result.by_share[name] / result.total:.0%} |" for name in names]
    lines += ["", f"top {top} functions (the leaf frame of each sample)"]
    lines += [f"  {n / result.total:6.1%}  {name}" for name, n in result.by_function.most_common(top)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=8, help="tool-calling iterations per turn (default 8)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of bench.cpu_profile (default 3)")
    parser.add_argument("--database-url", help="the store (default: a temporary SQLite file)")
    parser.add_argument("--rate", type=int, default=250, help="samples per second (default 250)")
    parser.add_argument("--top", type=int, default=25, help="functions listed (default 25)")
    parser.add_argument("--from-file", type=Path, help="sort a raw py-spy file already recorded instead of running")
    args = parser.parse_args(argv)
    if args.from_file is not None:
        print(report(shares(args.from_file.read_text().splitlines()), top=args.top))
        return
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        sys.exit("bench.cpu_shares needs py-spy: pip install py-spy")
    with tempfile.TemporaryDirectory(prefix="turnkit-cpu-shares-") as tmp:
        raw = Path(tmp) / "samples.txt"
        command = [sys.executable, "-m", "bench.cpu_profile", "--no-profile", "--k", str(args.k)]
        command += ["--rounds", str(args.rounds)]
        if args.database_url:
            command += ["--database-url", args.database_url]
        spied = [spy, "record", "--gil", "--nonblocking", "-r", str(args.rate), "-f", "raw", "-o", str(raw), "--"]
        subprocess.run([*spied, *command], check=True)
        print(report(shares(raw.read_text().splitlines()), top=args.top))


if __name__ == "__main__":
    main()
