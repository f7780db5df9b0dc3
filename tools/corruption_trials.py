"""Corruption trials, long setting: flip bytes of a store and see whether ``check`` notices.

Each trial copies a reference store, flips one or more bytes (or bits) of ``data.mdb``,
at random offsets or inside one region (document records, keys, band tables, meta
entries, LMDB's meta pages, branch pages, page and node headers, the main table of
tables), runs ``neardup-admin check --json`` in a subprocess and classifies the outcome
as detected, harmless, undetected or crash (see ``tests/corruption.py``). Undetected and
crash must both be 0.

Example:
    python tools/corruption_trials.py --trials 2000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import re
import signal
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import corruption
from arguments import at_least

RESULTS = Path(__file__).resolve().parent / "results"
OUTCOMES = ("detected", "harmless", "undetected", "crash")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=at_least(1), default=2000, help="number of trials")
    parser.add_argument("--seed", type=int, default=1, help="seed of the store and the flips")
    parser.add_argument("--documents", type=at_least(1), default=300, help="documents in the store")
    parser.add_argument(
        "--random-share", type=float, default=0.4,
        help="share of trials at random offsets; the rest target one region each",
    )  # fmt: skip
    parser.add_argument(
        "--repair", action="store_true",
        help="after each detected trial also run check --repair and classify what it did",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=int, default=1,
        help="trials run at once (each is two subprocesses; the flips do not depend on it)",
    )  # fmt: skip
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill: summarise, as Ctrl-C
    rng = random.Random(args.seed)
    started = time.perf_counter()
    trials: list[corruption.Trial] = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        reference = corruption.make_reference(workdir / "reference", args.seed, args.documents)
        targets = corruption.TARGETS[1:]
        interrupted = False
        try:
            _run(args, rng, reference, workdir, targets, trials, started)
        except KeyboardInterrupt:  # Ctrl-C or a kill: summarise the trials run so far
            print(f"interrupted after {len(trials)} trials")
            interrupted = True
    summary = corruption.summarize(trials)
    elapsed = time.perf_counter() - started
    _print(summary, elapsed)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"corruption_trials_{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "interrupted": interrupted,
                "machine": {"python": platform.python_version(), "platform": platform.platform()},
                "elapsed_s": round(elapsed, 1),
                "summary": summary,
                "detections": _detections(trials),
                "failures": [
                    asdict(t)
                    for t in trials
                    if t.outcome in ("undetected", "crash") or t.repair in ("wrong", "crash")
                ],
            },
            indent=1,
        )
    )
    print(f"wrote {out}")
    bad_repairs = summary["repairs"].get("wrong", 0) + summary["repairs"].get("crash", 0)
    if summary["undetected"] or summary["crash"] or bad_repairs:
        sys.exit(1)
    sys.exit(130 if interrupted else 0)  # cut short: not a pass


def _run(
    args: argparse.Namespace,
    rng: random.Random,
    reference: corruption.Reference,
    workdir: Path,
    targets: tuple[str, ...],
    trials: list[corruption.Trial],
    started: float,
) -> None:
    # Every trial's flips are drawn up front, so the results do not depend on --workers.
    plans = []
    for _ in range(args.trials):
        target = "random" if rng.random() < args.random_share else rng.choice(targets)
        plans.append((target, corruption.plan_flips(reference, target, rng)))
    local = threading.local()
    lock = threading.Lock()

    def one(number: int) -> None:
        if not hasattr(local, "dir"):
            local.dir = Path(tempfile.mkdtemp(dir=workdir))
        target, flips = plans[number]
        trial = corruption.run_flips(reference, local.dir, target, flips, args.repair)
        with lock:
            trials.append(trial)
            if trial.outcome in ("undetected", "crash") or trial.repair in ("wrong", "crash"):
                print(f"trial {number}: {trial.outcome} ({trial.target}, {trial.regions}, "
                      f"flips {trial.flips}): {trial.detail}", flush=True)  # fmt: skip
            if len(trials) % 100 == 0:
                counts = corruption.summarize(trials)
                print(
                    f"{len(trials)} trials, {time.perf_counter() - started:.0f} s: "
                    + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES),
                    flush=True,
                )

    with ThreadPoolExecutor(max_workers=max(1, args.workers)) as pool:
        futures = [pool.submit(one, number) for number in range(args.trials)]
        try:
            for future in futures:
                future.result()
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            raise


def _detections(trials: list[corruption.Trial]) -> dict[str, int]:
    """How detected trials were detected (violation kinds, or the open error's type)."""
    counts: dict[str, int] = {}
    for trial in trials:
        if trial.outcome == "detected":
            how = trial.detail
            if not how.startswith("check"):  # the error's kind, without the copy's path
                how = re.sub(r"Error: \S+: ", "Error: ", how).split("(")[0].strip()
            counts[how] = counts.get(how, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def _print(summary: dict[str, object], elapsed: float) -> None:
    columns = ("detected", "harmless", "undetected", "crash")
    print(f"\n{summary['trials']} trials in {elapsed:.0f} s")
    print(f"{'':16}" + "".join(f"{c:>12}" for c in columns))
    print(f"{'all':16}" + "".join(f"{summary[c]:>12}" for c in columns))
    for group in ("by_region", "by_target"):
        print(f"-- {group.replace('_', ' ')}")
        for name, counts in summary[group].items():  # type: ignore[attr-defined]
            print(f"{name:16}" + "".join(f"{counts[c]:>12}" for c in columns))
    if summary["repairs"]:
        print(f"-- check --repair after detected trials: {summary['repairs']}")


if __name__ == "__main__":
    main()
