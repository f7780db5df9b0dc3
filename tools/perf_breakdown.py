"""Where a ``perf record`` profile's time went, by layer, in µs per document.

    mkfifo /tmp/ctl
    taskset -c 1 perf record -F 1999 -D -1 --control fifo:/tmp/ctl -o 10m.data \\
        python tools/profile_store.py transactions --documents 10000000 \\
        --sizes 131072 --perf-control /tmp/ctl
    python tools/perf_breakdown.py 100k.data=8.0 1m.data=11.6 10m.data=28.5

Each argument is a ``perf.data`` file and the wall time per document its samples cover
(``profile_store.py transactions`` prints it; with several timed transactions, their
mean). A layer's share of the samples times that wall time is its µs per document, so
profiles of stores of different sizes line up row by row. Kernel samples need
``perf_event_paranoid`` of 1 or less, or root. The layers are told apart by the shared
object and, inside the kernel and libc, by the symbol's name (the patterns below): a
guide to where the time goes, not an exact account.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence

KERNEL_LAYERS = (
    ("kernel: write() into the page cache", r"copy_folio|ext4|filemap_|write|iov|balance_dirty"),
    (
        "kernel: page faults, page allocation",
        r"clear_page|anonymous|fault|pte|alloc|memcg|lruvec|rmap|lru|mas_|unmap|zap|tlb|folio",
    ),
)
SAMPLE = re.compile(r"\s+([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(\S+)")


def layer(shared_object: str, symbol: str) -> str:
    """The layer a sample in ``symbol`` of ``shared_object`` belongs to."""
    if shared_object == "[kernel.kallsyms]":
        named = (name for name, pattern in KERNEL_LAYERS if re.search(pattern, symbol))
        return next(named, "kernel: other")
    if shared_object.startswith("cpython.cpython"):  # py-lmdb's module, LMDB linked in
        return "LMDB and its binding"
    if shared_object == "libc.so.6":
        if "memmove" in symbol or "memcpy" in symbol:
            return "libc memcpy/memmove (LMDB page copies and others)"
        if "memcmp" in symbol:
            return "libc memcmp (key comparisons, LMDB and Python)"
        return "libc other"
    if shared_object.startswith("libpython"):
        return "Python interpreter"
    return "numpy" if "multiarray" in shared_object else "other"


def shares(path: str) -> Counter[str]:
    """Percent of ``path``'s samples in each layer."""
    report = subprocess.run(
        ["perf", "report", "-i", path, "--stdio", "--sort", "dso,symbol"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    totals: Counter[str] = Counter()
    for match in map(SAMPLE.match, report.splitlines()):
        if match:
            totals[layer(match[2], match[3])] += float(match[1])
    return totals


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+", metavar="PERF_DATA=US_PER_DOC")
    args = parser.parse_args(argv)
    walls = {path: float(us) for path, us in (item.rsplit("=", 1) for item in args.profiles)}
    found = {path: shares(path) for path in walls}
    last = list(found.values())[-1]  # rows in the order of the largest store's
    layers = sorted({name for counts in found.values() for name in counts}, key=lambda n: -last[n])
    print("| layer | " + " | ".join(walls) + " |")
    print("|---|" + "---:|" * len(walls))
    for name in layers:
        cells = (f"{found[path][name] * wall / 100:.2f}" for path, wall in walls.items())
        print(f"| {name} | " + " | ".join(cells) + " |")
    print("| wall | " + " | ".join(f"{wall:.2f}" for wall in walls.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
