"""Argument types shared by the tools' command lines: a count that tests nothing (0 kills,
-1 trials) must be a usage error (exit 2), not a run that passes."""

from __future__ import annotations

from collections.abc import Callable


def at_least(low: float, kind: type = int) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` of at least ``low``."""

    def parse(text: str) -> float:
        value = kind(text)
        if value < low:
            raise ValueError(text)
        return value

    parse.__name__ = f"{kind.__name__} >= {low}"  # how argparse names it in its error
    return parse
