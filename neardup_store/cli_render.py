"""Rendering for ``neardup-admin``: aligned tables, JSON lines, CSV and the S-curve plot.

Kept apart from :mod:`.cli` so the commands stay a readable list of "open, call, render";
nothing here touches a store, it only turns library results into text.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Sequence
from typing import Any

import click
import numpy as np

from .demo import DemoResult
from .ingest import Failure, json_text, key_text
from .lsh import LSHParams
from .maintenance import (
    BackupReport,
    CheckReport,
    CompactReport,
    RebuildReport,
    StoreStats,
    bucket_size_range,
)


def json_line(record: dict[str, Any]) -> None:
    """Print one JSON-lines record (machine output goes to stdout, one object a line),
    through :func:`.ingest.json_text`, which writes nothing that is not JSON."""
    click.echo(json_text(record))


def failure_record(failure: Failure) -> dict[str, Any]:
    """An input that could not be used, as one JSON-lines record: where (``source``, and
    ``file`` and ``line`` apart), the ``key`` if one was read, the ``error`` type's name
    and the ``message``. Every field is present, ``null`` where unknown."""
    key = failure.key
    return {
        "failed": {
            "source": failure.source,
            "file": failure.file,
            "line": failure.line,
            "key": key_text(key) if isinstance(key, (str, bytes)) else key,
            "error": failure.error,
            "message": failure.reason,
        }
    }


def failures(failed: Sequence[Failure], as_json: bool, more: str, shown: int = 10) -> None:
    """Every failure as a JSON line, or the first ``shown`` with their reasons and a pointer
    (``more``) to where the rest are."""
    if as_json:
        for failure in failed:
            json_line(failure_record(failure))
        return
    for failure in failed[:shown]:
        click.echo(f"  failed: {failure.source}: {failure.reason}")
    if len(failed) > shown:
        click.echo(f"  ... {len(failed) - shown} more failures ({more})")


def summary(record: dict[str, Any], as_json: bool) -> None:
    """A command's totals: one ``{"summary": ...}`` line, or ``name value`` pairs on one line
    for people (leaving out what does not apply, such as a resume point of a fresh run)."""
    if as_json:
        json_line({"summary": record})
    else:
        click.echo(", ".join(f"{k} {v}" for k, v in record.items() if v is not None))


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print an aligned table: numbers right-aligned, text left-aligned, floats to 4 places.

    Text is printed as it is: pass keys through :func:`key_text` first."""
    raw = [list(row) for row in rows]
    cells = [[_cell(v) for v in row] for row in raw]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    numeric = [
        bool(raw) and all(_is_number(r[i]) or r[i] is None for r in raw)
        for i in range(len(headers))
    ]
    click.echo(_join(headers, widths, numeric))
    for row in cells:
        click.echo(_join(row, widths, numeric))


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    if isinstance(value, bytes):
        return key_text(value)
    return "" if value is None else str(value)


def _join(cells: Sequence[str], widths: list[int], numeric: list[bool]) -> str:
    parts = [
        c.rjust(w) if num else c.ljust(w) for c, w, num in zip(cells, widths, numeric, strict=True)
    ]
    return "  ".join(parts).rstrip()


def csv_rows(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """Print CSV with a header line (streamed row by row); keys as :func:`table` takes them."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(headers)
    click.echo(buffer.getvalue(), nl=False)
    for row in rows:
        buffer.seek(0)
        buffer.truncate()
        writer.writerow([key_text(v) if isinstance(v, bytes) else v for v in row])
        click.echo(buffer.getvalue(), nl=False)


def banding_summary(banding: LSHParams, threshold: float) -> dict[str, Any]:
    """Bands, rows and the expected error rates at ``threshold`` (rates need 0 < t < 1)."""
    summary: dict[str, Any] = {
        "bands": banding.bands,
        "rows": banding.rows,
        "threshold": threshold,
        "approx_threshold": round(banding.approx_threshold, 6),
    }
    if 0.0 < threshold < 1.0:
        summary["false_positive_rate"] = banding.false_positive_rate(threshold)
        summary["false_negative_rate"] = banding.false_negative_rate(threshold)
    return summary


def banding_line(summary: dict[str, Any]) -> str:
    """One human line for :func:`banding_summary`."""
    line = (
        f"{summary['bands']} bands x {summary['rows']} rows at threshold "
        f"{summary['threshold']} (S-curve midpoint ~{summary['approx_threshold']:.2f})"
    )
    if "false_positive_rate" in summary:
        line += (
            f": false positives {summary['false_positive_rate']:.2%}, "
            f"false negatives {summary['false_negative_rate']:.2%}"
        )
    return line


def ascii_plot(
    banding: LSHParams, threshold: float, width: int = 60, height: int = 20
) -> list[str]:
    """The S-curve as text: ``*`` the curve, ``|`` the threshold column, axes labelled."""
    grid = [[" "] * width for _ in range(height)]
    t_col = round(threshold * (width - 1))
    for row in grid:
        row[t_col] = "|"
    previous: int | None = None
    for col in range(width):
        p = float(banding.probability(col / (width - 1)))
        level = round(p * (height - 1))
        # Join steep steps with a vertical run, so the rise reads as one curve.
        if previous is None or level == previous:
            ys = range(level, level + 1)
        elif level > previous:
            ys = range(previous + 1, level + 1)
        else:
            ys = range(level, previous)
        for y in ys:
            grid[height - 1 - y][col] = "*"
        previous = level
    lines = []
    for i, row in enumerate(grid):
        label = "1.0" if i == 0 else "0.0" if i == height - 1 else ""
        lines.append(f"{label:>4} |{''.join(row)}".rstrip())
    lines.append("     +" + "-" * width)
    axis = "0.0".ljust(width // 2) + "0.5".ljust(width - width // 2 - 3) + "1.0"
    lines.append("      " + axis)
    lines.append("      candidate probability vs Jaccard similarity (| = threshold)")
    return lines


def render_info(params: dict[str, Any], documents: int, file_bytes: int, as_json: bool) -> None:
    """``info``: what a store is (parameters) and how big, without walking its tables."""
    record = {"documents": documents, "file_bytes": file_bytes, "params": params}
    if as_json:
        json_line(record)
        return
    rows: list[tuple[str, Any]] = [("documents", documents), ("file_bytes", file_bytes)]
    rows += list(params.items())
    width = max(len(k) for k, _ in rows)
    for name, value in rows:
        click.echo(f"{name:<{width}}  {value}")


def render_stats(stats: StoreStats, as_json: bool) -> None:
    """``stats``: sizes, counters, parameters, bucket-size histogram and largest buckets."""
    base = {
        "documents": stats.documents,
        "awaiting_purge": stats.awaiting_purge,
        "commit_counter": stats.commit_counter,
        "generation": stats.generation,
        "format_version": stats.format_version,
        "file_bytes": stats.file_bytes,
        "used_bytes": stats.used_bytes,
        "free_bytes": stats.free_bytes,
        "free_pages": stats.free_pages,
        "map_size": stats.map_size,
        "readers": stats.readers,
        "active_readers": stats.active_readers,
        "oldest_snapshot_lag": stats.oldest_snapshot_lag,
        "oldest_snapshot_pid": stats.oldest_snapshot_pid,
        "params": stats.params,
    }
    if as_json:
        json_line(base)
        for band in stats.bands:
            json_line(
                {
                    "band": band.band,
                    "buckets": band.buckets,
                    "entries": band.entries,
                    "histogram": list(band.histogram),
                }
            )
        for bucket in stats.largest_buckets:
            json_line(
                {
                    "largest_bucket": {
                        "band": bucket.band,
                        "size": bucket.size,
                        "sample_keys": [key_text(k) for k in bucket.sample_keys],
                    }
                }
            )
        return
    rows: list[tuple[str, Any]] = [(k, v) for k, v in base.items() if k != "params"]
    rows += [(k, v) for k, v in stats.params.items()]
    width = max(len(k) for k, _ in rows)
    for name, value in rows:
        click.echo(f"{name:<{width}}  {value}")
    click.echo()
    click.echo("Bucket sizes (buckets per size range, summed over bands):")
    totals: list[int] = []
    for band in stats.bands:
        for i, count in enumerate(band.histogram):
            if i == len(totals):
                totals.append(0)
            totals[i] += count
    hist_rows = []
    for i, count in enumerate(totals):
        low, high = bucket_size_range(i)
        hist_rows.append((str(low) if low == high else f"{low}-{high}", count))
    table(("size", "buckets"), hist_rows)
    click.echo()
    click.echo("Largest buckets (often shared boilerplate):")
    table(
        ("band", "size", "sample keys"),
        [
            (b.band, b.size, ", ".join(key_text(k) for k in b.sample_keys))
            for b in stats.largest_buckets
        ],
    )


def render_check(report: CheckReport, as_json: bool) -> None:
    """Violations found (and what remains after a repair), then a one-line verdict. A
    violation's key (a damaged record's, say) prints as every command prints keys, in
    the detail and in JSON's ``key``, so that ``remove`` takes it as it is."""
    if as_json:
        for v in report.violations:
            key = None if v.key is None else key_text(v.key)
            json_line({"kind": v.kind, "detail": v.detail, "doc_id": v.doc_id, "key": key})
        json_line(
            {
                "summary": {
                    "documents_checked": report.documents_checked,
                    "violations": len(report.violations),
                    "repaired": report.repaired,
                    "remaining": len(report.remaining) if report.repaired else None,
                    "ok": report.ok,
                }
            }
        )
        return
    if report.violations:
        table(
            ("kind", "doc id", "detail"),
            [(v.kind, v.doc_id, v.detail) for v in report.violations],
        )
    verdict = "OK" if report.ok else "VIOLATIONS"
    line = f"{verdict}: {report.documents_checked} documents checked, "
    line += f"{len(report.violations)} violations found"
    if report.repaired:
        line += f", {len(report.remaining)} remain after repair"
    click.echo(line + ".")


def render_compact(report: CompactReport, as_json: bool) -> None:
    """Sizes before/after (or the estimate, for a dry run)."""
    record = {
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "reclaimed_bytes": report.reclaimed_bytes,
        "dry_run": report.dry_run,
    }
    if as_json:
        json_line(record)
        return
    verb = "would reclaim" if report.dry_run else "reclaimed"
    click.echo(
        f"{report.bytes_before} -> {report.bytes_after} bytes: {verb} {report.reclaimed_bytes}."
    )


def render_rebuild(report: RebuildReport, as_json: bool) -> None:
    """Old and new banding of a rebuilt store."""
    old, new = report.old_params, report.new_params
    record = {
        "documents": report.documents,
        "generation": report.generation,
        "old": banding_summary(old.banding, old.threshold),
        "new": banding_summary(new.banding, new.threshold),
    }
    if as_json:
        json_line(record)
        return
    click.echo(f"Rebuilt {report.documents} documents (generation {report.generation}).")
    click.echo("old: " + banding_line(record["old"]))
    click.echo("new: " + banding_line(record["new"]))


def render_backup(report: BackupReport, as_json: bool) -> None:
    """Where the backup went and what it holds."""
    record = {"path": report.path, "documents": report.documents, "file_bytes": report.file_bytes}
    if as_json:
        json_line(record)
        return
    click.echo(
        f"Backed up {report.documents} documents ({report.file_bytes} bytes) to {report.path}."
    )


def save_png(banding: LSHParams, threshold: float, path: str) -> None:
    """Plot the S-curve with matplotlib (an optional extra, imported only here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = np.linspace(0.0, 1.0, 201)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(s, banding.probability(s), label=f"b={banding.bands}, r={banding.rows}")
    ax.axvline(threshold, linestyle="--", color="grey", label=f"threshold {threshold}")
    ax.set_xlabel("Jaccard similarity")
    ax.set_ylabel("P(candidate)")
    ax.legend()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def demo_table(result: DemoResult) -> None:
    """``demo``: the banding line, the groups found, and the comparison with the planted ones."""
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
    click.echo(f"{'group':>5}  {'key':<{width}}  est. Jaccard to first  planted")
    for number, group in enumerate(result.groups, 1):
        for i, (key, sim) in enumerate(zip(group.keys, group.similarities, strict=True)):
            label, planted = (
                (str(number), _yes_no(result.was_planted(group))) if i == 0 else ("", "")
            )
            click.echo(f"{label:>5}  {key:<{width}}  {sim:<21.3f}  {planted}".rstrip())
    click.echo()
    click.echo(
        f"{len(result.groups)} groups found; {result.exact_matches} of "
        f"{len(result.planted)} planted groups found exactly."
    )
    for group in result.missed:
        click.echo(f"Planted, not found as one group: {', '.join(group)}")


def _yes_no(flag: bool) -> str:
    return "yes" if flag else "no"


def demo_json(result: DemoResult) -> None:
    """``demo --json``: one line per group found (and whether it was planted), then a
    summary line with the planted groups not found as one group."""
    for group in result.groups:
        found = {"keys": group.keys, "similarities": group.similarities}
        json_line({**found, "planted": result.was_planted(group)})
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
            "planted_missed": result.missed,
            "store_path": result.store_path,
            "store_bytes": result.store_bytes,
        }
    }
    json_line(summary)
