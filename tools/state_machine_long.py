"""The model-based store test with the long setting (CI runs it short).

Runs ``tests/test_state_machine.py``'s :class:`StoreMachine` with more examples and
longer step sequences, in independent rounds (each round is one hypothesis run, so a
failure in one round does not hide the others), and prints examples × steps and failures.
A failure's shrunk example is printed and kept in the JSON: turn it into a regression
test in ``tests/test_state_machine.py``.

    python tools/state_machine_long.py --examples 500 --steps 60
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from arguments import at_least  # noqa: E402
from hypothesis import settings  # noqa: E402
from hypothesis.stateful import run_state_machine_as_test  # noqa: E402

from tests.test_state_machine import CI_SETTINGS, StoreMachine  # noqa: E402

RESULTS = PROJECT_ROOT / "tools" / "results"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=at_least(1), default=500, help="examples in all (500)")
    parser.add_argument("--steps", type=at_least(1), default=60, help="max steps per example (60)")
    parser.add_argument(
        "--rounds", type=int, default=5, help="independent hypothesis runs sharing --examples"
    )
    parser.add_argument(
        "--seed", type=int, default=None, help="seed of the first round (default: random)"
    )
    parser.add_argument(
        "--json", type=Path, default=RESULTS / "state_machine_long.json", help="where to write"
    )
    return parser.parse_args(argv)


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def run_round(examples: int, steps: int, seed: int) -> dict[str, Any]:
    """One hypothesis run; its examples, steps and failure (shrunk example), if any."""
    # Without an explicit seed every run_state_machine_as_test call draws the same examples.
    StoreMachine._hypothesis_internal_use_seed = seed  # what hypothesis.seed() sets
    before = (StoreMachine.examples, StoreMachine.steps)
    settings.register_profile(
        "state-machine-long",
        CI_SETTINGS,
        max_examples=examples,
        stateful_step_count=steps,
        database=None,  # independent rounds: replay nothing from earlier runs
    )
    chosen = settings.get_profile("state-machine-long")
    started = time.perf_counter()
    failure = None
    try:
        run_state_machine_as_test(StoreMachine, settings=chosen)
    except Exception as err:  # a failing example (after shrinking): record, go on
        notes = "\n".join(getattr(err, "__notes__", []))
        failure = "".join(traceback.format_exception_only(err)) + notes
    return {
        "seed": seed,
        # includes the shrinking phase's re-runs when a round fails
        "examples": StoreMachine.examples - before[0],
        "steps": StoreMachine.steps - before[1],
        "seconds": round(time.perf_counter() - started, 1),
        "failure": failure,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.examples < 1 or args.steps < 1 or args.rounds < 1:
        raise SystemExit("--examples, --steps and --rounds must be positive")
    per_round = [args.examples // args.rounds] * args.rounds
    for i in range(args.examples % args.rounds):
        per_round[i] += 1
    first_seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(4))
    rounds = []
    for index, examples in enumerate(n for n in per_round if n):
        result = run_round(examples, args.steps, first_seed + index)
        rounds.append(result)
        status = "ok" if result["failure"] is None else "FAILED"
        print(
            f"round {index + 1} (seed {result['seed']}): {result['examples']} examples, "
            f"{result['steps']} steps, {result['seconds']} s, {status}",
            flush=True,
        )
        if result["failure"]:
            print(result["failure"], flush=True)
    examples = sum(r["examples"] for r in rounds)
    steps = sum(r["steps"] for r in rounds)
    failures = sum(r["failure"] is not None for r in rounds)
    report = {
        "tool": "state_machine_long",
        "commit": _commit(),
        "python": platform.python_version(),
        "machine": platform.platform(),
        "asked": {"examples": args.examples, "max_steps": args.steps, "rounds": args.rounds},
        "examples": examples,
        "steps": steps,
        "mean_steps_per_example": round(steps / examples, 1) if examples else 0,
        "failures": failures,
        "seconds": round(sum(r["seconds"] for r in rounds), 1),
        "rounds": rounds,
    }
    print(
        f"state machine: {examples} examples x up to {args.steps} steps "
        f"({steps} steps, {report['mean_steps_per_example']} per example), "
        f"{failures} failures, {report['seconds']} s"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
