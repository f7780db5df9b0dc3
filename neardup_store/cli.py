"""``neardup-admin``: the command line, a thin layer over the library.

Each command parses its options, makes one library call and renders the result: an
aligned table for people, ``--json`` (JSON lines) for programs. Exit codes: 0 success,
1 findings, 2 usage or input errors. Errors the package raises on purpose become one
``Error:`` line; anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import json
from typing import Any

import click

from ._version import __version__
from .demo import DemoResult, run_demo
from .errors import NeardupError
from .minhash import SCHEMES, MinHashConfig


class InputError(click.ClickException):
    """A library error shown as one ``Error:`` line with exit code 2."""

    exit_code = 2


class _Group(click.Group):
    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except NeardupError as err:
            raise InputError(str(err)) from err


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="neardup-admin")
def cli() -> None:
    """Operate neardup_store near-duplicate indexes."""


@cli.command()
@click.option(
    "--docs", default=400, show_default=True, type=click.IntRange(2), help="Documents to generate."
)
@click.option(
    "--groups",
    default=40,
    show_default=True,
    type=click.IntRange(0),
    help="Near-duplicate groups to plant.",
)
@click.option(
    "--seed", default=7, show_default=True, type=click.IntRange(0), help="Corpus generator seed."
)
@click.option(
    "--threshold", default=0.7, show_default=True, type=float, help="Jaccard threshold in (0, 1)."
)
@click.option("--num-perm", default=128, show_default=True, type=int, help="Signature length.")
@click.option(
    "--scheme", default="oph", show_default=True, type=click.Choice(SCHEMES), help="MinHash scheme."
)
@click.option(
    "--path",
    type=click.Path(file_okay=False),
    default=None,
    help="Keep the demo store here (a new directory) instead of a temporary one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines instead of a table.")
def demo(
    docs: int,
    groups: int,
    seed: int,
    threshold: float,
    num_perm: int,
    scheme: str,
    path: str | None,
    as_json: bool,
) -> None:
    """Find near-duplicates in a generated sample corpus (no data needed).

    The corpus is made by neardup_store itself, deterministically from --seed, with
    planted near-duplicate groups; the command indexes it in a real store (temporary
    unless --path is given), reads back the store's near-duplicate clusters and prints
    them next to what was planted.

    \b
    Example:
        neardup-admin demo
        neardup-admin demo --docs 2000 --threshold 0.8 --json
        neardup-admin demo --path ./demo.ndx
    """
    config = MinHashConfig(num_perm=num_perm, scheme=scheme)  # type: ignore[arg-type]
    result = run_demo(docs, groups, seed, threshold, config, path)
    if as_json:
        _print_demo_json(result)
    else:
        _print_demo_table(result)


def _print_demo_table(result: DemoResult) -> None:
    p = result.params
    click.echo(
        f"{result.document_count} documents, num_perm={result.config.num_perm} "
        f"scheme={result.config.scheme}, threshold={result.threshold}: "
        f"{p.bands} bands x {p.rows} rows (S-curve midpoint ~{p.approx_threshold:.2f}, "
        f"false positives {p.false_positive_rate(result.threshold):.2%}, "
        f"false negatives {p.false_negative_rate(result.threshold):.2%})"
    )
    where = result.store_path or "a temporary store"
    click.echo(f"Indexed in {where} ({result.store_bytes / 1e6:.1f} MB on disk).")
    click.echo()
    width = max((len(k) for g in result.groups for k in g.keys), default=8)
    click.echo(f"{'group':>5}  {'key':<{width}}  est. Jaccard to first")
    for number, group in enumerate(result.groups, 1):
        for i, (key, sim) in enumerate(zip(group.keys, group.similarities, strict=True)):
            label = str(number) if i == 0 else ""
            click.echo(f"{label:>5}  {key:<{width}}  {sim:.3f}")
    click.echo()
    click.echo(
        f"{len(result.groups)} groups found; {result.exact_matches} of "
        f"{len(result.planted)} planted groups found exactly."
    )


def _print_demo_json(result: DemoResult) -> None:
    for group in result.groups:
        click.echo(json.dumps({"keys": group.keys, "similarities": group.similarities}))
    summary = {
        "summary": {
            "documents": result.document_count,
            "bands": result.params.bands,
            "rows": result.params.rows,
            "threshold": result.threshold,
            "config": result.config.to_dict(),
            "groups_found": len(result.groups),
            "planted_groups": len(result.planted),
            "planted_found_exactly": result.exact_matches,
            "store_path": result.store_path,
            "store_bytes": result.store_bytes,
        }
    }
    click.echo(json.dumps(summary))


def main() -> None:
    """Console-script entry point."""
    cli(prog_name="neardup-admin")
