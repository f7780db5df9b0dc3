"""Long setting of the crash suite: kill a writer hundreds of times on one store.

Runs the loop of ``tests/crash_loop_core.py`` (the one ``tests/test_crash.py`` runs short):
a writer subprocess commits deterministic batches and acknowledges each after its commit;
it is SIGKILLed at random moments, and in a share of the rounds at a random fault point
inside a write transaction (``neardup_store._faults``). After every kill the store must
open, hold the last acknowledged batch (at most one more), equal the reference model, have
no orphan band entries and check clean.

    python tools/crash_loop.py --kills 300 [--seed N] [--json PATH] [--max-minutes M]

Prints a summary and writes JSON (default ``tools/results/crash_loop.json``). It also
measures what the unarmed fault hook costs an ``add_many`` of 1000 documents.

SIGKILL ends the process, not the machine: the page cache survives, so the figures show
that no kill leaves a half-applied or lost commit, not that commits reach the disk; that
is ``durable=True`` (LMDB fsyncs each commit), which a power cut would test and this does
not simulate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TOOLS_DIR = Path(__file__).resolve().parent
ROOT = TOOLS_DIR.parent
sys.path.insert(0, str(ROOT / "tests"))  # the loop and the writer live with the tests
sys.path.insert(0, str(ROOT))

from arguments import at_least  # noqa: E402
from crash_loop_core import CrashLoop, Summary  # noqa: E402
from crash_writer import STORE_OPTIONS, _text_pool  # noqa: E402

from neardup_store import Store, _faults  # noqa: E402

DEFAULT_JSON = TOOLS_DIR / "results" / "crash_loop.json"


def measure_hook_cost(documents: int = 1000, repeats: int = 5) -> dict[str, Any]:
    """Unarmed checkpoint cost against ``add_many`` of ``documents`` texts (one commit)."""
    if _faults._armed is not None:
        raise SystemExit(f"unset {_faults.ENV_VAR} to measure the unarmed hook")
    words, bases = _text_pool(1)
    texts = [
        " ".join([*bases[i % len(bases)][: 10 + i % 30], words[i % len(words)]])
        for i in range(documents)
    ]
    calls = 0
    unwrapped = _faults.checkpoint

    def counting(name: str) -> None:
        nonlocal calls
        calls += 1
        unwrapped(name)

    times = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        Store.open(Path(tmp) / "s", create=True, **STORE_OPTIONS) as store,
    ):
        for round_ in range(repeats + 1):
            items = [(f"r{round_}-{i}", text) for i, text in enumerate(texts)]
            if round_ == repeats:  # the last (untimed) round counts the calls
                _faults.checkpoint = counting  # type: ignore[assignment]
                try:
                    store.add_many(items, batch_size=None)
                finally:
                    _faults.checkpoint = unwrapped  # type: ignore[assignment]
                break
            began = time.perf_counter()
            store.add_many(items, batch_size=None)
            times.append(time.perf_counter() - began)
    number = 1_000_000
    call = 'checkpoint("after-put")'  # as the library calls it, without a wrapper
    per_call_s = min(
        timeit.repeat(call, globals={"checkpoint": unwrapped}, number=number, repeat=5)
    )
    per_call_s /= number
    add_many_s = statistics.median(times)
    return {
        "documents": documents,
        "add_many_median_s": add_many_s,
        "checkpoint_calls": calls,
        "checkpoint_ns": per_call_s * 1e9,
        "overhead_fraction": calls * per_call_s / add_many_s,
    }


def render(summary: Summary, hook: dict[str, Any] | None) -> str:
    points = ", ".join(f"{k} {v}" for k, v in sorted(summary.fault_kills_by_point.items()))
    lines = [
        f"kills                              {summary.kills}",
        f"  of which at fault points         {summary.fault_kills} ({points})",
        f"  fault rounds without their point {summary.faults_not_reached}",
        f"acknowledged commits               {summary.acknowledged_commits}",
        f"lost acknowledged commits          {summary.lost_acknowledged_commits}",
        f"invariant violations               {summary.invariant_violations}",
        f"unacknowledged commits present     {summary.unacknowledged_present}",
        f"last committed batch / documents   {summary.last_committed} / {summary.documents}",
        f"run time                           {summary.seconds:.0f} s",
    ]
    if hook is not None:
        lines.append(
            f"unarmed hook: {hook['checkpoint_calls']} calls x {hook['checkpoint_ns']:.0f} ns "
            f"in add_many of {hook['documents']} docs ({hook['add_many_median_s'] * 1e3:.0f} ms)"
            f" = {hook['overhead_fraction']:.4%}"
        )
    lines.extend(f"PROBLEM {p}" for p in summary.problems[:50])
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=at_least(1), default=300, help="SIGKILLs to deliver (300)")
    parser.add_argument("--seed", type=int, default=1, help="writer batches and kill schedule")
    parser.add_argument(
        "--fault-share",
        type=float,
        default=0.25,
        help="share of rounds killed at a fault point (0.25)",
    )
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop after this long even if fewer kills happened",
    )
    parser.add_argument(
        "--path",
        type=Path,
        default=None,
        help="store directory (default: a temporary one, then removed)",
    )
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to write JSON")
    parser.add_argument("--no-hook-cost", action="store_true", help="skip the hook measurement")
    parser.add_argument("-q", "--quiet", action="store_true", help="no line per kill")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    hook = None if args.no_hook_cost else measure_hook_cost()
    work = Path(tempfile.mkdtemp(prefix="crash-loop-")) if args.path is None else None
    path = args.path if args.path is not None else work / "store"  # type: ignore[operator]
    try:
        loop = CrashLoop(path, seed=args.seed, rng_seed=args.seed)
        max_seconds = None if args.max_minutes is None else 60 * args.max_minutes
        summary = loop.run(args.kills, args.fault_share, not args.quiet, max_seconds)
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    print(render(summary, hook))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "summary": summary.to_json(),
        "requested_kills": args.kills,
        "hook_cost": hook,
        "store_options": STORE_OPTIONS,
        "durable": True,
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average": os.getloadavg(),
        },
        "commit": _commit(),
        "rounds": [
            {
                "fault": r.fault,
                "start": r.start,
                "acks": r.acks,
                "found": r.found,
                "killed": r.killed,
                "seconds": round(r.seconds, 3),
                "problems": r.problems,
            }
            for r in loop.rounds
        ],
    }
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(f"JSON written to {args.json}")
    failed = summary.lost_acknowledged_commits or summary.invariant_violations
    return 1 if failed else 0


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


if __name__ == "__main__":
    sys.exit(main())
