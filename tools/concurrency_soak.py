"""Long setting of the concurrency suite (tests/test_concurrency.py runs the short one).

Runs, on real stores in a temporary directory, for about ``--seconds`` in all:

1. one churn writer and ``--readers`` reader processes, each checking inside one read
   transaction that every table agrees (and that the snapshot is exactly the committed
   state its commit counter names), while this process runs the negative control (the
   same check spread over several transactions) — half of the time;
2. rounds of two writer processes committing their own sequences concurrently — a fifth;
3. a writer process committing (and reopening the store now and then) while this process
   compacts the store as often as it can — the rest.

Prints a summary and writes it as JSON to ``tools/results/``. Exits 1 if any torn view,
lost commit, sequence gap or model difference was seen, or the control never fired.

    python tools/concurrency_soak.py --seconds 300 --readers 3
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # spawned children inherit sys.path
os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])

import concurrency_scenarios as cs  # noqa: E402
from arguments import at_least  # noqa: E402


def _checkout() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _readers_phase(work: Path, seconds: float, readers: int) -> dict[str, Any]:
    return cs.run_readers_and_writer(
        work / "readers", readers=readers, seconds=seconds, deadline_s=seconds + 300
    )


def _writers_phase(work: Path, seconds: float, commits: int) -> dict[str, Any]:
    total: dict[str, Any] = {"rounds": 0, "writer_commits": 0, "gaps": 0, "lost_commits": 0,
                             "counter_mismatches": 0, "differences": []}  # fmt: skip
    began = time.monotonic()
    while total["rounds"] == 0 or time.monotonic() - began < seconds:
        run = cs.run_two_writers(work / f"writers-{total['rounds']}", commits=commits)
        total["rounds"] += 1
        total["writer_commits"] += run["writer_commits"]
        total["gaps"] += run["gaps"]
        total["lost_commits"] += run["lost_commits"]
        total["counter_mismatches"] += run["commit_counter"] != run["writer_commits"]
        total["differences"] += run["differences"][:5]
    return total


def _compaction_phase(work: Path, seconds: float) -> dict[str, Any]:
    return cs.run_compaction_hammer(work / "compaction", seconds=seconds, deadline_s=seconds + 300)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=at_least(1, float), default=300.0, help="total running time"
    )
    parser.add_argument(
        "--readers", type=at_least(1), default=3, help="reader processes in phase 1"
    )
    parser.add_argument(
        "--commits", type=at_least(1), default=50, help="commits per writer per round"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "tools" / "results")
    args = parser.parse_args()

    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="concurrency-soak-") as tmp:
        work = Path(tmp)
        readers = _readers_phase(work, args.seconds * 0.5, args.readers)
        writers = _writers_phase(work, args.seconds * 0.2, args.commits)
        compaction = _compaction_phase(work, args.seconds * 0.3)
    result = {
        "seconds": round(time.monotonic() - began, 1),
        "checkout": _checkout(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}",
        "readers_and_writer": readers,
        "two_writers": writers,
        "compaction": compaction,
    }
    failed = (
        readers["torn_views"]
        or readers["final_differences"]
        or not readers["negative_control_detections"]
        or writers["gaps"]
        or writers["lost_commits"]
        or writers["counter_mismatches"]
        or writers["differences"]
        or compaction["lost_commits"]
        or compaction["differences"]
        or compaction["commit_counter"]
        != compaction["writer_commits"] + compaction["purge_commits"]
        or compaction["empty_purge_commits"]
    )
    result["ok"] = not failed
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"concurrency_soak-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")

    print(f"concurrency soak: {result['seconds']} s, checkout {result['checkout']}")
    print(
        f"  readers: {readers['readers']} processes, {readers['reader_checks']} checks, "
        f"{readers['torn_views']} torn views; writer {readers['writer_commits']} commits"
    )
    print(
        f"  negative control: {readers['negative_control_detections']} detections in "
        f"{readers['negative_control_attempts']} spread-out checks"
    )
    print(
        f"  two writers: {writers['rounds']} rounds, {writers['writer_commits']} commits, "
        f"{writers['gaps']} gaps, {writers['lost_commits']} lost, "
        f"{writers['counter_mismatches']} commit-counter mismatches"
    )
    print(
        f"  compaction: {compaction['compaction_attempts']} attempts, "
        f"{compaction['compactions']} done, {compaction['refused']} refused (StoreBusyError), "
        f"{compaction['opens_during_compaction']} writer opens waited for one; writer "
        f"{compaction['writer_commits']} commits, {compaction['lost_commits']} lost"
    )
    print(f"  {'OK' if result['ok'] else 'FAILED'}; JSON: {out}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
