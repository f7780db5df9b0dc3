"""Test-only fault hook: kill this process at a chosen point inside a write.

Not an API. The crash suite (``tests/test_crash.py``, ``tools/crash_loop.py``) uses it to
SIGKILL a writer at exact places inside a write transaction, where a random kill would
land only by luck. The write path calls :func:`checkpoint` at these points:

=================  ===========================================================
``after-put``      a document's record and key entry are written, its band
                   entries not yet
``after-bands``    a document's band entries are written
``after-remove``   a document's record and key entry are deleted, its record
                   moved to ``removed`` (older formats: its band entries deleted)
``after-purge``    a purge's band entries and ``removed`` records are deleted
``before-commit``  the counters are written; LMDB's commit comes next
``after-commit``   LMDB's commit has returned; the caller has not seen it yet
``after-grow``     the map was just grown (before a write, or before a replay)
``before-create``  a new store's meta table is written but not committed
=================  ===========================================================

The batch paths (``add_many``/``add_signatures`` of new keys, ``remove_many``) write a whole
batch table by table, so there each point is reached once per batch: ``after-put`` when
every record and key entry of the batch is written, and so on.

It is armed only by the environment variable ``NEARDUP_FAULT=<point>:<n>``, read once at
import: the ``n``-th time ``<point>`` is reached in this process, the process sends itself
SIGKILL (no cleanup, no atexit, no flush: what a crash does). Unarmed, a checkpoint costs
one function call and one comparison with ``None``.
"""

from __future__ import annotations

import os
import signal

ENV_VAR = "NEARDUP_FAULT"
POINTS = (
    "after-put",
    "after-bands",
    "after-remove",
    "after-purge",
    "before-commit",
    "after-commit",
    "after-grow",
    "before-create",
)


def _parse(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    point, _, count = value.rpartition(":")
    if point not in POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{ENV_VAR}={value!r}: expected <point>:<n> with n >= 1 and point one of "
            f"{', '.join(POINTS)}; unset it outside the crash tests"
        )
    return point, int(count)


_armed = _parse(os.environ.get(ENV_VAR))
_reached = 0


def checkpoint(name: str) -> None:
    """SIGKILL this process if the armed point ``name`` is reached for the n-th time."""
    if _armed is None:
        return
    global _reached
    if name == _armed[0]:
        _reached += 1
        if _reached == _armed[1]:
            os.kill(os.getpid(), signal.SIGKILL)
