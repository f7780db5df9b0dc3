"""Run the bad-input table and measure the memory of signing a huge document.

Runs every case of ``tests/bad_input_cases.py`` (the table ``tests/test_bad_input.py``
runs in CI) on real stores, and prints cases / typed errors / state changed, which must
read N / N / 0. Then adds one document of ``--huge-mb`` megabytes to a fresh store in a
subprocess per configuration and reports the tracemalloc peak (numpy's buffers included)
and the growth of the peak resident set, against the document's size. ``--batch-path``
also measures the unstreamed path (what a huge document cost before streaming) at
``--batch-mb``, since 100 MB there needs over 2 GB.

    python tools/bad_input_report.py                 # table + 100 MB (about 2 minutes)
    python tools/bad_input_report.py --huge-mb 20 --batch-path

Writes ``tools/results/bad_input-<time>.json``.
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
from collections import Counter
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from bad_input_cases import CASES, run_case  # noqa: E402

PROBE = r"""
import json, resource, sys, time, tracemalloc
import numpy as np
from neardup_store import streamed
from neardup_store.store import Store
from neardup_store.text import ShingleConfig

size, path, kind, scheme, bag, batch = sys.argv[1:7]
size = int(size)
if batch == "batch":  # the unstreamed path, as before the change
    streamed.STREAM_MIN_CHARACTERS = 1 << 62
rng = np.random.default_rng(1)
codes = rng.integers(97, 124, size, dtype=np.uint8)
codes[codes == 123] = 32
document = codes.tobytes().decode("ascii")
del codes
shingles = ShingleConfig(kind=kind, bag=bag == "bag")
with Store.open(path, create=True, num_perm=128, scheme=scheme, shingles=shingles) as store:
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    start = time.perf_counter()
    store.add("huge", document)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
print(json.dumps({"size": size, "tracemalloc_peak": peak, "rss_growth": rss, "seconds": seconds}))
"""


def run_table() -> dict[str, Any]:
    outcomes = []
    started = time.perf_counter()
    for case in CASES:
        with tempfile.TemporaryDirectory() as directory:
            outcomes.append(run_case(case, Path(directory)))
    seconds = time.perf_counter() - started
    typed = sum(o.typed and o.names_problem for o in outcomes)
    changed = sum(o.state_changed for o in outcomes)
    print(f"{'case':<58} {'operation':<15} {'raised':<24} ok")
    for o in outcomes:
        mark = "yes" if o.ok else "NO"
        print(f"{o.name[:58]:<58} {o.operation:<15} {o.raised[:24]:<24} {mark}")
    by_operation = Counter(o.operation for o in outcomes)
    print(f"\nbad-input cases / typed (message names the problem) / state changed: "
          f"{len(outcomes)} / {typed} / {changed}   ({seconds:.1f} s)")  # fmt: skip
    print("by operation: " + ", ".join(f"{k} {v}" for k, v in sorted(by_operation.items())))
    return {
        "cases": len(outcomes),
        "typed": typed,
        "state_changed": changed,
        "seconds": seconds,
        "by_operation": dict(by_operation),
        "outcomes": [asdict(o) for o in outcomes],
    }


def probe(size: int, kind: str, scheme: str, bag: bool, batch: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as directory:
        args = [str(size), f"{directory}/s", kind, scheme, "bag" if bag else "set",
                "batch" if batch else "streamed"]  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", PROBE, *args],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, check=True, timeout=3600,
        )  # fmt: skip
    result: dict[str, Any] = json.loads(done.stdout)
    result.update(kind=kind, scheme=scheme, bag=bag, path="batch" if batch else "streamed")
    mb = 1e6
    print(f"{result['path']:<9} {kind:<5} {scheme:<6} {'bag' if bag else 'set':<4} "
          f"{size / mb:>6.0f} MB  peak {result['tracemalloc_peak'] / mb:>7.0f} MB "
          f"({result['tracemalloc_peak'] / size:5.2f}x)  rss +{result['rss_growth'] / mb:>6.0f} MB"
          f"  {result['seconds']:6.1f} s", flush=True)  # fmt: skip
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--huge-mb", type=int, default=100, help="size of the huge document")
    parser.add_argument("--batch-path", action="store_true", help="also measure unstreamed")
    parser.add_argument("--batch-mb", type=int, default=20, help="size for --batch-path")
    parser.add_argument("--kperm", action="store_true", help="also kperm (slow: O(n*num_perm))")
    parser.add_argument("--skip-table", action="store_true")
    options = parser.parse_args()
    report: dict[str, Any] = {
        "machine": {"python": sys.version.split()[0], "platform": platform.platform(),
                    "cpus": os.cpu_count()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }  # fmt: skip
    if not options.skip_table:
        report["table"] = run_table()
    print("\nmemory of adding one document (tracemalloc peak includes numpy; "
          "rss is the peak resident set's growth)")  # fmt: skip
    huge = options.huge_mb * 1_000_000
    runs = [("char", "oph"), ("word", "oph")] + ([("char", "kperm")] if options.kperm else [])
    report["memory"] = [probe(huge, kind, scheme, False, False) for kind, scheme in runs]
    if options.batch_path:
        small = options.batch_mb * 1_000_000
        for kind, bag in (("char", False), ("word", False), ("char", True)):
            report["memory"].append(probe(small, kind, "oph", bag, True))
    results = ROOT / "tools" / "results"
    results.mkdir(parents=True, exist_ok=True)
    out = results / f"bad_input-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(json.dumps(report, indent=2, default=str))
    print(f"\nwrote {out}")
    table = report.get("table")
    if table and (table["typed"] != table["cases"] or table["state_changed"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
