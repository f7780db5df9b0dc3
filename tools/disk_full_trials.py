"""Disk-full trials: the long setting of the capacity suite (``tests/test_capacity.py``).

Each trial draws a random batch (signature adds, text adds, removes of stored documents,
metadata of random size) and a random room left for the store, then tries the batch in a
child process that cannot grow the data file past that room. The file-size cap is the
child's own ``RLIMIT_FSIZE`` (SIGXFSZ ignored, so the write fails with EFBIG or is cut
short); with ``--mode tmpfs`` (root only) the store lives on a small real tmpfs that a
filler file has almost filled (ENOSPC). The child reports, checks reads, and retries the
same batch once the room is back. From outside, every trial is classified:

* ``committed``: the batch fitted; the store equals the reference model.
* ``typed``: :class:`StoreFullError`, stored bytes unchanged, reads fine, and the same
  batch committed afterwards. The only acceptable failure.
* ``untyped`` (any other error), ``killed`` (the child died of a signal), ``lost`` (a
  committed document is missing), ``changed`` (the failed batch changed stored bytes, reads
  failed, or ``check()`` found violations), ``retry_failed`` (the batch did not commit once
  the room was back). Each must be 0.

Every ``--reset-every`` trials the store starts again from the smallest map, so many
batches also have to grow the map (``MapFullError`` and redo) while the disk is full.

Example:
    python tools/disk_full_trials.py --trials 200
    python tools/disk_full_trials.py --trials 100 --mode tmpfs
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO_ROOT), str(REPO_ROOT / "tests")]

from arguments import at_least  # noqa: E402
from capacity_worker import PARAMS, SMALLEST_MAP, Batch, Trial, disk_full_trial  # noqa: E402
from harness import Model  # noqa: E402

from neardup_store.minhash import MinHasher  # noqa: E402
from neardup_store.store import Store  # noqa: E402

ACCEPTED = ("committed", "typed")
KINDS = ("committed", "typed", "untyped", "killed", "lost", "changed", "retry_failed", "broken")
KiB, MiB = 1024, 1024 * 1024


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=at_least(1), default=200, help="number of trials (200)")
    parser.add_argument("--seed", type=int, default=1, help="random seed of the trials (1)")
    parser.add_argument(
        "--mode",
        choices=("rlimit", "tmpfs", "both"),
        default="rlimit",
        help="how the disk fills: the child's RLIMIT_FSIZE, a real tmpfs (root), or both",
    )
    parser.add_argument(
        "--reset-every", type=int, default=20, help="start a fresh store this often (20)"
    )
    parser.add_argument(
        "--tmpfs-mib", type=int, default=24, help="size of the tmpfs in --mode tmpfs (24)"
    )
    parser.add_argument(
        "--json",
        type=Path,
        default=REPO_ROOT / "tools" / "results" / "disk_full_trials.json",
        help="where to write the figures (tools/results/disk_full_trials.json)",
    )
    return parser.parse_args(argv)


def random_batch(rng: np.random.Generator, number: int, model: Model) -> Batch:
    adds = int(np.exp(rng.uniform(0, np.log(4000))))
    stored = list(model.documents)
    removes = int(rng.integers(0, min(len(stored), 300) + 1)) if stored else 0
    picked = rng.choice(len(stored), size=removes, replace=False) if removes else []
    return Batch(
        prefix=f"t{number}",
        seed=int(rng.integers(0, 2**31)),
        adds=adds,
        texts=int(rng.integers(0, 21)) if rng.random() < 0.5 else 0,
        meta_bytes=int(rng.choice([0, 64, 512, 2048])),
        removes=tuple(stored[int(i)] for i in picked),
    )


def random_room(rng: np.random.Generator, batch: Batch) -> int:
    """Bytes the data file may still grow: mostly less than the batch needs, sometimes more."""
    need = (batch.adds + batch.texts) * (PARAMS["num_perm"] * 4 + batch.meta_bytes + 400)
    choice = rng.random()
    if choice < 0.15:
        return 0
    if choice < 0.4:
        return int(rng.integers(1, 64 * KiB))
    return int(rng.integers(0, max(2, int(need * 1.3))))


def new_store(path: Path) -> tuple[Model, MinHasher]:
    if path.exists():
        shutil.rmtree(path)
    with Store.open(path, create=True, map_size=SMALLEST_MAP, **PARAMS) as store:
        return Model(store.banding, store.config.seed), store.hasher


def check_ok(path: Path) -> list[str]:
    with Store.open(path, read_only=True, map_size=SMALLEST_MAP) as store:
        report = store.check()
    return [] if report.ok else [str(v) for v in report.violations[:5]]


def fill(disk: Path, leave: int) -> Path:
    filler = disk / "filler"
    stat = os.statvfs(disk)
    free = stat.f_bfree * stat.f_frsize
    with filler.open("wb") as out:
        out.write(b"\0" * max(0, free - leave))
    return filler


def run(args: argparse.Namespace, mode: str, trials: int, root: Path) -> dict[str, Any]:
    """Run ``trials`` trials filling the disk the ``mode`` way; return the tallies."""
    rng = np.random.default_rng([args.seed, 0 if mode == "rlimit" else 1])
    path = root / "store"
    kinds: collections.Counter[str] = collections.Counter()
    detail: collections.Counter[str] = collections.Counter()
    grew = 0
    failures: list[dict[str, Any]] = []
    model, hasher = new_store(path)
    started = time.monotonic()
    for number in range(trials):
        too_big = mode == "tmpfs" and (path / "data.mdb").stat().st_size > args.tmpfs_mib * MiB / 3
        if number and (number % args.reset_every == 0 or too_big):
            model, hasher = new_store(path)
        batch = random_batch(rng, number, model)
        room = random_room(rng, batch)
        if mode == "rlimit":
            trial = disk_full_trial(path, model, hasher, batch, room, map_size=SMALLEST_MAP)
        else:
            filler = fill(root, room)
            trial = disk_full_trial(
                path, model, hasher, batch, None, between=filler.unlink, map_size=SMALLEST_MAP
            )
            filler.unlink(missing_ok=True)
        if trial.kind in ACCEPTED:
            problems = check_ok(path)
            if problems:
                trial = Trial("changed", trial.grew, "check(): " + "; ".join(problems))
        kinds[trial.kind] += 1
        if trial.kind == "typed":
            grew += trial.grew
            message = trial.messages[0].get("message", "")
            for name in ("File too large", "No space left", "Input/output error"):
                if name in message:
                    detail[name] += 1
        if trial.kind not in ACCEPTED:
            failures.append(
                {
                    "trial": number,
                    "kind": trial.kind,
                    "detail": trial.detail,
                    "messages": trial.messages,
                    "batch": batch.to_json(),
                    "room": room,
                }
            )
            model, hasher = new_store(path)  # the model no longer describes the store
        if (number + 1) % 25 == 0:
            print(f"  {mode}: {number + 1}/{trials} trials, {dict(kinds)}", flush=True)
    return {
        "mode": mode,
        "trials": trials,
        "kinds": {kind: kinds[kind] for kind in KINDS},
        "typed_while_growing_the_map": grew,
        "typed_by_engine_error": dict(detail),
        "seconds": round(time.monotonic() - started, 1),
        "failures": failures[:20],
    }


def mounted_tmpfs(size_mib: int) -> Path:
    if os.geteuid() != 0:
        raise SystemExit("--mode tmpfs needs root (it mounts a small tmpfs)")
    point = Path(tempfile.mkdtemp(prefix="neardup-full-"))
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    return point


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    modes = ["rlimit", "tmpfs"] if args.mode == "both" else [args.mode]
    share = [args.trials // len(modes) + (i < args.trials % len(modes)) for i in range(len(modes))]
    runs = []
    for mode, trials in zip(modes, share, strict=True):
        if mode == "rlimit":
            with tempfile.TemporaryDirectory(prefix="neardup-full-") as root:
                runs.append(run(args, mode, trials, Path(root)))
        else:
            point = mounted_tmpfs(args.tmpfs_mib)
            try:
                runs.append(run(args, mode, trials, point))
            finally:
                subprocess.run(["umount", "-l", str(point)], check=False)
                point.rmdir()
    total = {kind: sum(r["kinds"][kind] for r in runs) for kind in KINDS}
    bad = sum(n for kind, n in total.items() if kind not in ACCEPTED)
    report = {
        "tool": "disk_full_trials",
        "args": {k: str(v) for k, v in vars(args).items()},
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load": os.getloadavg(),
        },
        "trials": sum(r["trials"] for r in runs),
        "totals": total,
        "unacceptable": bad,
        "runs": runs,
    }
    print(f"disk-full trials: {report['trials']}")
    print(f"  committed (batch fitted):      {total['committed']}")
    print(f"  typed StoreFullError:          {total['typed']}")
    for kind in KINDS[2:]:
        print(f"  {kind + ':':<31}{total[kind]}")
    for r in runs:
        print(
            f"  [{r['mode']}] typed while growing the map: {r['typed_while_growing_the_map']}; "
            f"engine errors: {r['typed_by_engine_error']}; {r['seconds']} s"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
