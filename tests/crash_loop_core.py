"""The crash loop shared by ``tests/test_crash.py`` (short) and ``tools/crash_loop.py`` (long).

One :class:`CrashLoop` owns one store. Each round starts ``tests/crash_writer.py`` on it,
continuing from the batch after the last one the store holds, and ends it with SIGKILL:
either from outside at a random moment (after a random number of acknowledgements plus a
random delay), or from inside through a fault point of :mod:`neardup_store._faults`.
After every kill the store is verified against the promise "a crash leaves the last
committed state":

* it opens;
* it holds the last acknowledged batch, and at most one more (an acknowledgement the
  kill cut off); for a fault point it is exactly the batch that point implies;
* its documents, signatures, metadata and band entries equal :func:`expected_model`'s,
  and as many removed documents await a purge as the model counts;
* no band entry points at a missing document, and ``check()`` finds nothing.

Kills accumulate on the same store, as they would on a real one.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from crash_writer import CREATE_MAP_SIZE, STORE_OPTIONS, ModelBuilder, committed_s
from harness import orphan_band_entries

from neardup_store import NeardupError, Store

TESTS_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = TESTS_DIR.parent
WRITER = TESTS_DIR / "crash_writer.py"

IN_TRANSACTION = ("after-put", "after-bands", "after-remove", "after-purge", "before-commit")
"""Fault points inside a write transaction: the batch in progress must vanish."""
FAULT_POINTS = (*IN_TRANSACTION, "after-commit", "after-grow", "before-create")
OPENING_FAULTS = ("before-create:1", "after-grow:1", "after-grow:2")
"""A fresh store's first rounds: a creation killed before its commit, then kills right
after the map grew. On a fresh store the first two growths happen when batches 0 and 1 run
out of room (``MapFullError``) and are about to be redone; the second writer run dies at
the first, so the third, starting again from batch 0, is armed for the second."""
FAULT_ROUND_LIMIT = 40
"""A fault round's writer stops after this many batches if its point was not reached."""
ACK_TIMEOUT_S = 120.0  # generous: the machine may be loaded; a stall is still a failure
EXIT_TIMEOUT_S = 300.0
LOST = "lost acknowledged batches"


@dataclass
class Round:
    """What one writer run and the verification after it found."""

    index: int
    fault: str | None  # "<point>:<n>", or None for a kill from outside
    start: int
    acks: int
    last_acked: int
    found: int | None
    killed: bool
    seconds: float
    problems: list[str] = field(default_factory=list)

    @property
    def lost(self) -> int:
        """Acknowledged batches the store no longer holds."""
        if self.found is None:
            return 0
        return max(0, self.last_acked - self.found)


@dataclass
class Summary:
    """The figures of a crash loop (the README table reports these)."""

    seed: int
    rounds: int = 0
    kills: int = 0
    fault_kills: int = 0
    fault_kills_by_point: dict[str, int] = field(default_factory=dict)
    faults_not_reached: int = 0
    acknowledged_commits: int = 0
    lost_acknowledged_commits: int = 0
    invariant_violations: int = 0
    unacknowledged_present: int = 0
    last_committed: int = -1
    documents: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class CrashLoop:
    """Kill a writer on one store again and again, verifying the store after each kill.

    Args:
        path: the store directory (created by the first writer).
        seed: the writer's seed (which batches it writes).
        rng_seed: seed of the kill schedule (delays, fault counts).
    """

    def __init__(self, path: Path, seed: int, rng_seed: int) -> None:
        self.path = Path(path)
        self.seed = seed
        self.rng = np.random.default_rng(rng_seed)
        self.models = ModelBuilder(seed)
        self.committed = -1  # the last batch the store was verified to hold
        self.summary = Summary(seed=seed)
        self.rounds: list[Round] = []
        self._started = time.monotonic()

    # -- one round --------------------------------------------------------------------------

    def run_round(self, fault: str | None = None, extra_env: dict[str, str] | None = None) -> Round:
        """Run the writer until it is killed (at ``fault``, or at a random moment), verify."""
        began = time.monotonic()
        start = self.committed + 1
        env = {**os.environ, "PYTHONPATH": str(PROJECT_ROOT), **(extra_env or {})}
        env.pop("NEARDUP_FAULT", None)
        command = [sys.executable, str(WRITER), str(self.path), str(self.seed), str(start)]
        if fault is not None:
            env["NEARDUP_FAULT"] = fault
            command.append(str(start + FAULT_ROUND_LIMIT - 1))
        with tempfile.TemporaryFile() as stderr:
            process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=stderr, env=env, text=True
            )
            acks = _Acks(process)
            problems: list[str] = []
            if fault is None:
                self._kill_at_random(process, acks, problems)
            try:
                returncode = process.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                returncode = process.wait()
                problems.append(f"writer did not stop within {EXIT_TIMEOUT_S:.0f} s")
            seen = acks.all()
            stderr.seek(0)
            errors = stderr.read().decode(errors="replace").strip()
        killed = returncode == -signal.SIGKILL
        if fault is not None and returncode == 0:
            self.summary.faults_not_reached += 1
        elif not killed:
            problems.append(f"writer exited with {returncode}: {errors[-2000:]}")
        if seen != list(range(start, start + len(seen))):
            problems.append(f"acknowledgements out of order: {seen[:10]}...")
        last_acked = seen[-1] if seen else start - 1
        found = self._verify(last_acked, problems)
        if fault is not None and killed and found is not None:
            point = fault.rpartition(":")[0]
            expected = last_acked + 1 if point == "after-commit" else last_acked
            if found != expected:
                problems.append(f"{fault}: store holds batch {found}, expected {expected}")
        result = Round(
            len(self.rounds), fault, start, len(seen), last_acked, found, killed,
            time.monotonic() - began, problems,
        )  # fmt: skip
        self._count(result)
        return result

    def _kill_at_random(
        self, process: subprocess.Popen[str], acks: _Acks, problems: list[str]
    ) -> None:
        """SIGKILL after 0-5 acknowledgements (the writer's own pace) and 0-60 ms more."""
        wanted = int(self.rng.integers(0, 6))
        delay_s = float(self.rng.uniform(0.0, 0.06))
        if not acks.wait_for(wanted, ACK_TIMEOUT_S):
            problems.append(f"no {wanted} acknowledgements within {ACK_TIMEOUT_S:.0f} s")
        time.sleep(delay_s)
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)

    # -- verification -----------------------------------------------------------------------

    def _verify(self, last_acked: int, problems: list[str]) -> int | None:
        """Check the store after a kill; return the last batch it holds (None: unusable)."""
        try:
            # Nothing acknowledged yet: the store may not exist; open it as the writer does.
            options = (
                {"create": True, "map_size": CREATE_MAP_SIZE, **STORE_OPTIONS}
                if last_acked < 0
                else {}
            )
            with Store.open(self.path, **options) as store:
                found = committed_s(store)
                report = store.check()
                documents = len(store)
                with store.read() as reader:
                    awaiting = reader.awaiting_purge()
        except NeardupError as err:
            problems.append(f"store does not open: {type(err).__name__}: {err}")
            return None
        if not report.ok:
            problems.append(f"check: {[str(v) for v in report.violations[:5]]}")
        if found < last_acked:
            problems.append(f"{LOST} {found + 1}..{last_acked}")
        elif found > last_acked + 1:
            problems.append(
                f"holds batch {found}, more than one past the acknowledged {last_acked}"
            )
        differences = self.models.advance(found).differences(self.path)
        if differences:
            problems.append(f"differs from the model at batch {found}: {differences[:5]}")
        if awaiting != self.models.awaiting:
            problems.append(
                f"{awaiting} removed documents await a purge at batch {found}, "
                f"the model counts {self.models.awaiting}"
            )
        orphans = orphan_band_entries(self.path)
        if orphans:
            problems.append(f"{len(orphans)} orphan band entries, e.g. {orphans[0]}")
        self.committed = found
        self.summary.documents = documents
        return found

    def _count(self, result: Round) -> None:
        summary = self.summary
        self.rounds.append(result)
        summary.rounds += 1
        summary.kills += result.killed
        if result.fault is not None and result.killed:
            summary.fault_kills += 1
            point = result.fault.rpartition(":")[0]
            summary.fault_kills_by_point[point] = summary.fault_kills_by_point.get(point, 0) + 1
        summary.acknowledged_commits += result.acks
        summary.lost_acknowledged_commits += result.lost
        if result.found is not None and result.found == result.last_acked + 1:
            summary.unacknowledged_present += 1
        summary.invariant_violations += sum(not p.startswith(LOST) for p in result.problems)
        summary.problems.extend(
            f"round {result.index} ({result.fault}): {p}" for p in result.problems
        )
        summary.last_committed = self.committed
        summary.seconds = time.monotonic() - self._started

    # -- a whole loop -----------------------------------------------------------------------

    def random_fault(self) -> str:
        """A fault point inside or right after a transaction, at a random occurrence."""
        point = str(self.rng.choice([*IN_TRANSACTION, "after-commit"]))
        # after-purge: a purging batch every crash_writer.PURGE_EVERY (13 in a round).
        most = {"after-put": 60, "after-bands": 60, "after-remove": 40, "after-purge": 10}.get(
            point, 6
        )
        return f"{point}:{int(self.rng.integers(1, most + 1))}"

    def run(
        self,
        kills: int,
        fault_share: float = 0.25,
        progress: bool = False,
        max_seconds: float | None = None,
    ) -> Summary:
        """Kill ``kills`` times; a fresh store starts with the creation and growth points.

        A ``fault_share`` of the rounds use a random fault point, the rest kill from
        outside. A fault point not reached within :data:`FAULT_ROUND_LIMIT` batches ends
        its round without a kill, so rounds continue until ``kills`` kills happened, or
        until ``max_seconds`` have passed (the summary then says how many there were).
        """
        opening = [] if (self.path / "data.mdb").exists() else list(OPENING_FAULTS)
        began = time.monotonic()
        while self.summary.kills < kills:
            if max_seconds is not None and time.monotonic() - began > max_seconds:
                break
            if opening:
                fault: str | None = opening.pop(0)
            elif self.rng.random() < fault_share:
                fault = self.random_fault()
            else:
                fault = None
            self._round(fault, progress)
        return self.summary

    def run_schedule(self, faults: list[str | None], progress: bool = False) -> Summary:
        """One round per entry: a fault point, or ``None`` for a kill at a random moment."""
        for fault in faults:
            self._round(fault, progress)
        return self.summary

    def _round(self, fault: str | None, progress: bool) -> None:
        result = self.run_round(fault)
        if progress:
            state = "ok" if not result.problems else "; ".join(result.problems)
            print(
                f"kill {self.summary.kills:4d}  {result.fault or 'random':<16} "
                f"acks {result.acks:3d}  store at {result.found}  {state}",
                flush=True,
            )


class _Acks:
    """The ``ack s`` lines of a writer, collected by a thread as they arrive."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self._seen: list[int] = []
        self._closed = False
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._read, args=(process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            word, _, number = line.strip().partition(" ")
            if word == "ack":
                with self._changed:
                    self._seen.append(int(number))
                    self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def wait_for(self, count: int, timeout_s: float) -> bool:
        """Wait for ``count`` acknowledgements; False if stdout closed or time ran out first."""
        with self._changed:
            self._changed.wait_for(lambda: len(self._seen) >= count or self._closed, timeout_s)
            return len(self._seen) >= count

    def all(self) -> list[int]:
        """Every acknowledgement, once the writer has exited (its stdout then closes)."""
        self._thread.join()
        return list(self._seen)
