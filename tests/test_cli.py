"""The neardup-admin command line: help, version, demo, error handling."""

from __future__ import annotations

import csv
import errno
import importlib.util
import io
import json
import os
import pty
import resource
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
from click.testing import CliRunner, Result
from concurrency_scenarios import commit_counter
from harness import read_error_at_call
from test_maintenance import _missing_meta_entry, _put, raw_env

from neardup_store import Store, __version__, codec, ingest
from neardup_store import cli as cli_module
from neardup_store.cli import cli
from neardup_store.demo import make_corpus


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


def test_every_command_has_help_with_an_example(runner: CliRunner) -> None:
    assert cli.commands, "the CLI has commands"
    for name, command in cli.commands.items():
        result = runner.invoke(cli, [name, "--help"])
        assert result.exit_code == 0, name
        assert "Example:" in result.output, f"{name} --help has no example"
        assert command.help


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_demo_prints_groups_and_the_planted_comparison(runner: CliRunner) -> None:
    """Each found group says whether it was planted, and the planted groups not found as
    one group are listed (review 32: only a count was printed, so a planted group split
    in two could not be seen)."""
    result = runner.invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "bands x" in lines[0] and "threshold=0.7" in lines[0]
    missed_lines = [line for line in lines if line.startswith("Planted, not found as one group:")]
    summary = lines[-1 - len(missed_lines)]
    assert summary.endswith("planted groups found exactly.")
    found, planted = (
        int(summary.split(" of ")[0].split("; ")[1]),
        int(summary.split(" of ")[1].split()[0]),
    )
    assert planted == 40 and found >= 34 and len(missed_lines) == planted - found
    marks = [line.split()[-1] for line in lines if line[:5].strip().isdigit()]
    assert marks.count("yes") == found and set(marks) <= {"yes", "no"}
    corpus = make_corpus()
    for line in missed_lines:
        keys = line.split(": ", 1)[1].split(", ")
        assert keys in corpus.planted


def test_demo_json_lines(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["demo", "--docs", "120", "--groups", "10", "--json"])
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.output.splitlines()]
    groups, summary = records[:-1], records[-1]["summary"]
    assert summary["planted_groups"] == 10 and summary["groups_found"] == len(groups)
    assert all(len(g["keys"]) >= 2 and g["similarities"][0] == 1.0 for g in groups)
    assert summary["config"]["num_perm"] == 256
    planted = [g["keys"] for g in groups if g["planted"]]
    assert len(planted) == summary["planted_found_exactly"]
    assert len(summary["planted_missed"]) == 10 - len(planted)
    assert not any(g in planted for g in summary["planted_missed"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["demo", "--threshold", "1.5"], "Error: threshold=1.5 is not valid"),
        (["demo", "--num-perm", "0"], "Error: num_perm=0 is not valid"),
    ],
)
def test_library_errors_become_one_error_line_with_exit_2(
    runner: CliRunner, args: list[str], message: str
) -> None:
    result = runner.invoke(cli, args)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert result.output.startswith(message)
    assert "Traceback" not in result.output


def test_usage_errors_exit_2(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["demo", "--scheme", "bogus"])
    assert result.exit_code == 2 and "Invalid value for '--scheme'" in result.output
    assert runner.invoke(cli, ["no-such-command"]).exit_code == 2


def test_installed_entry_point_runs_in_a_subprocess() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "neardup_store", "demo", "--docs", "60", "--groups", "5", "--json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert json.loads(out.splitlines()[-1])["summary"]["planted_groups"] == 5
    bad = subprocess.run(
        [sys.executable, "-m", "neardup_store", "demo", "--threshold", "0"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("Error: threshold=0.0")


# -- store commands ---------------------------------------------------------------------------


@pytest.fixture
def store_path(tmp_path: Path, near_dup_corpus: dict[str, str]) -> Path:
    """A small store built through the library: two near-duplicate pairs, one loner."""
    path = tmp_path / "corpus.ndx"
    with Store.open(path, create=True, threshold=0.7) as store:
        store.add_many(near_dup_corpus.items())
    return path


def _run(runner: CliRunner, *args: object, input: bytes | str | None = None) -> Result:
    return runner.invoke(cli, [str(a) for a in args], input=input)


def _jsonl(output: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def test_init_creates_a_store_and_prints_the_banding(runner: CliRunner, tmp_path: Path) -> None:
    path = tmp_path / "new.ndx"
    result = _run(runner, "init", path, "--threshold", "0.6", "--num-perm", "64", "--no-casefold")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"Created {path}: ")
    assert "false positives" in result.output and "false negatives" in result.output
    with Store.open(path, read_only=True) as store:
        assert store.config.num_perm == 64 and not store.config.shingles.casefold
        assert store.threshold == 0.6
    again = _run(runner, "init", path, "--json")
    assert again.exit_code == 2
    assert (
        again.output
        == f"Error: {path}: a store already exists here; init only creates new stores\n"
    )


def test_init_json_with_explicit_banding(runner: CliRunner, tmp_path: Path) -> None:
    result = _run(runner, "init", tmp_path / "s", "--bands", "16", "--rows", "8", "--json")
    assert result.exit_code == 0, result.output
    (record,) = _jsonl(result.output)
    assert (record["bands"], record["rows"]) == (16, 8) and 0 < record["false_positive_rate"] < 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--threshold", "1.5"], "Error: threshold=1.5 is not valid"),
        (["--bands", "30", "--rows", "9"], "Error: bands*rows='30*9=270' is not valid"),
        (["--bands", "20"], "Error: bands/rows=(20, None) is not valid"),
        (["--shingle-size", "0"], "Error: size=0 is not valid"),
    ],
)
def test_init_rejects_bad_parameters(
    runner: CliRunner, tmp_path: Path, args: list[str], message: str
) -> None:
    result = _run(runner, "init", tmp_path / "s", *args)
    assert result.exit_code == 2 and result.output.startswith(message), result.output
    assert len(result.output.splitlines()) == 1
    assert not (tmp_path / "s" / "data.mdb").exists()


def test_params_table_plot_and_json(runner: CliRunner) -> None:
    result = _run(runner, "params", "--threshold", "0.8", "--num-perm", "128")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("num_perm=128: 16 bands x 8 rows at threshold 0.8")
    assert sum(1 for line in lines if line.strip().startswith("0.")) >= 20  # table rows
    plot = [line for line in lines if line.startswith("     |") or line.startswith(" 1.0 |")]
    assert len(plot) >= 19 and all(len(line) <= 66 for line in plot)
    rows = _jsonl(_run(runner, "params", "--threshold", "0.8", "--json").output)
    assert [r["similarity"] for r in rows[:-1]] == [round(i * 0.05, 2) for i in range(21)]
    assert rows[-1]["summary"]["bands"] == 25 and rows[-1]["summary"]["rows"] == 10
    assert rows[-1]["summary"]["num_perm"] == 256
    assert rows[0]["probability"] == 0.0 and rows[-2]["probability"] == 1.0


def test_params_weights_and_use_all(runner: CliRunner) -> None:
    result = _run(runner, "params", "--threshold", "0.5", "--num-perm", "64", "--use-all", "--json")
    summary = _jsonl(result.output)[-1]["summary"]
    assert summary["bands"] * summary["rows"] == 64
    bad = _run(runner, "params", "--threshold", "1.5")
    assert bad.exit_code == 2 and bad.output.startswith("Error: threshold=1.5 is not valid")


def test_params_png_without_matplotlib_says_how_to_get_it(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name)
    )
    result = _run(runner, "params", "--threshold", "0.8", "--png", tmp_path / "c.png")
    assert result.exit_code == 2
    assert result.output == (
        "Error: --png needs matplotlib, which is not installed: "
        "pip install 'neardup_store[plot]' (or matplotlib)\n"
    )


def test_query_text_table_json_and_fail_on_duplicates(
    runner: CliRunner, store_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    text = near_dup_corpus["storm-a"]
    result = _run(runner, "query", store_path, "--text", text)
    assert result.exit_code == 0, result.output
    header, *rows = result.output.splitlines()
    assert header.split() == ["query", "key", "score"]
    assert rows[0].split()[:2] == ["text", "storm-a"] and rows[0].endswith("1.0000")
    records = _jsonl(_run(runner, "query", store_path, "--text", text, "--json").output)
    assert records[0] == {"query": "text", "key": "storm-a", "score": 1.0}
    assert {r["key"] for r in records} == {"storm-a", "storm-b"}
    limited = _run(runner, "query", store_path, "--text", text, "--limit", "1", "--json")
    assert len(_jsonl(limited.output)) == 1
    assert _run(runner, "query", store_path, "--text", text, "--fail-on-duplicates").exit_code == 1
    none = _run(runner, "query", store_path, "--text", "zzz qqq xxx " * 5, "--fail-on-duplicates")
    assert none.exit_code == 0 and none.output == "No matches.\n"


def test_query_file_and_jsonl_from_stdin(
    runner: CliRunner, store_path: Path, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text(near_dup_corpus["recipe-b"], encoding="utf-8")
    records = _jsonl(_run(runner, "query", store_path, "--file", doc, "--json").output)
    assert {r["key"] for r in records} == {"recipe-a", "recipe-b"}
    assert records[0]["query"] == str(doc)
    lines = [
        json.dumps({"doc": "q1", "body": near_dup_corpus["unrelated"]}),
        "",
        json.dumps({"doc": "q2", "body": near_dup_corpus["storm-b"]}),
    ]
    result = _run(
        runner, "query", store_path, "--jsonl", "-", "--id-field", "doc", "--text-field", "body",
        "--json", input="\n".join(lines) + "\n",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    got = {(r["query"], r["key"]) for r in _jsonl(result.output)}
    assert got == {("q1", "unrelated"), ("q2", "storm-a"), ("q2", "storm-b")}


def test_query_jsonl_reports_each_bad_line_and_answers_the_rest(
    runner: CliRunner, store_path: Path, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """A bad line (not JSON, not an object, no text, an empty text) fails on its own, named
    by its file line number, and every good line is still answered; exit 1 as in add."""
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        "\n".join(
            [
                json.dumps({"id": "q1", "text": near_dup_corpus["storm-a"]}),
                "garbage",
                "",
                json.dumps({"id": "q3", "text": near_dup_corpus["recipe-a"]}),
                '["a list"]',
                json.dumps({"id": "q5", "body": "x"}),
                json.dumps({"id": "q6", "text": "   "}),
                json.dumps({"id": "q7", "text": near_dup_corpus["unrelated"]}),
            ]
        )
        + "\n",
        encoding="utf-8",
    )
    with queries.open("ab") as appended:  # a line in Latin-1: the others are still answered
        appended.write(b'{"id": "q8", "text": "caf\xe9"}\n')
    result = _run(runner, "query", store_path, "--jsonl", queries, "--json")
    assert result.exit_code == 1, result.output
    records = _jsonl(result.output)
    answered = {(r["query"], r["key"]) for r in records if "query" in r}
    assert answered == {
        ("q1", "storm-a"), ("q1", "storm-b"), ("q3", "recipe-a"), ("q3", "recipe-b"),
        ("q7", "unrelated"),
    }  # fmt: skip
    failed = [r["failed"] for r in records if "failed" in r]
    assert [(f["source"], f["file"], f["line"], f["key"], f["error"]) for f in failed] == [
        (f"{queries}:2", str(queries), 2, None, "JSONDecodeError"),
        (f"{queries}:5", str(queries), 5, None, "TypeError"),
        (f"{queries}:6", str(queries), 6, "q5", "KeyError"),
        (f"{queries}:7", str(queries), 7, "q6", "EmptyDocumentError"),
        (f"{queries}:9", str(queries), 9, None, "UnicodeDecodeError"),
    ]
    assert failed[3]["message"] == "empty document"
    table = _run(runner, "query", store_path, "--jsonl", queries)
    assert table.exit_code == 1
    lines = table.output.splitlines()
    assert lines[0].split() == ["query", "key", "score"] and len(lines) == 1 + 5 + 5
    assert lines[-5:] == [  # worded as add words them
        f"  failed: {queries}:2: malformed JSON (Expecting value at column 1)",
        f"  failed: {queries}:5: expected a JSON object, got list",
        f"  failed: {queries}:6: missing field 'text'",
        f"  failed: {queries}:7: empty document",
        f"  failed: {queries}:9: not valid utf-8 at byte 25 (invalid continuation byte); "
        "pass the right encoding",
    ]
    only_bad = _run(runner, "query", store_path, "--jsonl", "-", input='{"text": ""}\n')
    assert only_bad.exit_code == 1
    assert only_bad.output == "No matches.\n  failed: <stdin>:1: empty document\n"


def test_query_exact_source_with_a_bad_line_is_an_input_error(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    source = tmp_path / "source.jsonl"
    source.write_text('{"id": "storm-a", "text": "x"}\n{"id": 2, "text": \n', encoding="utf-8")
    result = _run(runner, "query", store_path, "--text", "some text", "--exact", source)
    assert result.exit_code == 2
    assert result.output == f"Error: {source}:2: malformed JSON (Expecting value at column 19)\n"


def test_query_empty_text_is_the_empty_document_error(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    """--text "" is given (not missing): the error is that the document is empty."""
    for text in ("", "   "):
        result = _run(runner, "query", store_path, "--text", text)
        assert result.exit_code == 2
        assert result.output == (
            "Error: --text: the document is empty after normalisation and has no shingles, "
            "so there is nothing to compare; give a text with words in it\n"
        )
    empty = tmp_path / "empty.txt"
    empty.write_text("\n", encoding="utf-8")
    from_file = _run(runner, "query", store_path, "--file", empty)
    assert from_file.exit_code == 2
    assert from_file.output.startswith(f"Error: {empty}: the document is empty")
    both = _run(runner, "query", store_path, "--text", "", "--file", empty)
    assert both.exit_code == 2 and "exactly one of --text, --file or --jsonl" in both.output


def test_query_unknown_encoding_is_the_api_error(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    doc = tmp_path / "doc.txt"
    doc.write_text("some text", encoding="utf-8")
    result = _run(runner, "query", store_path, "--file", doc, "--encoding", "bogus-codec")
    assert result.exit_code == 2
    assert result.output == (
        "Error: encoding='bogus-codec' is not valid: expected a codec name such as 'utf-8'\n"
    )


def test_query_input_errors_exit_2(runner: CliRunner, store_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait and a long enough text")
    result = _run(runner, "query", store_path, "--file", bad)
    assert result.exit_code == 2
    assert result.output == (
        f"Error: {bad}: not valid utf-8 (byte 0xe9 at offset 3); "
        "pass --encoding with the file's encoding\n"
    )
    assert _run(runner, "query", store_path, "--file", bad, "--encoding", "latin-1").exit_code == 0
    missing = _run(runner, "query", store_path, "--file", tmp_path / "nope.txt")
    assert missing.exit_code == 2
    assert (
        missing.output
        == f"Error: {tmp_path / 'nope.txt'}: cannot read (No such file or directory)\n"
    )
    both = _run(runner, "query", store_path, "--text", "a", "--file", bad)
    assert both.exit_code == 2 and "exactly one of --text, --file or --jsonl" in both.output
    high = _run(runner, "query", store_path, "--text", "some text", "--threshold", "1.5")
    assert high.exit_code == 2 and high.output.startswith("Error: threshold=1.5 is not valid")


_LATIN1_TEXT = "café crème brûlée, then a long walk along the river before dinner"
"""A document whose Latin-1 bytes are not valid UTF-8 (0xe9 at offset 3)."""


@pytest.fixture
def latin1_store(tmp_path: Path) -> Path:
    """A store holding one document, ``_LATIN1_TEXT``, under the key ``latin``."""
    path = tmp_path / "latin.ndx"
    with Store.open(path, create=True, threshold=0.7) as store:
        store.add("latin", _LATIN1_TEXT)
    return path


def test_query_text_with_undecodable_argument_bytes_is_an_input_error(
    runner: CliRunner, latin1_store: Path
) -> None:
    """Python keeps argument bytes the locale cannot decode as lone surrogates; --text
    used to sign those, find nothing and exit 0 (review 52, finding 5). Without
    --encoding it is now the same kind of error as --file gives for the same bytes."""
    escaped = os.fsdecode(_LATIN1_TEXT.encode("latin-1"))  # what sys.argv holds
    assert "\udce9" in escaped
    result = _run(runner, "query", latin1_store, "--text", escaped, "--json")
    assert result.exit_code == 2
    assert result.output == (
        f"Error: --text: not valid {sys.getfilesystemencoding()}, the locale's encoding "
        "(byte 0xe9 at offset 3); pass --encoding with the text's encoding, or put it in a "
        "file and use --file\n"
    )


def test_query_text_bytes_are_decoded_with_an_explicit_encoding(
    runner: CliRunner, latin1_store: Path
) -> None:
    """With --encoding, --text's own bytes are decoded with it, as a file's are; a
    codec that does not fit them is an error saying where they stopped decoding."""
    escaped = os.fsdecode(_LATIN1_TEXT.encode("latin-1"))
    found = _run(
        runner, "query", latin1_store, "--text", escaped, "--encoding", "latin-1", "--json"
    )
    assert found.exit_code == 0, found.output
    assert _jsonl(found.output) == [{"query": "text", "key": "latin", "score": 1.0}]
    wrong = _run(runner, "query", latin1_store, "--text", escaped, "--encoding", "utf-8")
    assert wrong.exit_code == 2
    assert wrong.output == (
        "Error: --text: not valid utf-8 (byte 0xe9 at offset 3); "
        "pass --encoding with the text's encoding\n"
    )
    unknown = _run(runner, "query", latin1_store, "--text", escaped, "--encoding", "bogus-codec")
    assert unknown.exit_code == 2
    assert unknown.output == (
        "Error: encoding='bogus-codec' is not valid: expected a codec name such as 'utf-8'\n"
    )


def test_query_text_that_no_command_line_gives_is_refused_with_encoding(
    runner: CliRunner, latin1_store: Path
) -> None:
    """A str with an escaped byte and a lone surrogate no argv decoding makes (code
    calling the CLI) has no bytes for --encoding to decode: one error line, no
    traceback."""
    text = "caf\ud800" + os.fsdecode(b"\xe9")
    result = _run(runner, "query", latin1_store, "--text", text, "--encoding", "latin-1")
    assert result.exit_code == 2
    assert result.output == (
        f"Error: --text: holds characters that are not {sys.getfilesystemencoding()} text "
        "from the command line, so it has no bytes to decode; pass the text in a file with "
        "--file\n"
    )


def test_query_text_the_locale_decoded_is_taken_as_given_with_encoding(
    runner: CliRunner, latin1_store: Path
) -> None:
    """--encoding also names the encoding of --exact's file: a --text the locale decoded
    is taken as given, not decoded again with it (which turned UTF-8 text into another
    text), and only bytes the locale could not decode are (review 57)."""
    source = latin1_store.parent / "exact.latin1.jsonl"
    source.write_bytes(
        (json.dumps({"id": "latin", "text": _LATIN1_TEXT}, ensure_ascii=False) + "\n").encode(
            "latin-1"
        )
    )
    args = ["query", latin1_store, "--text", _LATIN1_TEXT, "--exact", source, "--json"]
    found = _run(runner, *args, "--encoding", "latin-1")
    assert found.exit_code == 0, found.output
    assert _jsonl(found.output) == [{"query": "text", "key": "latin", "score": 1.0, "exact": 1.0}]
    bogus = _run(runner, "query", latin1_store, "--text", _LATIN1_TEXT, "--encoding", "bogus")
    assert bogus.exit_code == 2 and "encoding='bogus' is not valid" in bogus.output


def test_query_jsonl_reads_its_file_in_the_encoding_given(
    runner: CliRunner, latin1_store: Path
) -> None:
    """query --jsonl read UTF-8 only and ignored --encoding, failing every Latin-1 line
    with no advice (review 57); UTF-16 is refused as for add --jsonl."""
    queries = latin1_store.parent / "queries.latin1.jsonl"
    line = json.dumps({"id": "q", "text": _LATIN1_TEXT}, ensure_ascii=False) + "\n"
    queries.write_bytes(line.encode("latin-1"))
    found = _run(
        runner, "query", latin1_store, "--jsonl", queries, "--encoding", "latin-1", "--json"
    )
    assert found.exit_code == 0, found.output
    assert _jsonl(found.output) == [{"query": "q", "key": "latin", "score": 1.0}]
    unread = _run(runner, "query", latin1_store, "--jsonl", queries, "--json")
    assert unread.exit_code == 1
    assert "not valid utf-8 at byte" in unread.output and "pass the right encoding" in unread.output
    refused = _run(runner, "query", latin1_store, "--jsonl", queries, "--encoding", "utf-16")
    assert refused.exit_code == 2 and "0x0a" in refused.output


def test_query_text_with_undecodable_bytes_in_a_real_process(latin1_store: Path) -> None:
    """The bytes on a real command line under a UTF-8 locale: the error above without
    --encoding, the stored document with --encoding latin-1."""
    raw = _LATIN1_TEXT.encode("latin-1")
    env = {**os.environ, "LC_ALL": "C.UTF-8"}
    command = [os.fsencode(sys.executable), b"-m", b"neardup_store", b"query"]
    command += [os.fsencode(latin1_store), b"--text", raw, b"--json"]
    refused = subprocess.run(command, capture_output=True, env=env, check=False)
    assert refused.returncode == 2 and refused.stdout == b""
    assert refused.stderr == (
        b"Error: --text: not valid utf-8, the locale's encoding (byte 0xe9 at offset 3); "
        b"pass --encoding with the text's encoding, or put it in a file and use --file\n"
    )
    decoded = subprocess.run(
        [*command, b"--encoding", b"latin-1"], capture_output=True, env=env, check=False
    )
    assert decoded.returncode == 0, decoded.stderr
    assert _jsonl(decoded.stdout.decode()) == [{"query": "text", "key": "latin", "score": 1.0}]


@pytest.mark.parametrize(
    "command",
    [["query", "--text", "x"], ["info"], ["stats"], ["pairs"], ["clusters"], ["check"],
     ["compact"], ["rebuild", "--threshold", "0.5"], ["remove", "k"], ["export", "-"]],
)  # fmt: skip
def test_a_missing_store_is_one_error_line(
    runner: CliRunner, tmp_path: Path, command: list[str]
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    name, *rest = command
    result = _run(runner, name, empty, *rest)
    assert result.exit_code == 2
    assert result.output == f"Error: {empty}: no store here; run `neardup-admin init` to make one\n"
    gone = _run(runner, name, tmp_path / "gone", *rest)  # no directory: the same one line
    assert gone.exit_code == 2
    assert (
        gone.output
        == f"Error: {tmp_path / 'gone'}: no store here; run `neardup-admin init` to make one\n"
    )
    assert not (tmp_path / "gone").exists()


def test_remove_keys_from_arguments_and_stdin(runner: CliRunner, store_path: Path) -> None:
    missing = _run(runner, "remove", store_path, "storm-a", "nope")
    assert missing.exit_code == 2
    assert missing.output.startswith("Error: key 'nope' is not in the store")
    assert _run(runner, "remove", store_path, "storm-a", "nope", "--missing-ok").output == (
        "Removed 1 of 2 documents.\n"
    )
    result = _run(runner, "remove", store_path, "--from-file", "-", "--json", input="recipe-a\n\n")
    assert _jsonl(result.output) == [{"removed": 1, "asked": 1}]
    with Store.open(store_path, read_only=True) as store:
        assert sorted(store) == ["recipe-b", "storm-b", "unrelated"]
    counter = commit_counter(store_path)
    assert _run(runner, "remove", store_path).exit_code == 2
    bad = _run(runner, "remove", store_path, "storm-b", "--batch-size", "0")
    assert bad.exit_code == 2 and "'0' is neither a positive integer nor 'auto'" in bad.output
    batched = _run(runner, "remove", store_path, "storm-b", "recipe-b", "--batch-size", "1")
    assert batched.output == "Removed 2 of 2 documents.\n"
    with Store.open(store_path, read_only=True) as store:
        assert list(store) == ["unrelated"]
    assert commit_counter(store_path) == counter + 2  # one commit per key


def test_purge_deletes_what_removals_left_and_stats_count_it(
    runner: CliRunner, store_path: Path
) -> None:
    removed = _run(runner, "remove", store_path, "storm-a", "recipe-a")
    assert removed.exit_code == 0, removed.output
    stats = _jsonl(_run(runner, "stats", store_path, "--json").output)
    assert (stats[0]["documents"], stats[0]["awaiting_purge"]) == (3, 2)
    assert all(band["entries"] == 5 for band in stats[1:] if "band" in band)
    assert _run(runner, "check", store_path).exit_code == 0
    bad = _run(runner, "purge", store_path, "--batch-size", "0")
    assert bad.exit_code == 2 and "'0' is neither a positive integer nor 'auto'" in bad.output
    counter = commit_counter(store_path)
    one = _run(runner, "purge", store_path, "--batch-size", "1", "--json")
    assert one.exit_code == 0 and _jsonl(one.output) == [{"purged": 2}]
    assert commit_counter(store_path) == counter + 2  # one a document, none once nothing waits
    stats = _jsonl(_run(runner, "stats", store_path, "--json").output)
    assert stats[0]["awaiting_purge"] == 0
    assert stats[0]["commit_counter"] == commit_counter(store_path)
    assert all(band["entries"] == 3 for band in stats[1:] if "band" in band)
    again = _run(runner, "purge", store_path)
    assert again.output == "Purged the band entries of 0 removed documents.\n"
    assert commit_counter(store_path) == counter + 2
    assert _run(runner, "check", store_path).exit_code == 0


def test_pairs_and_clusters_formats(runner: CliRunner, store_path: Path) -> None:
    pairs = _run(runner, "pairs", store_path)
    assert pairs.exit_code == 0, pairs.output
    got = {(r["first"], r["second"]) for r in _jsonl(pairs.output)}
    assert got == {("storm-a", "storm-b"), ("recipe-a", "recipe-b")}
    csv_out = _run(runner, "pairs", store_path, "--format", "csv").output.splitlines()
    assert csv_out[0] == "first,second,score" and len(csv_out) == 3
    assert _run(runner, "pairs", store_path, "--fail-on-duplicates").exit_code == 1
    strict = _run(runner, "pairs", store_path, "--threshold", "0.999", "--fail-on-duplicates")
    assert strict.exit_code == 0 and strict.output == ""
    clusters = _jsonl(_run(runner, "clusters", store_path).output)
    assert sorted(sorted(c["keys"]) for c in clusters) == [
        ["recipe-a", "recipe-b"],
        ["storm-a", "storm-b"],
    ]
    csv_clusters = _run(runner, "clusters", store_path, "--format", "csv").output.splitlines()
    assert csv_clusters[0] == "cluster,key" and len(csv_clusters) == 5
    table = _run(runner, "clusters", store_path, "--format", "table").output.splitlines()
    assert table[0].split() == ["cluster", "key"]
    # --json, as every other command spells JSON lines, is --format jsonl
    assert _run(runner, "pairs", store_path, "--json").output == pairs.output
    as_json = _run(runner, "clusters", store_path, "--format", "table", "--json")
    assert as_json.exit_code == 0 and _jsonl(as_json.output) == clusters


# Keys that printed alike before: a bytes key printed as "hex:00ff", as the str key
# "hex:00ff" did; and keys a line or a table did not show whole (review 32). Each is
# printed as the value here, and remove takes that back.
_TRICKY_KEYS: dict[str | bytes, str] = {
    b"\x00\xff": "hex:00ff",
    "hex:00ff": "\\hex:00ff",
    "\\hex:00ff": "\\\\hex:00ff",
    "\\plain": "\\plain",
    "plain": "plain",
    " ": "str:20",
    "x\r": "str:780d",
    "a\nb": "str:610a62",
    "str:20": "\\str:20",
    "str:61": "str:61",  # "a" prints as a: this is no other key's printed form
}
_UNSHOWN_KEYS = (" ", "x\r", "a\nb")
_SHARED_TEXT = "a document that several different keys share, word for word, " * 3
_FORMATS = ("jsonl", "csv", "table")


@pytest.fixture
def tricky_store(tmp_path: Path) -> Path:
    """A store of the same text under each of :data:`_TRICKY_KEYS` (added by the library:
    the CLI itself makes only str keys)."""
    path = tmp_path / "tricky.ndx"
    with Store.open(path, create=True, threshold=0.7) as store:
        for key in _TRICKY_KEYS:
            store.add(key, _SHARED_TEXT)
    return path


def _printed_keys(output: str, fmt: str) -> list[str]:
    """The keys an output shows, as written: the cells of its key columns."""
    columns = ("first", "second", "key")
    if fmt == "jsonl":
        records = _jsonl(output)
        return [k for r in records for k in r.get("keys") or [r[c] for c in columns if c in r]]
    rows = (
        list(csv.reader(io.StringIO(output)))
        if fmt == "csv"
        else [line.split() for line in output.splitlines()]  # no key here has a space
    )
    wanted = [i for i, name in enumerate(rows[0]) if name in columns]
    return [row[i] for row in rows[1:] for i in wanted]


@pytest.mark.parametrize(
    ("command", "fmt"),
    [
        *[pytest.param(["pairs", "--format", f], f, id=f"pairs-{f}") for f in _FORMATS],
        *[pytest.param(["clusters", "--format", f], f, id=f"clusters-{f}") for f in _FORMATS],
        pytest.param(["query", "--text", _SHARED_TEXT, "--json"], "jsonl", id="query-jsonl"),
        pytest.param(["query", "--text", _SHARED_TEXT], "table", id="query-table"),
    ],
)
def test_every_output_tells_a_bytes_key_from_a_str_key_that_reads_hex(
    runner: CliRunner, tricky_store: Path, command: list[str], fmt: str
) -> None:
    """A bytes key printed as hex:<hex>, which a str key can also be: pairs listed two
    documents as one key paired with itself (a review's finding). A str key that starts
    with hex: (after any backslashes) now prints with one backslash more."""
    result = _run(runner, command[0], tricky_store, *command[1:])
    assert result.exit_code == 0, result.output
    printed = _printed_keys(result.output, fmt)
    keys = len(_TRICKY_KEYS)
    assert len(printed) == (keys * (keys - 1) if command[0] == "pairs" else keys)
    assert sorted(set(printed)) == sorted(_TRICKY_KEYS.values())


def test_remove_takes_keys_as_the_output_prints_them(
    runner: CliRunner, tricky_store: Path, tmp_path: Path
) -> None:
    """What pairs prints names one document each for remove, from the command line and
    from --from-file; no command could name a bytes key before."""
    printed = {k for r in _jsonl(_run(runner, "pairs", tricky_store).output) for k in
               (r["first"], r["second"])}  # fmt: skip
    assert printed == set(_TRICKY_KEYS.values())
    by_text = {text: key for key, text in _TRICKY_KEYS.items()}
    left = set(_TRICKY_KEYS)
    for text in ["hex:00ff", "\\hex:00ff"]:
        result = _run(runner, "remove", tricky_store, text, "--json")
        assert _jsonl(result.output) == [{"removed": 1, "asked": 1}], result.output
        left.discard(by_text[text])
        with Store.open(tricky_store, read_only=True) as store:
            assert set(store) == left
    from_file = tmp_path / "keys.txt"
    from_file.write_text("\\\\hex:00ff\n\\plain\n", encoding="utf-8")
    result = _run(runner, "remove", tricky_store, "--from-file", from_file)
    assert result.output == "Removed 2 of 2 documents.\n"
    with Store.open(tricky_store, read_only=True) as store:
        assert set(store) == left - {"\\hex:00ff", "\\plain"}


def test_keys_a_line_would_not_show_whole_go_back_through_a_key_file(
    runner: CliRunner, tricky_store: Path, tmp_path: Path
) -> None:
    """A blank key printed as a blank row and was skipped as a blank line of
    --from-file; "x\\r" printed as x and read back as x, another key; "a\\nb" took two
    lines (review 32). They print as str: and their UTF-8 in hex, one line each."""
    from_file = tmp_path / "keys.txt"
    from_file.write_text("".join(_TRICKY_KEYS[k] + "\n" for k in _UNSHOWN_KEYS), encoding="utf-8")
    result = _run(runner, "remove", tricky_store, "--from-file", from_file, "--json")
    assert _jsonl(result.output) == [{"removed": 3, "asked": 3}], result.output
    with Store.open(tricky_store, read_only=True) as store:
        assert set(store) == set(_TRICKY_KEYS).difference(_UNSHOWN_KEYS)
    table = _run(runner, "query", tricky_store, "--text", _SHARED_TEXT).output.splitlines()
    assert len(table) == 1 + len(_TRICKY_KEYS) - len(_UNSHOWN_KEYS)  # a row a key, one header
    # str: followed by the hex of a key that fits a line is a key as it is (review 34: a
    # key file naming the stored key str:61 removed the document "a")
    from_file.write_text("str:61\n", encoding="utf-8")
    result = _run(runner, "remove", tricky_store, "--from-file", from_file, "--json")
    assert _jsonl(result.output) == [{"removed": 1, "asked": 1}], result.output
    with Store.open(tricky_store, read_only=True) as store:
        assert "str:61" not in store and "plain" in store


def test_a_query_id_prints_as_the_key_it_names(
    runner: CliRunner, tricky_store: Path, tmp_path: Path
) -> None:
    """A corpus queried against itself: a document's match with itself showed its id
    as it is beside its key printed as str: (review 34)."""
    queries = _archive(tmp_path / "q.jsonl", {"x\r": _SHARED_TEXT, "plain": _SHARED_TEXT})
    rows = _jsonl(_run(runner, "query", tricky_store, "--jsonl", queries, "--json").output)
    assert {r["query"] for r in rows if r["query"] == r["key"]} == {"str:780d", "plain"}


@pytest.mark.parametrize(
    ("key", "printed"),
    [
        ("x\u00a0y", "x\u00a0y"),  # inside a key, a no-break space is carried whole
        ("\u00a0x", "str:c2a078"),  # at an end it would be lost to a strip
        ("x\u3000", "str:78e38080"),
        ("\u200bdoc", "\u200bdoc"),  # invisible, but a line carries it
        ("\ufeffdoc", "str:efbbbf646f63"),  # a key file's first line lost it as a BOM
        ("a\ufeffb", "a\ufeffb"),
        ("\x85", "str:c285"),
        ("\u2028", "str:e280a8"),
        ("a\x7fb", "str:617f62"),
        ("str:0a", "\\str:0a"),  # what the key "\n" prints as
        ("", "str:"),
        ("str:", "\\str:"),
    ],
)
def test_a_key_prints_by_fixed_rules_and_reads_back(key: str, printed: str) -> None:
    """Which keys print as str: depends on fixed sets of characters (controls, and white
    space at an end), not on the interpreter's Unicode database, so a key prints alike
    under every Python (review 34: str.isprintable sent private-use and unassigned
    characters to hex)."""
    assert ingest.key_text(key) == printed
    assert ingest.key_from_text(printed) == key


def test_the_fixed_blanks_are_the_white_space_of_this_python() -> None:
    """The blanks a key may not end with are str.isspace's, less the controls (which
    may appear nowhere in a key that prints as it is)."""
    spaces = {c for c in map(chr, range(0x110000)) if c.isspace()}
    controls = {c for c in spaces if ingest._LINE_BREAKERS.match(c)}
    assert spaces - controls == set(ingest._BLANKS)


@pytest.mark.parametrize("where", ["argument", "file"])
@pytest.mark.parametrize("text", ["hex:0", "hex:zz", "hex:00 ff"])
def test_remove_refuses_a_hex_key_that_is_not_whole_bytes(
    runner: CliRunner, tricky_store: Path, tmp_path: Path, text: str, where: str
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(f"plain\n{text}\n", encoding="utf-8")
    args = [text] if where == "argument" else ["--from-file", keys]
    result = _run(runner, "remove", tricky_store, "plain", *args)
    assert result.exit_code == 2
    lead = "Error: " if where == "argument" else f"Error: {keys}:2: "
    assert result.output.startswith(f"{lead}key={text!r} is not valid: expected hex: and two")
    assert len(result.output.strip().splitlines()) == 1
    with Store.open(tricky_store, read_only=True) as store:
        assert len(store) == len(_TRICKY_KEYS)  # nothing removed


def test_add_report_names_a_matched_bytes_key_as_the_output_prints_it(
    runner: CliRunner, tricky_store: Path, tmp_path: Path
) -> None:
    """add --report printed a bytes key decoded with backslash escapes (b"plain" and
    "plain" alike); it uses the same rendering as every other output now."""
    archive = _archive(tmp_path / "a.jsonl", {"new": _SHARED_TEXT})
    report = tmp_path / "skipped.jsonl"
    result = _run(runner, "add", tricky_store, archive, "--jsonl", "--unique", "--report", report)
    assert result.exit_code == 0, result.output
    (skipped,) = _jsonl(report.read_text())
    assert skipped["key"] == "new" and "hex:00ff" in skipped["matches"]
    assert set(skipped["matches"]) <= set(_TRICKY_KEYS.values())


def test_info_and_stats(runner: CliRunner, store_path: Path) -> None:
    info = _jsonl(_run(runner, "info", store_path, "--json").output)[0]
    assert info["documents"] == 5 and info["params"]["threshold"] == 0.7 and info["file_bytes"] > 0
    human = _run(runner, "info", store_path).output
    assert human.splitlines()[0].split() == ["documents", "5"]
    stats = _jsonl(_run(runner, "stats", store_path, "--json").output)
    assert stats[0]["documents"] == 5 and "free_pages" in stats[0]
    assert stats[0]["format_version"] == codec.FORMAT_VERSION
    bands = [r for r in stats if "band" in r]
    assert len(bands) == info["params"]["bands"] and all(r["entries"] == 5 for r in bands)
    assert any("largest_bucket" in r for r in stats)
    text = _run(runner, "stats", store_path).output
    assert "Bucket sizes" in text and "Largest buckets" in text


def test_check_exit_codes(runner: CliRunner, store_path: Path) -> None:
    ok = _run(runner, "check", store_path)
    assert ok.exit_code == 0 and ok.output == "OK: 5 documents checked, 0 violations found.\n"
    _put(store_path, codec.META_DB, b"next_doc_id", codec.pack_meta(1))  # ids in use above
    bad = _run(runner, "check", store_path, "--json")
    assert bad.exit_code == 1
    *violations, summary = _jsonl(bad.output)
    assert {v["kind"] for v in violations} == {"doc-id"} and not summary["summary"]["ok"]
    repaired = _run(runner, "check", store_path, "--repair")
    assert repaired.exit_code == 0, repaired.output
    assert "remain after repair" in repaired.output
    _missing_meta_entry(store_path)
    unrepairable = _run(runner, "check", store_path, "--repair")
    assert unrepairable.exit_code == 1 and unrepairable.output.splitlines()[-1].startswith(
        "VIOLATIONS"
    )


def test_compact_rebuild_backup(runner: CliRunner, store_path: Path, tmp_path: Path) -> None:
    _run(runner, "remove", store_path, "storm-a")
    dry = _jsonl(_run(runner, "compact", store_path, "--dry-run", "--json").output)[0]
    assert dry["dry_run"] and dry["bytes_before"] >= dry["bytes_after"]
    assert "reclaimed" in _run(runner, "compact", store_path).output
    rebuilt = _run(runner, "rebuild", store_path, "--bands", "16", "--rows", "8", "--json")
    assert _jsonl(rebuilt.output)[0]["new"]["bands"] == 16
    again = _jsonl(_run(runner, "rebuild", store_path, "--json").output)[0]  # no option
    assert (again["new"]["bands"], again["new"]["rows"]) == (16, 8)
    too_wide = _run(runner, "rebuild", store_path, "--bands", "30", "--rows", "9")
    assert too_wide.exit_code == 2 and too_wide.output.startswith("Error: bands*rows=")
    dest = tmp_path / "backup.ndx"
    backed = _run(runner, "backup", store_path, dest)
    assert backed.exit_code == 0 and backed.output.startswith("Backed up 4 documents")
    with Store.open(dest, read_only=True) as copy:
        assert len(copy) == 4 and copy.banding.bands == 16


def test_export_to_stdout_and_import_both_ways(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    exported = runner.invoke(cli, ["--quiet", "export", str(store_path), "-"])
    assert exported.exit_code == 0
    data = exported.stdout_bytes
    assert data and not data.startswith(b"Exported")
    target = tmp_path / "copy.ndx"
    created = _run(runner, "import", "-", target, "--json", input=data)
    assert _jsonl(created.output) == [{"imported": 5, "created": True, "path": str(target)}]
    again = _run(runner, "import", "-", target, input=data)
    assert again.exit_code == 2 and again.output.startswith("Error: key ")
    _run(runner, "remove", target, "storm-a", "storm-b")
    merged = _run(runner, "import", "-", target, "--replace", input=data)
    assert merged.output == f"Imported 5 documents into store {target}.\n"
    garbage = _run(runner, "import", "-", tmp_path / "other.ndx", input=b"not an export")
    assert garbage.exit_code == 2 and garbage.output.startswith("Error: ")


def test_export_into_the_store_is_refused_and_a_failed_export_leaves_no_file(
    store_path: Path, tmp_path: Path
) -> None:
    """OUT inside the store (a slip such as ``export S S/data.mdb``) emptied data.mdb and
    killed the process with SIGBUS; an export stopped by a full disk left a shorter file
    that imported as complete, and failed with two tracebacks (a review's findings)."""
    data = (store_path / "data.mdb").read_bytes()
    command = [sys.executable, "-m", "neardup_store", "export", str(store_path)]
    into = subprocess.run([*command, str(store_path / "data.mdb")], capture_output=True, text=True)
    assert into.returncode == 2 and "outside the store's directory" in into.stderr
    assert (store_path / "data.mdb").read_bytes() == data

    def small_files() -> None:  # a full disk, as a file-size limit
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, resource.RLIM_INFINITY))

    out = tmp_path / "exports" / "out.export"
    out.parent.mkdir()
    full = subprocess.run(
        [*command, str(out)], capture_output=True, text=True, preexec_fn=small_files
    )
    assert full.returncode == 2 and full.stderr.count("Traceback") == 0
    assert full.stderr.startswith(f"Error: {out}: cannot write it (File too large)")
    assert list(out.parent.iterdir()) == []  # neither the export nor its partial file


def test_export_streams_into_a_named_pipe(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    """Writing a temporary file and renaming it over OUT replaced a named pipe with a
    regular file (its reader got nothing and hung) and broke ``>(...)`` and /dev/stdout
    (a review of the export fix). A path that is no regular file is streamed into."""
    import threading

    fifo = tmp_path / "export.pipe"
    os.mkfifo(fifo)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = _run(runner, "export", store_path, fifo)
    reader.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(fifo.stat().st_mode)
    with Store.open(store_path) as store:
        expected = io.BytesIO()
        store.export(expected)
    assert received == [expected.getvalue()]


def test_export_to_an_unwritable_path_is_an_input_error(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    """An output that cannot be written is an input error (exit 2), not a finding (1)."""
    out = tmp_path / "missing" / "dir" / "out.export"
    result = _run(runner, "export", store_path, out)
    assert result.exit_code == 2
    assert result.output.startswith(
        f"Error: {out}: cannot write it (No such file or directory); nothing was left there"
    )
    assert not out.parent.exists()
    unreadable = _run(runner, "import", tmp_path / "missing.export", tmp_path / "new.ndx")
    assert unreadable.exit_code == 2 and not (tmp_path / "new.ndx").exists()


def test_verbose_notes_go_to_stderr(runner: CliRunner, store_path: Path) -> None:
    result = runner.invoke(cli, ["--verbose", "info", str(store_path), "--json"])
    assert result.exit_code == 0
    assert "opening" in result.stderr and json.loads(result.stdout)["documents"] == 5


def test_store_commands_in_a_subprocess(
    tmp_path: Path, store_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    def admin(*args: object, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "neardup_store", *map(str, args)]
        return subprocess.run(command, capture_output=True, input=input, check=False)

    created = admin("init", tmp_path / "fresh.ndx", "--threshold", "0.9")
    assert created.returncode == 0 and created.stdout.startswith(b"Created ")
    query = admin("query", store_path, "--text", near_dup_corpus["storm-b"], "--json")
    assert query.returncode == 0
    assert {json.loads(line)["key"] for line in query.stdout.splitlines()} == {"storm-a", "storm-b"}
    info = admin("info", store_path, "--json")
    assert json.loads(info.stdout)["documents"] == 5
    assert admin("check", store_path).returncode == 0
    exported = admin("export", store_path, "-")
    assert exported.returncode == 0 and exported.stderr == b"Exported 5 documents.\n"
    imported = admin("import", "-", tmp_path / "copy.ndx", input=exported.stdout)
    assert imported.returncode == 0, imported.stderr
    missing = admin("info", tmp_path / "fresh.ndx" / "nothing")
    assert missing.returncode == 2 and b"Traceback" not in missing.stderr


def test_pairs_behind_a_progress_bar_still_prints_every_pair(
    runner: CliRunner, store_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli_module, "_show_progress", lambda: True)
    result = _run(runner, "pairs", store_path, "--format", "csv")
    assert result.exit_code == 0, result.output
    assert sorted(result.stdout.splitlines()[1:])[0].startswith("recipe-a,recipe-b,")
    assert len(result.stdout.splitlines()) == 3


def test_query_exact_reverifies_against_source_texts(
    runner: CliRunner, store_path: Path, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    source = tmp_path / "source.jsonl"
    source.write_text(
        "".join(json.dumps({"id": k, "text": t}) + "\n" for k, t in near_dup_corpus.items()),
        encoding="utf-8",
    )
    text = near_dup_corpus["storm-a"]
    result = _run(runner, "query", store_path, "--text", text, "--exact", source, "--json")
    assert result.exit_code == 0, result.output
    records = _jsonl(result.output)
    assert records[0] == {"query": "text", "key": "storm-a", "score": 1.0, "exact": 1.0}
    assert all(0.7 <= r["exact"] <= 1.0 for r in records)
    table = _run(runner, "query", store_path, "--text", text, "--exact", source).output
    assert table.splitlines()[0].split() == ["query", "key", "score", "exact"]
    partial = tmp_path / "partial.jsonl"
    partial.write_text(json.dumps({"id": "storm-a", "text": text}) + "\n", encoding="utf-8")
    missing = _run(runner, "query", store_path, "--text", text, "--exact", partial)
    assert missing.exit_code == 2
    assert missing.output == (
        f"Error: {partial}: no text for stored key 'storm-b' (needed by --exact)\n"
    )


# -- feeding the store -----------------------------------------------------------------------


def _archive(path: Path, documents: dict[str, str], extra: str = "") -> Path:
    with path.open("w", encoding="utf-8") as out:
        for key, text in documents.items():
            out.write(json.dumps({"id": key, "text": text, "lang": "en"}) + "\n")
        out.write(extra)
    return path


def test_add_files_directories_and_jsonl_with_a_report(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store, "--threshold", 0.7).exit_code == 0
    folder = tmp_path / "docs"
    folder.mkdir()
    for key, text in near_dup_corpus.items():
        (folder / f"{key}.txt").write_text(text, encoding="utf-8")
    (folder / "skip.md").write_text("not included", encoding="utf-8")
    (folder / "bad.txt").write_bytes(b"caf\xe9 in latin-1")
    result = _run(runner, "add", store, folder, "--include", "*.txt", "--json")
    assert result.exit_code == 1  # one input could not be read
    assert _jsonl(result.output)[-1]["summary"] == {
        "added": 5,
        "replaced": 0,
        "skipped": 0,
        "failed": 1,
        "batches": 1,
    }
    archive = _archive(
        tmp_path / "a.jsonl", {"fresh": "a brand new document about otters"}, "{not json\n"
    )
    report = tmp_path / "report.jsonl"
    result = _run(runner, "add", store, archive, "--jsonl", "--report", report)
    assert result.exit_code == 1
    assert result.output.startswith("added 1, replaced 0, skipped 0, failed 1")
    assert "a.jsonl:2: malformed JSON" in result.output
    assert _jsonl(report.read_text())[0]["source"].endswith("a.jsonl:2")
    with Store.open(store) as opened:
        assert len(opened) == 6 and opened.get("fresh").metadata == {"lang": "en"}


def test_add_unique_reports_what_it_skipped(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    store = tmp_path / "s.ndx"
    _run(runner, "init", store, "--threshold", 0.5, "--num-perm", 256, "--bands", 64, "--rows", 4)
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    report = tmp_path / "skipped.jsonl"
    result = _run(runner, "add", store, archive, "--jsonl", "--unique", "--report", report)
    assert result.exit_code == 0, result.output
    skipped = {r["key"]: r["matches"] for r in _jsonl(report.read_text())}
    assert skipped == {"storm-b": ["storm-a"], "recipe-b": ["recipe-a"]}
    with Store.open(store) as opened:
        assert sorted(opened) == ["recipe-a", "storm-a", "unrelated"]


def test_add_batch_size_is_a_count_or_auto(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    store = tmp_path / "s.ndx"
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    _run(runner, "init", store)
    result = _run(runner, "add", store, archive, "--jsonl", "--batch-size", 2, "--json")
    assert _jsonl(result.output)[-1]["summary"]["batches"] == 3  # 5 documents
    result = _run(runner, "add", store, archive, "--jsonl", "--batch-size", "auto", "--json")
    assert _jsonl(result.output)[-1]["summary"]["batches"] == 1
    for bad in ("0", "many"):
        result = _run(runner, "add", store, archive, "--jsonl", "--batch-size", bad)
        assert result.exit_code == 2 and "neither a positive integer nor 'auto'" in result.output


def test_add_to_a_missing_store_is_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    result = _run(runner, "add", tmp_path / "nowhere", tmp_path)
    assert result.exit_code == 2 and result.output.startswith(f"Error: {tmp_path / 'nowhere'}:")
    assert "no store here" in result.output and len(result.output.splitlines()) == 1


@pytest.mark.parametrize("encoding", ["bogus-codec", "base64"])
def test_add_unknown_encoding_is_one_error_line_and_writes_nothing(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], encoding: str
) -> None:
    """An encoding Python cannot decode text with (unknown, or not a text codec) is the
    API's InvalidParameterError, exit 2, checked before the store is written to."""
    store = tmp_path / "s.ndx"
    _run(runner, "init", store)
    counter = commit_counter(store)
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    result = _run(runner, "add", store, archive, "--jsonl", "--encoding", encoding)
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: encoding={encoding!r} is not valid: expected a codec name such as 'utf-8'\n"
    )
    assert commit_counter(store) == counter
    with Store.open(store, read_only=True) as opened:
        assert len(opened) == 0


def test_add_json_prints_each_failure_as_a_json_line(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """--json lists every failure (a line each, before the summary), as the table does."""
    store = tmp_path / "s.ndx"
    _run(runner, "init", store)
    archive = _archive(
        tmp_path / "a.jsonl",
        {"good": near_dup_corpus["storm-a"]},
        '{not json\n{"id": "nofield"}\n{"id": "blank", "text": " "}\n',
    )
    result = _run(runner, "add", store, tmp_path / "nope.txt", archive, "--jsonl", "--json")
    assert result.exit_code == 1, result.output
    *failures, summary = _jsonl(result.output)
    assert summary["summary"]["added"] == 1 and summary["summary"]["failed"] == 4
    assert [r["failed"] for r in failures] == [
        {"source": str(tmp_path / "nope.txt"), "file": str(tmp_path / "nope.txt"),
         "line": None, "key": None, "error": "FileNotFoundError",
         "message": "no such file or directory"},
        {"source": f"{archive}:2", "file": str(archive), "line": 2, "key": None,
         "error": "JSONDecodeError",
         "message": "malformed JSON (Expecting property name enclosed in double quotes at "
         "column 2)"},
        {"source": f"{archive}:3", "file": str(archive), "line": 3, "key": "nofield",
         "error": "KeyError", "message": "missing field 'text'"},
        {"source": f"{archive}:4", "file": str(archive), "line": 4, "key": "blank",
         "error": "EmptyDocumentError", "message": "empty document"},
    ]  # fmt: skip


def _dedup_args(archive: Path, tmp_path: Path) -> list[object]:
    """A dedup of ``archive`` into stores and outputs under ``tmp_path``."""
    return ["dedup", archive, "--store", tmp_path / "d.ndx", "--threshold", 0.5,
            "--keep", tmp_path / "k.jsonl", "--dropped", tmp_path / "x.jsonl"]  # fmt: skip


def test_dedup_keeps_first_of_each_group_and_resumes(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = [*_dedup_args(archive, tmp_path), "--json"]
    result = _run(runner, *args)
    assert result.exit_code == 0, result.output
    assert _jsonl(result.output)[-1]["summary"]["dropped"] == 2
    kept = [r["id"] for r in _jsonl((tmp_path / "k.jsonl").read_text())]
    dropped = {r["id"]: r["duplicate_of"] for r in _jsonl((tmp_path / "x.jsonl").read_text())}
    assert kept == ["storm-a", "recipe-a", "unrelated"]
    assert dropped == {"storm-b": "storm-a", "recipe-b": "recipe-a"}
    again = _run(runner, *args, "--fail-on-duplicates")  # a finished job: nothing to redo
    assert again.exit_code == 1 and _jsonl(again.output)[-1]["summary"]["kept"] == 3
    assert [r["id"] for r in _jsonl((tmp_path / "k.jsonl").read_text())] == kept


@pytest.mark.parametrize(
    "mistake",
    [
        "--threshold 0",
        "keep in a missing directory",
        "keep is the input",
        "the progress file is another store's job",
    ],
)
def test_a_refused_dedup_creates_no_store(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], mistake: str
) -> None:
    """The store was created before the other inputs were checked: a refused run left one
    behind, and with --threshold 0 (falsy) one for 0.8, which the corrected run then used
    with bands made for 0.8 (a review's finding)."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = _dedup_args(archive, tmp_path)
    if mistake == "--threshold 0":
        args[args.index("--threshold") + 1] = 0
    elif mistake == "keep in a missing directory":
        args[args.index("--keep") + 1] = tmp_path / "missing" / "k.jsonl"
    elif mistake == "keep is the input":
        args[args.index("--keep") + 1] = archive
    else:  # the same outputs, first for another store: its progress file refuses this run
        other = list(args)
        other[other.index("--store") + 1] = tmp_path / "other.ndx"
        assert _run(runner, *other).exit_code == 0
    before = archive.read_bytes()
    result = _run(runner, *args)
    assert result.exit_code == 2 and result.output.startswith("Error: ")
    assert not (tmp_path / "d.ndx").exists() and archive.read_bytes() == before


def test_dedup_refuses_a_damaged_progress_file_with_exit_2(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """A progress file whose position lacks its offsets was taken as zeros: the finished
    keep file was cut to 0 bytes and every line dropped as already stored, exit 0 (a
    review's finding). Now one Error: line, exit 2, and the outputs as they were."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = _dedup_args(archive, tmp_path)
    assert _run(runner, *args).exit_code == 0
    sidecar = tmp_path / "k.jsonl.progress.json"
    state = json.loads(sidecar.read_text())
    sidecar.write_text(json.dumps({**state, "done": False, "committed": {"line": 3}}))
    outputs = {name: (tmp_path / name).read_bytes() for name in ["k.jsonl", "x.jsonl"]}
    result = _run(runner, *args)
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {sidecar}: unreadable progress file (committed ")
    assert len(result.output.strip().splitlines()) == 1
    assert outputs == {name: (tmp_path / name).read_bytes() for name in outputs}


@pytest.mark.parametrize("command", ["add", "dedup", "query"])
def test_a_json_line_too_deep_or_too_long_to_read_fails_alone(
    runner: CliRunner,
    tmp_path: Path,
    near_dup_corpus: dict[str, str],
    store_path: Path,
    command: str,
) -> None:
    """json.loads raises RecursionError for deep nesting and ValueError for an integer of
    more than 4300 digits, not JSONDecodeError: one such line ended the run with a
    traceback (a review's finding). It is one failed line now, as any malformed one."""
    deep = "[" * 100_000 + "]" * 100_000
    long = '{"id": "n", "text": "some text", "n": ' + "1" * 5000 + "}"
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus, f"{deep}\n{long}\n")
    if command == "add":
        result = _run(runner, "add", store_path, archive, "--jsonl", "--json")
    elif command == "dedup":
        result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    else:
        result = _run(runner, "query", store_path, "--jsonl", archive, "--json")
    assert result.exit_code == 1, result.output
    failed = [r["failed"] for r in _jsonl(result.output) if "failed" in r]
    assert [(f["line"], f["error"]) for f in failed] == [(6, "RecursionError"), (7, "ValueError")]


def test_lone_surrogates_in_input_give_valid_utf8_json(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], store_path: Path
) -> None:
    """ "\\ud800" is valid JSON and the hasher signs it, but UTF-8 cannot carry a lone
    surrogate: writing a dropped line or a --json record holding one raised
    UnicodeEncodeError, and a dedup job could never get past it (a review's finding)."""
    first = next(iter(near_dup_corpus.values()))
    line = json.dumps({"id": "copy", "text": first + " \ud800"})  # ASCII-escaped
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus, line + "\n")
    result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    assert result.exit_code == 0, result.output
    dropped = (tmp_path / "x.jsonl").read_bytes().decode("utf-8")  # strict
    assert [json.loads(x)["text"][-1] for x in dropped.splitlines()][-1] == "\ud800"
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"id": "copy\ud800", "text": first + " \ud800"}) + "\n")
    found = _run(runner, "query", store_path, "--jsonl", queries, "--json")
    assert found.exit_code == 0, found.output
    records = _jsonl(found.stdout_bytes.decode("utf-8"))
    assert records and all(r["query"] == "copy\ud800" for r in records)


def test_add_refuses_a_report_path_it_cannot_write_before_adding_anything(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """--report was opened on its first write, after every batch had committed: exit 2
    with the store changed and the failure list lost (a review's finding)."""
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store).exit_code == 0
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus, "garbage\n")
    report = tmp_path / "missing" / "report.jsonl"
    result = _run(runner, "add", store, archive, "--jsonl", "--report", report)
    assert result.exit_code == 2 and "report.jsonl" in result.output
    with Store.open(store) as opened:
        assert len(opened) == 0


def test_remove_from_a_file_that_is_not_utf8_is_an_input_error(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"storm-a\ncaf\xe9\n")
    result = _run(runner, "remove", store_path, "--from-file", keys)
    assert result.exit_code == 2
    assert result.output.startswith(f"Error: {keys}:2: not valid UTF-8 at byte 3")
    with Store.open(store_path) as opened:
        assert "storm-a" in opened  # nothing removed


def test_sizes_past_what_the_machine_takes_and_utf16_json_lines_are_refused(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """A shingle size past 64 bits left a half-created store and an OverflowError
    traceback; a batch size past sys.maxsize a ValueError traceback; UTF-16 JSON lines
    were cut at the byte 0x0a, failing every line of a valid file (a review's findings)."""
    store = tmp_path / "s.ndx"
    huge = _run(runner, "init", store, "--shingle-size", 10**20)
    assert huge.exit_code == 2 and "size=" in huge.output and not store.exists()
    assert _run(runner, "init", store).exit_code == 0
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    batch = _run(runner, "add", store, archive, "--jsonl", "--batch-size", 2**64)
    assert batch.exit_code == 2 and "neither a positive integer" in batch.output
    utf16 = tmp_path / "u.jsonl"
    utf16.write_bytes(archive.read_text().encode("utf-16"))
    refused = _run(runner, "add", store, utf16, "--jsonl", "--encoding", "utf-16")
    assert refused.exit_code == 2 and "newline as the byte 0x0a" in refused.output
    with Store.open(store) as opened:
        assert len(opened) == 0


def test_add_words_option_conflicts_as_options(
    runner: CliRunner, tmp_path: Path, store_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """The library's wording (threshold=0.5 ... expected None unless unique=True) named
    Python arguments on the command line (a review's finding)."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    alone = _run(runner, "add", store_path, archive, "--jsonl", "--threshold", 0.5)
    assert alone.exit_code == 2 and "--threshold applies only with --unique" in alone.output
    both = _run(runner, "add", store_path, archive, "--jsonl", "--unique", "--replace")
    assert both.exit_code == 2 and "--unique and --replace cannot be combined" in both.output


@pytest.mark.parametrize("command", ["add", "dedup", "query"])
def test_a_byte_order_mark_before_the_first_json_line_is_not_an_error(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], command: str
) -> None:
    """Files some editors write start with a UTF-8 BOM: the first record failed, in dedup
    its near-duplicate was kept in its place, and the advice (utf-8-sig) named an option
    dedup and query do not have (a review's finding)."""
    plain = _archive(tmp_path / "plain.jsonl", near_dup_corpus)
    archive = tmp_path / "bom.jsonl"
    archive.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    if command == "add":
        store = tmp_path / "s.ndx"
        assert _run(runner, "init", store).exit_code == 0
        result = _run(runner, "add", store, archive, "--jsonl", "--json")
        assert _jsonl(result.output)[-1]["summary"]["added"] == len(near_dup_corpus)
    elif command == "dedup":
        result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
        kept_lines = (tmp_path / "k.jsonl").read_text(encoding="utf-8-sig")  # lines as read
        assert [r["id"] for r in _jsonl(kept_lines)] == ["storm-a", "recipe-a", "unrelated"]
    else:
        store = tmp_path / "s.ndx"
        with Store.open(store, create=True, threshold=0.7) as opened:
            opened.add_many(near_dup_corpus.items())
        result = _run(runner, "query", store, "--jsonl", archive, "--json")
    assert result.exit_code == 0, result.output
    assert not [r for r in _jsonl(result.output) if "failed" in r]


def test_dedup_exits_1_and_lists_each_failed_line(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """Lines dedup cannot use are findings, as in add: exit 1, each listed with --json."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus, 'garbage\n{"id": "e", "text": ""}\n')
    result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    assert result.exit_code == 1, result.output
    *failures, summary = _jsonl(result.output)
    assert summary["summary"] == {
        "kept": 3, "dropped": 2, "already_stored": 0, "failed": 2, "resumed_from_line": None,
        "held_back_bytes": 0,
    }  # fmt: skip
    assert [
        (r["failed"]["source"], r["failed"]["line"], r["failed"]["key"], r["failed"]["error"])
        for r in failures
    ] == [("a.jsonl:6", 6, None, "JSONDecodeError"), ("a.jsonl:7", 7, "e", "EmptyDocumentError")]
    again = _run(runner, *_dedup_args(archive, tmp_path))  # the finished job reports the same
    assert again.exit_code == 1
    assert again.output.splitlines() == [
        "kept 3, dropped 2, already_stored 0, failed 2, resumed_from_line 7, held_back_bytes 0",
        "  failed: a.jsonl:6: malformed JSON (Expecting value at column 1)",
        "  failed: a.jsonl:7: empty document",
    ]


def test_dedup_says_when_it_leaves_an_unfinished_last_line_unread(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """A last line without a newline that is not JSON is left for the next run (a writer
    may be appending it): the summary counts its bytes and stderr says what to do."""
    unfinished = '{"id": "late", "te'
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus, "\n" + unfinished)
    result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    assert result.exit_code == 0, result.output
    summary = _jsonl(result.stdout)[-1]["summary"]
    assert summary["kept"] + summary["dropped"] == 5
    assert summary["held_back_bytes"] == len(unfinished)
    assert "no newline and is not JSON" in result.stderr and "again" in result.stderr
    with archive.open("a") as writer:
        writer.write('xt": "a late document about something new entirely"}\n')
    again = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    assert _jsonl(again.stdout)[-1]["summary"]["held_back_bytes"] == 0
    assert _jsonl((tmp_path / "k.jsonl").read_text())[-1]["id"] == "late"
    assert again.stderr == ""


def test_dedup_table_points_to_json_for_more_failures(runner: CliRunner, tmp_path: Path) -> None:
    """The table shows ten failures and says where the rest are (dedup has no --report);
    a fresh run shows no resume point."""
    archive = _archive(tmp_path / "a.jsonl", {}, "garbage\n" * 12)
    result = _run(runner, *_dedup_args(archive, tmp_path))
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0] == "kept 0, dropped 0, already_stored 0, failed 12, held_back_bytes 0"
    assert len(lines) == 12 and lines[-1] == "  ... 2 more failures (see --json)"
    assert "None" not in result.output and "--report" not in result.output


def test_dedup_drops_lines_whose_key_is_already_stored(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """A key the store holds (added before, or earlier in the input) means the line is not
    new: it goes to --dropped with duplicate_of its own key and its score against the
    stored document, is counted, and nothing is lost from both outputs."""
    store = tmp_path / "d.ndx"
    _run(runner, "init", store, "--threshold", 0.5)
    _run(runner, "add", store, _archive(tmp_path / "first.jsonl", {"storm-a": "x y z " * 20}),
         "--jsonl")  # fmt: skip
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    with archive.open("a", encoding="utf-8") as out:  # the same key again, in the input
        out.write(json.dumps({"id": "unrelated", "text": near_dup_corpus["unrelated"]}) + "\n")
    result = _run(runner, *_dedup_args(archive, tmp_path), "--json")
    assert result.exit_code == 0, result.output
    summary = _jsonl(result.output)[-1]["summary"]
    assert (summary["kept"], summary["dropped"], summary["already_stored"]) == (3, 3, 2)
    assert summary["failed"] == 0
    kept = [r["id"] for r in _jsonl((tmp_path / "k.jsonl").read_text())]
    dropped = {r["id"]: r for r in _jsonl((tmp_path / "x.jsonl").read_text())}
    assert kept == ["storm-b", "recipe-a", "unrelated"]
    assert sorted(dropped) == ["recipe-b", "storm-a", "unrelated"]
    assert dropped["storm-a"]["duplicate_of"] == "storm-a"
    assert dropped["storm-a"]["score"] < 0.5  # the stored text under that key differs
    assert dropped["unrelated"]["duplicate_of"] == "unrelated"
    assert dropped["unrelated"]["score"] == 1.0
    assert dropped["recipe-b"]["duplicate_of"] == "recipe-a"
    assert len(kept) + len(dropped) == 6  # every input line is in one output
    with Store.open(store, read_only=True) as opened:
        assert len(opened) == 4
    again = _run(runner, *_dedup_args(archive, tmp_path), "--fail-on-duplicates")
    assert again.exit_code == 1  # dropped lines, key clashes included


def _wait_for_documents(path: Path, count: int, timeout_s: float = 60) -> None:
    """Wait until another process has committed ``count`` documents to the store."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        with Store.open(path, read_only=True) as opened:
            if len(opened) >= count:
                return


def test_ctrl_c_during_add_keeps_committed_batches_and_says_so(tmp_path: Path) -> None:
    """A real SIGINT to a real ingest: every batch before it is committed, nothing of the
    one in progress, and the command says how many batches were committed.

    The documents come through stdin, which stays open: the ingest cannot finish before
    the signal, and the last batch is half read when it arrives. The child gets SIGINT's
    default disposition, as a foreground command has: run from a shell's background job
    (``.ci/run &``), the suite inherits an ignored SIGINT, and so would the child."""
    store = tmp_path / "s.ndx"
    Store.open(store, create=True, num_perm=32).close()
    process = subprocess.Popen(
        [sys.executable, "-m", "neardup_store", "add", str(store), "-", "--jsonl",
         "--batch-size", "100"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert process.stdin is not None
    for i in range(1050):  # ten whole batches and half of an eleventh
        words = " ".join(["alpha", "beta", "gamma", "delta", "eps"][(i + j) % 5] for j in range(60))
        process.stdin.write(json.dumps({"id": f"d{i:06d}", "text": f"{words} {i}"}) + "\n")
    process.stdin.flush()
    _wait_for_documents(store, 1000)
    time.sleep(0.2)  # let it read the half batch, and wait for more
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    line = [x for x in err.splitlines() if x.startswith("interrupted:")][-1]
    assert line == "interrupted: 10 batches committed, nothing half-applied", line
    with Store.open(store) as opened:
        assert len(opened) == 1000  # whole batches only
        assert list(opened)[-1] == "d000999"
        assert opened.check().ok


def test_a_failed_import_says_what_earlier_batches_committed(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The library's error carries a note on the batches already committed; the command
    printed only the error, so the user took the import for one that changed nothing."""
    from neardup_store import store as store_module

    monkeypatch.setattr(store_module, "MIN_TRANSACTION", 100)
    rng = np.random.default_rng(4)
    with Store.open(tmp_path / "source.ndx", create=True, num_perm=32) as source:
        sigs = rng.integers(0, 2**32, size=(250, 32), dtype=np.uint32)
        source.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
        stream = io.BytesIO()
        source.export(stream)
    bad = codec.export_item("bad", b"\x00" * 3, None)
    data = stream.getvalue()[: -len(codec.export_trailer(250))] + bad + codec.export_trailer(251)
    target = tmp_path / "target.ndx"
    Store.open(target, create=True, num_perm=32).close()
    result = _run(runner, "import", "-", target, input=data)
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == (
        "earlier batches committed the first 200 items; to finish, run the same import "
        "again with --replace, from a whole export"
    )
    with Store.open(target) as opened:
        assert len(opened) == 200


def test_ctrl_c_during_import_exits_130_and_says_what_was_committed(tmp_path: Path) -> None:
    """Only add and dedup turned a Ctrl-C into 130; every other command exited 1 (the
    code for findings) with Click's "Aborted!", and an import into an existing store kept
    its committed batches without a word (a review's finding)."""
    source, target = tmp_path / "source.ndx", tmp_path / "target.ndx"
    rng = np.random.default_rng(3)
    with Store.open(source, create=True, num_perm=32) as store:
        sigs = rng.integers(0, 2**32, size=(10_300, 32), dtype=np.uint32)
        store.add_signatures([(f"d{i:05d}", sig) for i, sig in enumerate(sigs)])
        stream = io.BytesIO()
        store.export(stream)
    Store.open(target, create=True, num_perm=32).close()
    unpacker = msgpack.Unpacker(io.BytesIO(stream.getvalue()), raw=False)
    ends = [unpacker.tell() for _ in unpacker]
    process = subprocess.Popen(
        [sys.executable, "-m", "neardup_store", "import", "-", str(target)],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert process.stdin is not None
    process.stdin.write(stream.getvalue()[: ends[10_100]])  # one batch of 10000 and some
    process.stdin.flush()
    _wait_for_documents(target, 10_000)
    time.sleep(0.2)  # it reads the rest and waits for more
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.decode().splitlines()[-2:] == [
        "interrupted",
        "earlier batches committed the first 10000 items; to finish, run the same import "
        "again with --replace, from a whole export",
    ]
    with Store.open(target) as opened:
        assert len(opened) == 10_000 and opened.check().ok


def test_every_store_command_through_a_real_subprocess(
    tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """The installed entry point, command by command, with the exit codes users script on."""
    store, archive = tmp_path / "s.ndx", _archive(tmp_path / "a.jsonl", near_dup_corpus)

    def run(*args: object, expect: int = 0) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "neardup_store", *map(str, args)],
            capture_output=True,
            text=True,
        )
        assert done.returncode == expect, (args, done.stderr)
        return done.stdout

    run("params", "--threshold", 0.5, "--num-perm", 64, "--json")
    run("init", store, "--threshold", 0.5, "--num-perm", 256, "--bands", 64, "--rows", 4)
    run("add", store, archive, "--jsonl")
    assert {len(c["keys"]) for c in _jsonl(run("clusters", store))} == {2}
    assert len(_jsonl(run("pairs", store))) == 2
    run("pairs", store, "--fail-on-duplicates", expect=1)
    run("stats", store, "--json")
    run("remove", store, "unrelated")
    run("remove", store, "unrelated", expect=2)  # no longer there
    run("rebuild", store, "--bands", 32, "--rows", 8)
    run("compact", store)
    run("backup", store, tmp_path / "b.ndx")
    assert "0 violations" in run("check", tmp_path / "b.ndx")
    run(*_dedup_args(archive, tmp_path))
    assert len((tmp_path / "x.jsonl").read_text().splitlines()) == 2
    run("query", tmp_path / "missing.ndx", "--text", "x", expect=2)


def test_progress_is_drawn_on_a_terminal_only(tmp_path: Path) -> None:
    """Long commands draw progress on stderr when it is a terminal (a real pty here), and
    stay silent when it is not (every other test)."""
    store = tmp_path / "s.ndx"
    with Store.open(store, create=True, num_perm=32) as opened:
        opened.add_many((f"k{i}", f"document number {i} " * 5) for i in range(2500))

    def stderr_on_a_terminal(*args: object) -> str:
        code, shown = _on_a_terminal(*args)
        assert code == 0
        return shown.decode("utf-8", "replace")

    assert "Exporting" in stderr_on_a_terminal("export", store, tmp_path / "e.export")
    assert "Re-banding" in stderr_on_a_terminal("rebuild", store, "--bands", 4, "--rows", 8)
    assert "Importing: 2500 documents" in stderr_on_a_terminal(
        "import", tmp_path / "e.export", tmp_path / "copy.ndx"
    )
    assert "Compacting" in stderr_on_a_terminal("compact", store)
    assert "Exporting" not in stderr_on_a_terminal("-q", "export", store, tmp_path / "f.export")


def test_params_png_draws_the_s_curve(runner: CliRunner, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")  # the optional `plot` extra
    png = tmp_path / "curve.png"
    result = _run(runner, "params", "--threshold", 0.8, "--png", png)
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_a_byte_order_mark_of_a_plain_file_is_not_part_of_its_text(
    runner: CliRunner, tmp_path: Path
) -> None:
    """A file saved with a UTF-8 BOM was signed with the mark as its first character: the
    same text scored about 0.6 against itself, and query --text found nothing (a
    review's finding). The mark is dropped wherever bytes become text."""
    text = "quarterly report on regional sales figures for the northern district"
    with_mark = tmp_path / "bom.txt"
    with_mark.write_bytes(b"\xef\xbb\xbf" + text.encode())
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store).exit_code == 0
    assert _run(runner, "add", store, with_mark).exit_code == 0
    for query in (("--text", text), ("--file", with_mark)):
        result = _run(runner, "query", store, *query, "--json")
        assert result.exit_code == 0, result.output
        assert [(m["key"], m["score"]) for m in _jsonl(result.output)] == [(str(with_mark), 1.0)]


def test_query_file_a_codec_refuses_is_one_error_line(runner: CliRunner, tmp_path: Path) -> None:
    """idna raises a plain UnicodeError, not UnicodeDecodeError: a traceback, exit 1."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"xn--a")
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store).exit_code == 0
    result = _run(runner, "query", store, "--file", bad, "--encoding", "idna")
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: {bad}: not valid idna (")


# -- outputs that cannot be written, empty key lists, Ctrl-C during check ---------------------

_FULL = Path("/dev/full")
_needs_dev_full = pytest.mark.skipif(not _FULL.exists(), reason="needs /dev/full (Linux)")


@_needs_dev_full
def test_add_report_that_cannot_be_written_is_an_error_after_the_add(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str]
) -> None:
    """The report's write error came at close, which Click swallows: exit 0 and the skipped
    list lost without a word (a review's finding)."""
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store, "--threshold", 0.5).exit_code == 0
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    result = _run(runner, "add", store, archive, "--jsonl", "--unique", "--report", _FULL)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith(f"Error: {_FULL}: cannot write the report (No space left on device)")
    assert line.endswith(
        "; the documents were added (3 added, 0 replaced, 2 skipped, 0 failed), but the "
        "report was not written"
    )
    with Store.open(store, read_only=True) as opened:
        assert len(opened) == 3


def _admin(*args: object, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "neardup_store", *map(str, args)]
    return subprocess.run(command, stderr=subprocess.PIPE, text=True, check=False, **kwargs)


def _stdout_env(buffered: bool) -> dict[str, str]:
    """The environment for a child whose stdout is block-buffered (how users and CI start
    Python) or not (PYTHONUNBUFFERED=1, as a developer's shell may export), so that a test
    checks the case it names whatever the caller's environment holds."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    return env


_BUFFERING = pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])


@_needs_dev_full
@_BUFFERING
@pytest.mark.parametrize("command", ["pairs", "query", "clusters", "export"])
def test_a_full_stdout_is_one_error_line_with_exit_2(
    store_path: Path, near_dup_corpus: dict[str, str], command: str, buffered: bool
) -> None:
    """A write error on stdout has no file name, so it was taken for a bug: a traceback
    and exit 1, the code for findings (a review's finding). Block-buffered, the bytes
    left in the buffer failed again at exit: "Exception ignored" and exit 120 (review 39)."""
    args = {
        "pairs": ["pairs", store_path, "--json"],
        "query": ["query", store_path, "--text", near_dup_corpus["storm-a"], "--json"],
        "clusters": ["clusters", store_path],
        "export": ["export", store_path, "-"],
    }[command]
    with _FULL.open("wb") as full:
        done = _admin(*args, stdout=full, env=_stdout_env(buffered))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["Error: stdout: No space left on device"]


@pytest.mark.parametrize("output", ["--keep", "--dropped"])
def test_dedup_output_that_cannot_be_written_says_what_was_committed(
    tmp_path: Path, output: str
) -> None:
    """A full disk, as a file-size limit: the new store stays under it, the lines going to
    ``output`` (12 of 60 kB) pass it. (/dev/full, a device, is refused up front now.)"""
    archive = tmp_path / "a.jsonl"
    with archive.open("w", encoding="utf-8") as out:
        for i in range(13):  # 13 documents kept, or one kept and 12 exact copies dropped
            text = " ".join(f"w{i if output == '--keep' else 0}x{j}" for j in range(12))
            pad = "x" * 60_000 if i or output == "--keep" else ""
            out.write(json.dumps({"id": f"k{i}", "text": text, "pad": pad}) + "\n")

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (512 * 1024, resource.RLIM_INFINITY))

    args = _dedup_args(archive, tmp_path)
    done = _admin(*args, "--json", stdout=subprocess.PIPE, preexec_fn=small_files)
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"Error: {args[args.index(output) + 1]}: File too large",
        "nothing of this batch was committed, any batches before it were: once the file "
        "can be written, run the same command again to resume after them",
    ]
    with Store.open(tmp_path / "d.ndx", read_only=True) as opened:
        assert len(opened) == 0  # the only batch was not committed


@pytest.mark.parametrize("stdout_is", ["a file", "a pipe"])
def test_dedup_refuses_its_own_stdout_as_an_output_before_creating_anything(
    tmp_path: Path, near_dup_corpus: dict[str, str], stdout_is: str
) -> None:
    """``--keep /dev/stdout`` passed when stdout was a file: the summary overwrote the kept
    lines and the progress file was written into /dev; on a pipe, the store was created
    before the pipe's path was found not to exist (review 59)."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = _dedup_args(archive, tmp_path)
    args[args.index("--keep") + 1] = "/dev/stdout"
    before = sorted(os.listdir(tmp_path))
    if stdout_is == "a file":
        with (tmp_path / "out.txt").open("wb") as out:
            done = _admin(*args, stdout=out)
        expected = "a file other than this process's standard output or error"
        assert (tmp_path / "out.txt").read_bytes() == b""
        before.append("out.txt")
    else:
        done = _admin(*args, stdout=subprocess.PIPE)
        expected = "a regular file"
    assert done.returncode == 2
    assert done.stderr.startswith("Error: keep='/dev/stdout' is not valid: expected " + expected)
    assert sorted(os.listdir(tmp_path)) == sorted(before)  # no store, no progress file
    assert not list(Path("/dev").glob("stdout.progress*"))


def test_add_stopped_by_a_full_disk_says_what_its_earlier_batches_stored(tmp_path: Path) -> None:
    """A full disk part-way through an ``add`` said only that nothing of the failing
    transaction was written, though earlier batches of the same command had committed
    thousands of documents (review 59)."""
    store = tmp_path / "s.ndx"
    assert _admin("init", store, "--num-perm", "64").returncode == 0
    rows = [{"id": f"d{i}", "text": f"document {i} " + " ".join(f"w{i}x{j}" for j in range(20))}
            for i in range(6000)]  # fmt: skip
    archive = tmp_path / "a.jsonl"
    archive.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    limit = (store / "data.mdb").stat().st_size + 1024 * 1024

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))

    args = ("add", store, archive, "--jsonl", "--batch-size", "500", "--json")
    done = _admin(*args, stdout=subprocess.PIPE, preexec_fn=small_files)
    assert done.returncode == 2, done.stderr
    with Store.open(store, read_only=True) as opened:
        stored = len(opened)
    assert 0 < stored < len(rows) and stored % 500 == 0
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"Error: {store}: ") and "nothing of this transaction" in lines[0]
    assert lines[1:] == [
        f"the batches before it are committed: {stored // 500} of them, the first {stored} "
        f"records ({stored} added, 0 replaced); once the cause is fixed, the same command "
        "adds the rest"
    ]
    finished = _admin(*args, stdout=subprocess.PIPE)
    assert finished.returncode == 0, finished.stderr
    with Store.open(store, read_only=True) as opened:
        assert len(opened) == len(rows)


@_needs_dev_full
@_BUFFERING
@pytest.mark.parametrize("args", [["--help"], ["--version"], ["-q", "--help"], ["query", "--help"]])
def test_help_and_version_follow_the_exit_codes_when_stdout_fails(
    args: list[str], buffered: bool
) -> None:
    """The group's own --help and --version, which Click runs while it parses, ended in a
    36-line traceback and exit 1 on a full stdout, and exit 1 when the reader had gone
    (review 32); a command's --help already gave one line and exit 2, or 141. Block-
    buffered, a full stdout then gave exit 120 at exit's flush (review 39)."""
    env = _stdout_env(buffered)
    with _FULL.open("wb") as full:
        done = _admin(*args, stdout=full, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == ["Error: stdout: No space left on device"]
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the child starts: every write is EPIPE
    try:
        gone = _admin(*args, stdout=write_end, env=env)
    finally:
        os.close(write_end)
    assert (gone.returncode, gone.stderr) == (141, "")


def test_a_reader_that_closes_stdout_stops_the_command_quietly(store_path: Path) -> None:
    """``... | head``: Click's default exited 1, the code for findings; now 141, the
    status of a command that SIGPIPE stopped, with nothing on stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "neardup_store", "pairs", str(store_path), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None
    process.stdout.close()  # the reader is gone before the first pair is written
    _, err = process.communicate(timeout=60)
    assert process.returncode == 141, err
    assert err == b""


def test_remove_with_an_empty_key_file_removes_nothing(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    """An empty --from-file was the usage error for giving no keys at all (a review's
    finding): a scheduled "remove what is stale" failed on a day with nothing stale."""
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    from_file = _run(runner, "remove", store_path, "--from-file", empty, "--json")
    assert from_file.exit_code == 0, from_file.output
    assert _jsonl(from_file.output) == [{"removed": 0, "asked": 0}]
    stdin = _run(runner, "remove", store_path, "--from-file", "-", "--missing-ok", input="")
    assert stdin.exit_code == 0 and stdin.output == "Removed 0 of 0 documents.\n"
    nothing = _run(runner, "remove", store_path)
    assert nothing.exit_code == 2 and "give keys as arguments or with --from-file" in nothing.output
    with Store.open(store_path, read_only=True) as opened:
        assert len(opened) == 5


_CHECK_HELD_IN_THE_WALK = """
import sys, time
from neardup_store import cli, lmdbfile

real_page = lmdbfile._Walker.page

def page(walker, pgno, tree):
    found = real_page(walker, pgno, tree)  # a view of the mapped file, alive in this frame
    print("walking", file=sys.stderr, flush=True)
    time.sleep(60)  # Ctrl-C lands here
    return found

lmdbfile._Walker.page = page
sys.argv = ["neardup-admin", "check", sys.argv[1], "--json"]
cli.main()
"""


def test_ctrl_c_during_the_page_walk_of_check_exits_130(store_path: Path) -> None:
    """A real SIGINT while the walk holds a view of the mapped file (held there on purpose,
    as a large store's walk does for seconds): the unmapping raised BufferError over the
    KeyboardInterrupt, a traceback and exit 1, the code for violations found (a review's
    finding)."""
    _assert_interrupted_once_it_says(_CHECK_HELD_IN_THE_WALK, "walking", str(store_path))


def _assert_interrupted_once_it_says(script: str, ready: str, *args: str) -> None:
    """Run ``script`` in a real process, send it a real SIGINT once it writes ``ready`` to
    stderr, and check it ends as a Ctrl-C should: 'interrupted' alone, exit 130."""
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert process.stderr is not None
    assert process.stderr.readline() == f"{ready}\n"
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert out == "" and err.splitlines() == ["interrupted"]


_HELD_WHILE_CLICK_PARSES = """
import sys, time
from neardup_store import cli

def parse_args(ctx, args):
    print("parsing", file=sys.stderr, flush=True)
    time.sleep(60)  # Ctrl-C lands here, before the command's own handler

cli.cli.parse_args = parse_args
sys.argv = ["neardup-admin", "params", "--threshold", "0.8"]
cli.main()
"""


def test_ctrl_c_while_click_parses_exits_130(tmp_path: Path) -> None:
    """A real SIGINT after the modules are imported but before the command runs: Click
    said "Aborted!" with exit 1, the code for findings; now the same "interrupted" line and
    exit 130 as during a command. (A Ctrl-C while the package itself is still importing,
    before cli.py runs, is out of this module's reach: see the entry point.)"""
    _assert_interrupted_once_it_says(_HELD_WHILE_CLICK_PARSES, "parsing")


def test_remove_from_a_key_file_with_a_byte_order_mark(runner: CliRunner, tmp_path: Path) -> None:
    """The mark stayed on the first key: with --missing-ok that document was silently kept
    (a review of a fix's finding)."""
    store = tmp_path / "s.ndx"
    with Store.open(store, create=True) as opened:
        opened.add_many([("a", "first document text"), ("b", "second document text")])
    keys = tmp_path / "keys.txt"
    keys.write_bytes(b"\xef\xbb\xbfa\nb\n")
    result = _run(runner, "remove", store, "--from-file", keys, "--missing-ok", "--json")
    assert result.exit_code == 0, result.output
    with Store.open(store, read_only=True) as opened:
        assert list(opened) == []


# -- review 20 ------------------------------------------------------------------------------------


@pytest.mark.parametrize("clash", ["the store's data file", "the input", "a link to the input"])
def test_add_refuses_a_report_that_is_the_store_or_an_input_before_opening_it(
    runner: CliRunner, store_path: Path, tmp_path: Path, clash: str
) -> None:
    """add --report was opened (emptied) at parse time: --report STORE/data.mdb wiped every
    committed document, --report INPUT emptied the input and exited 0 (review 20)."""
    archive = _archive(tmp_path / "a.jsonl", {"new": "a new document with some words in it"})
    report = {
        "the store's data file": store_path / "data.mdb",
        "the input": archive,
        "a link to the input": tmp_path / "link.jsonl",
    }[clash]
    if clash == "a link to the input":
        report.symlink_to(archive)
    data, before = (store_path / "data.mdb").read_bytes(), archive.read_bytes()
    result = _run(runner, "add", store_path, archive, "--jsonl", "--report", report)
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    expected = "outside the store's directory" if "store" in clash else "other than the input"
    assert line.startswith("Error: report=") and line.endswith(expected)
    assert (store_path / "data.mdb").read_bytes() == data and archive.read_bytes() == before


@pytest.mark.parametrize("rerun", ["the same command", "another threshold"])
def test_dedup_refuses_to_resume_a_job_whose_store_is_gone(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], rerun: str
) -> None:
    """With the store deleted, a rerun resumed against a new empty store and kept copies of
    what it had kept; a rerun with another threshold was refused only after creating that
    store, which stayed (review 20). Now refused, and nothing is created."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = _dedup_args(archive, tmp_path)
    assert _run(runner, *args).exit_code == 0
    store = tmp_path / "d.ndx"
    for name in os.listdir(store):
        (store / name).unlink()
    store.rmdir()
    with archive.open("a", encoding="utf-8") as out:  # a copy of a kept document
        out.write(json.dumps({"id": "copy", "text": near_dup_corpus["unrelated"]}) + "\n")
    if rerun == "another threshold":
        args[args.index("--threshold") + 1] = 0.9
    outputs = {name: (tmp_path / name).read_bytes() for name in ["k.jsonl", "x.jsonl"]}
    result = _run(runner, *args)
    assert result.exit_code == 2, result.output
    [line] = result.output.splitlines()
    sidecar = tmp_path / "k.jsonl.progress.json"
    assert line.startswith(f"Error: {sidecar}: ")
    if rerun == "the same command":
        assert "committed batch of a job on the store" in line
        assert "restore that store" in line and "delete the progress file" in line
    else:
        assert "differs in threshold" in line
    assert not store.exists()
    assert outputs == {name: (tmp_path / name).read_bytes() for name in outputs}


@pytest.mark.parametrize("output", ["--keep", "--dropped"])
def test_dedup_refuses_an_output_that_is_no_regular_file_before_creating_a_store(
    runner: CliRunner, tmp_path: Path, near_dup_corpus: dict[str, str], output: str
) -> None:
    """--keep /dev/null failed at the first batch with "Invalid argument" (fsync on a
    device), advice to rerun that could never work, and a new store left (review 20)."""
    archive = _archive(tmp_path / "a.jsonl", near_dup_corpus)
    args = _dedup_args(archive, tmp_path)
    args[args.index(output) + 1] = os.devnull
    result = _run(runner, *args)
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"Error: {output[2:]}='{os.devnull}' is not valid: expected a regular file (a "
        "resumed job cuts it back to the size it records)\n"
    )
    assert not (tmp_path / "d.ndx").exists()


def test_a_cut_short_import_into_a_store_says_how_to_finish_it_and_that_works(
    runner: CliRunner, store_path: Path, tmp_path: Path
) -> None:
    """The note said "resume from item #N", which no command can do, and the docs said a
    cut-short export is not imported in part (review 20). The note's advice now works."""
    from neardup_store import store as store_module

    with Store.open(store_path) as source:
        export = io.BytesIO()
        source.export(export)
    whole = export.getvalue()
    target = tmp_path / "target.ndx"
    Store.open(target, create=True, threshold=0.7).close()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(store_module, "MIN_TRANSACTION", 2)
        result = _run(runner, "import", "-", target, input=whole[: len(whole) - 20])
    assert result.exit_code == 2
    assert result.output.splitlines()[-1].endswith(
        "; to finish, run the same import again with --replace, from a whole export"
    )
    with Store.open(target) as opened:
        assert 0 < len(opened) < 5  # earlier batches stay, as import --help says
    assert "stay committed" in " ".join(_run(runner, "export", "--help").output.split())
    again = _run(runner, "import", "-", target, "--replace", input=whole)
    assert again.exit_code == 0, again.output
    with Store.open(target) as opened, Store.open(store_path) as source:
        assert sorted(opened) == sorted(source) and opened.check().ok


@pytest.mark.parametrize(
    ("closed", "command"),
    [(1, ["export", "{store}", "-"]),
     (1, ["add", "{store}", "{input}", "--jsonl", "--replace", "--report", "-"]),
     (0, ["import", "-", "{tmp}/new.ndx"]), (0, ["query", "{store}", "--jsonl", "-"]),
     (0, ["remove", "{store}", "--from-file", "-"]), (0, ["add", "{store}", "-", "--jsonl"])],
)  # fmt: skip
def test_a_closed_standard_stream_is_one_error_line(
    store_path: Path, tmp_path: Path, closed: int, command: list[str]
) -> None:
    """``export STORE - >&-`` died with an AttributeError traceback, exit 1 (review 20),
    and so did every other ``-`` with its stream closed, ``add`` after its batches had
    committed (review 25)."""
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "text": "a document of a few words"}\n')
    names = {"store": store_path, "tmp": tmp_path, "input": source}
    args = [part.format(**names) for part in command]
    done = _admin(*args, preexec_fn=lambda: os.close(closed))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    where = "nowhere to write" if closed else "nothing to read"
    assert done.stderr.splitlines()[0].startswith("Error: ") and where in done.stderr
    assert not (tmp_path / "new.ndx").exists()


def test_a_closed_stdout_or_stderr_fails_no_command_that_does_not_write_there(
    store_path: Path, tmp_path: Path
) -> None:
    """Only a ``-`` argument needs its stream: with stdout closed, init and remove did
    their work and then exited 2 advising to name a file instead of - (review 26), and
    with stderr closed, check, clusters and query exited 1, the code for findings, on
    asking the missing stream whether it is a terminal (review 26)."""
    new = tmp_path / "new.ndx"
    runs = [
        (1, ["init", new]),
        (1, ["remove", store_path, "storm-a"]),
        (2, ["check", store_path]),
        (2, ["clusters", store_path]),
        (2, ["query", store_path, "--text", "some words of a query"]),
    ]
    for closed, args in runs:
        done = _admin(*args, preexec_fn=lambda closed=closed: os.close(closed))
        assert done.returncode == 0, (args, done.stderr)
    with Store.open(new) as made, Store.open(store_path) as store:
        assert len(made) == 0 and "storm-a" not in store
    # Click printed its errors on stdout when stderr was closed, amid JSON lines (review 27).
    missing = _admin(
        "info",
        tmp_path / "missing.ndx",
        "--json",
        preexec_fn=lambda: os.close(2),
        stdout=subprocess.PIPE,
    )
    assert missing.returncode == 2 and missing.stdout == ""


@pytest.mark.parametrize(
    "command",
    [["import", "{missing}", "{tmp}/new.ndx"], ["query", "{store}", "--jsonl", "{missing}"],
     ["query", "{store}", "--text", "some words", "--exact", "{missing}"],
     ["query", "{store}", "--file", "{missing}"], ["remove", "{store}", "--from-file", "{missing}"],
     ["add", "{store}", "{missing}", "--report", "{tmp}/no/dir/r.jsonl"],
     ["dedup", "{missing}", "--store", "{tmp}/d.ndx", "--keep", "{tmp}/k", "--dropped", "{tmp}/x"]],
)  # fmt: skip
def test_a_file_that_cannot_be_opened_is_one_error_line(
    runner: CliRunner, store_path: Path, tmp_path: Path, command: list[str]
) -> None:
    """README: a file that cannot be opened is one Error: line; these parameters gave
    Click's usage block (Usage:, Try --help, a blank line, Error:) (review 20)."""
    names = {"missing": tmp_path / "missing.jsonl", "tmp": tmp_path, "store": store_path}
    result = _run(runner, *(part.format(**names) for part in command))
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert line.startswith("Error: ") and "Usage" not in line
    assert "missing.jsonl" in line or "r.jsonl" in line
    assert not (tmp_path / "new.ndx").exists() and not (tmp_path / "d.ndx").exists()


@pytest.mark.parametrize("killed_at", ["after-commit:2", "before-commit:2"])
def test_a_killed_dedup_batch_is_judged_right_whatever_others_did_to_one_of_its_documents(
    tmp_path: Path, killed_at: str
) -> None:
    """A batch killed around its commit counted as committed when its first kept key was
    in the store: once someone removed that document after the commit, the rerun dropped
    the batch's other documents as duplicates of themselves (review 27); probing any kept
    key instead took a batch that never committed as committed once someone added one of
    its documents (review 28). The commit counter, then most of the kept keys, decide."""
    source = tmp_path / "in.jsonl"
    rng = np.random.default_rng(1)
    lines = [
        json.dumps({"id": f"d{i}", "text": " ".join(f"w{w}" for w in rng.choice(5000, 40))})
        for i in range(20)
    ]
    source.write_text("".join(line + "\n" for line in lines))
    args = [*_dedup_args(source, tmp_path), "--batch-size", 10]
    killed = _admin(*args, env={**os.environ, "NEARDUP_FAULT": killed_at})
    assert killed.returncode == -signal.SIGKILL
    with Store.open(tmp_path / "d.ndx") as store:  # someone else, in between
        if killed_at.startswith("after"):
            store.remove("d10")  # the pending batch's first kept document
        else:
            store.add("d15", json.loads(lines[15])["text"])  # one of the batch's documents
    assert _admin(*args).returncode == 0
    kept = [json.loads(line)["id"] for line in (tmp_path / "k.jsonl").read_text().splitlines()]
    dropped = (tmp_path / "x.jsonl").read_text().splitlines()
    with Store.open(tmp_path / "d.ndx") as store:
        if killed_at.startswith("after"):  # the batch committed: kept, d10 since removed
            assert kept == [f"d{i}" for i in range(20)] and dropped == []
        else:  # it did not: done again, d15 found stored by then
            assert kept == [f"d{i}" for i in range(20) if i != 15] and len(dropped) == 1
            assert all(key in store for key in kept)


def test_a_killed_dedup_resumes_after_its_stores_commit_counter_was_repaired(
    tmp_path: Path,
) -> None:
    """A repair reset a damaged commit counter to 0: the rerun then took the pending
    batch, which had committed, as not committed, and dropped its documents as
    duplicates of themselves, or refused the store as not the job's (review 29). The
    repair resets it to LMDB's transaction id, and the pending batch is judged by its
    kept keys."""
    source = tmp_path / "in.jsonl"
    rng = np.random.default_rng(2)
    source.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "text": " ".join(f"w{w}" for w in rng.choice(5000, 40))})
            + "\n"
            for i in range(20)
        )
    )
    args = [*_dedup_args(source, tmp_path), "--batch-size", 10]
    killed = _admin(*args, env={**os.environ, "NEARDUP_FAULT": "after-commit:2"})
    assert killed.returncode == -signal.SIGKILL
    env = lmdb.open(str(tmp_path / "d.ndx"), max_dbs=64)
    with env.begin(write=True) as txn:
        txn.put(b"commit_counter", codec.pack_meta("x"), db=env.open_db(codec.META_DB, txn=txn))
    env.close()
    assert _admin("check", tmp_path / "d.ndx", "--repair").returncode == 0
    assert _admin(*args).returncode == 0
    kept = (tmp_path / "k.jsonl").read_text().splitlines()
    assert len(kept) == 20 and (tmp_path / "x.jsonl").read_text() == ""


def test_a_resumed_dedup_rates_only_the_lines_it_read(tmp_path: Path) -> None:
    """The docs/s of a resumed dedup divided every line of the job, earlier runs' too, by
    this run's time (review 20): it now says which line this run began after."""
    archive = tmp_path / "a.jsonl"
    archive.write_text(
        "".join(json.dumps({"id": f"k{i}", "text": f"document {i} " * 8}) + "\n" for i in range(40))
    )
    args = [*_dedup_args(archive, tmp_path), "--batch-size", 10]
    assert _admin(*args).returncode == 0
    with archive.open("a") as out:
        out.write(
            "".join(json.dumps({"id": f"n{i}", "text": f"new {i} " * 8}) + "\n" for i in range(20))
        )
    returncode, shown = _on_a_terminal(*args)
    assert returncode == 0
    assert b"60 docs, " in shown and b" docs/s since line 40, " in shown


def _on_a_terminal(*args: object) -> tuple[int, bytes]:
    """Run neardup-admin with stderr on a pseudo-terminal, where progress is drawn: its
    exit code and what it drew there."""
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "neardup_store", *map(str, args)]
    done = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=follower, timeout=120)
    os.close(follower)
    shown = _read_to_the_end(leader)
    os.close(leader)
    return done.returncode, shown


def _read_to_the_end(leader: int) -> bytes:
    """What is left to read on a pseudo-terminal whose other end has closed."""
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal's other end is closed: all is read
            break
        if not chunk:
            break
        shown += chunk
    return shown


def test_check_clusters_and_query_of_many_lines_show_progress(tmp_path: Path) -> None:
    """They ran silent for minutes on a large store, where every other long command draws
    progress (review 20)."""
    rng = np.random.default_rng(5)
    sigs = rng.integers(0, 2**32, size=(1200, 32), dtype=np.uint32)
    sigs[600:] = sigs[:600]  # 600 pairs of copies
    with Store.open(tmp_path / "s.ndx", create=True, num_perm=32) as store:
        store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
    queries = tmp_path / "q.jsonl"
    queries.write_text(
        "".join(f'{{"id": "q{i}", "text": "query {i} words"}}\n' for i in range(1500))
    )
    assert _on_a_terminal("check", tmp_path / "s.ndx") == (
        0,
        b"\rChecking: 1000 documents\rChecking: 1200 documents\r\n",
    )
    code, shown = _on_a_terminal("clusters", tmp_path / "s.ndx")
    assert code == 0 and shown.endswith(b"\rFinding clusters: 600 pairs\r\n")
    code, shown = _on_a_terminal("query", tmp_path / "s.ndx", "--jsonl", queries)
    assert code == 0 and b"Querying" in shown and b"100%" in shown
    assert _on_a_terminal("-q", "check", tmp_path / "s.ndx") == (0, b"")


def _an_export_of(path: Path, documents: int) -> bytes:
    """The export of a new store at ``path`` holding ``documents`` random signatures:
    more than one import batch (10,000) makes ``import`` draw its running count."""
    sigs = np.random.default_rng(8).integers(0, 2**32, size=(documents, 8), dtype=np.uint32)
    with Store.open(path, create=True, num_perm=8, bands=2, rows=4) as store:
        store.add_signatures([(f"d{i}", sig) for i, sig in enumerate(sigs)])
        stream = io.BytesIO()
        store.export(stream)
    return stream.getvalue()


def test_an_import_that_fails_after_its_count_was_drawn_starts_the_error_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    """The running count had no newline when the import failed, so the terminal showed
    "Importing: 10000 documentsError: cannot import: ..." (a review's finding)."""
    data = _an_export_of(tmp_path / "s.ndx", 12_000)
    cut = tmp_path / "cut.export"
    cut.write_bytes(data[: len(data) * 9 // 10])
    code, shown = _on_a_terminal("import", cut, tmp_path / "new.ndx")
    assert code == 2
    assert shown.startswith(b"\rImporting: 10000 documents\r\nError: cannot import: the stream")
    assert not (tmp_path / "new.ndx").exists()


def test_an_import_interrupted_after_its_count_was_drawn_says_so_on_a_line_of_its_own(
    tmp_path: Path,
) -> None:
    """A Ctrl-C gave "Importing: 10000 documentsinterrupted" (a review's finding)."""
    data = _an_export_of(tmp_path / "s.ndx", 12_000)
    leader, follower = pty.openpty()
    command = [sys.executable, "-m", "neardup_store", "import", "-", str(tmp_path / "new.ndx")]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                             stderr=follower)  # fmt: skip
    os.close(follower)
    assert child.stdin is not None
    child.stdin.write(data[: len(data) * 9 // 10])  # a batch and more; the rest never comes
    child.stdin.flush()
    shown = b""
    try:
        while b"documents" not in shown:  # the first batch is committed and counted
            assert select.select([leader], [], [], 120)[0], shown  # (no hang if it never is)
            shown += os.read(leader, 65536)
        child.send_signal(signal.SIGINT)
        assert child.wait(timeout=120) == 130
        shown += _read_to_the_end(leader)
    finally:
        child.kill()
        child.wait()
        child.stdin.close()
        os.close(leader)
    assert shown.startswith(b"\rImporting: 10000 documents\r\ninterrupted\r\n"), shown
    assert not (tmp_path / "new.ndx").exists()


def test_import_into_a_directory_with_other_files_advises_a_new_or_empty_one_not_init(
    runner: CliRunner, tmp_path: Path
) -> None:
    """It advised making a store there "with `neardup-admin init`", whose default
    parameters an export made with others does not fit: the import was then refused (a
    review's finding). Import makes the store itself, in a new or empty directory."""
    export = tmp_path / "x.export"
    export.write_bytes(_an_export_of(tmp_path / "s.ndx", 3))
    target = tmp_path / "target"
    target.mkdir()
    (target / "notes.txt").write_text("mine")
    refused = runner.invoke(cli, ["import", str(export), str(target)])
    assert refused.exit_code == 2
    assert refused.output == (
        f"Error: {target}: not a neardup_store store (no store, but other files: "
        "'notes.txt'); point at a store directory, or at an empty or new directory (import "
        "makes the store there, with the export's parameters)\n"
    )
    foreign = lmdb.open(str(tmp_path / "foreign"))  # another application's environment
    with foreign.begin(write=True) as txn:
        txn.put(b"key", b"value")
    foreign.close()
    refused = runner.invoke(cli, ["import", str(export), str(tmp_path / "foreign")])
    assert refused.exit_code == 2 and "init" not in refused.output
    assert refused.output.endswith("(import makes the store there, with the export's parameters)\n")
    (tmp_path / "empty").mkdir()
    for where in (tmp_path / "empty", tmp_path / "new"):
        done = runner.invoke(cli, ["import", str(export), str(where)])
        assert done.exit_code == 0, done.output
        with Store.open(where, read_only=True) as store:
            assert sorted(store) == ["d0", "d1", "d2"] and store.config.num_perm == 8


# -- review 41 ------------------------------------------------------------------------------


def _strict_json(line: str) -> Any:
    """``line`` as JSON, refusing NaN and Infinity as JavaScript's JSON.parse does."""

    def refuse(token: str) -> Any:
        raise ValueError(f"not JSON: {token}")

    return json.loads(line, parse_constant=refuse)


def test_numbers_past_a_double_and_nan_give_json_output(runner: CliRunner, tmp_path: Path) -> None:
    """1e400 is valid JSON: it came back as the bare token Infinity in dedup --dropped and
    as the key of --json failure records of add, dedup and query; a NaN token was taken
    as input (review 41 #1). Now numbers are written as they were read, and NaN makes its
    line malformed, as any other line that is not JSON."""
    text = "the quick brown fox jumps over the lazy dog"
    not_json = f'{{"id": "c", "text": "{text} and more", "size": NaN}}'
    archive = tmp_path / "in.jsonl"
    archive.write_text(
        f'{{"id": "a", "text": "{text}", "size": 1e400}}\n'
        f'{{"id": "b", "text": "{text}", "size": 1e400, "r": 0.1000000000000000000001}}\n'
        '{"id": 1e400, "body": "no text field"}\n'
        f"{not_json}\n"
    )
    store, dropped = tmp_path / "s.ndx", tmp_path / "d.jsonl"
    outputs = {
        "dedup": _run(runner, "dedup", archive, "--store", store, "--keep",
                      tmp_path / "k.jsonl", "--dropped", dropped, "--json"),
        "add": _run(runner, "add", store, archive, "--jsonl", "--json"),
        "query": _run(runner, "query", store, "--jsonl", archive, "--json"),
    }  # fmt: skip
    assert dropped.read_text() == (
        f'{{"id": "b", "text": "{text}", "size": 1e400, "r": 0.1000000000000000000001, '
        '"duplicate_of": "a", "score": 1.0}\n'
    )
    for command, result in outputs.items():
        assert result.exit_code == 1, (command, result.output)
        records = [_strict_json(line) for line in result.stdout.splitlines()]
        failed = [record["failed"] for record in records if "failed" in record]
        assert [(f["line"], f["key"], f["error"]) for f in failed] == [
            (3, float("inf"), "KeyError"),  # how Python reads 1e400
            (4, None, "JSONDecodeError"),
        ], command
        assert '"key": 1e400,' in result.stdout, command  # as it was written
        column = not_json.index("NaN") + 1
        assert failed[1]["message"] == f"malformed JSON (NaN is not JSON at column {column})"


def test_add_keys_a_file_whose_name_is_not_utf8_by_its_bytes(
    runner: CliRunner, tmp_path: Path
) -> None:
    """add refused a Latin-1 file name ("not encodable as UTF-8"), with no way out, and its
    failure record held lone surrogates, which strict JSON parsers refuse (review 41 #5).
    The key is now the path's bytes: printed as hex:, which remove takes back."""
    docs = tmp_path / "docs"
    docs.mkdir()
    latin = os.fsencode(docs) + b"/r\xe9sum\xe9.txt"
    try:
        with open(latin, "wb") as out:
            out.write(b"curriculum vitae of a person with a long list of jobs and skills")
        with open(os.fsencode(docs) + b"/emp\xe9.txt", "wb"):
            pass
    except OSError:
        pytest.skip("this file system takes only UTF-8 names")
    (docs / "plain.txt").write_text("a second document with other words entirely in it")
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store).exit_code == 0
    added = _run(runner, "add", store, docs, "--json")
    assert added.exit_code == 1, added.output  # the empty file
    (failed, summary) = [_strict_json(line) for line in added.stdout.splitlines()]
    shown = f"{docs}/emp\\xe9.txt"
    assert failed["failed"] == {
        "source": shown,
        "file": shown,
        "line": None,
        "key": "hex:" + (os.fsencode(docs) + b"/emp\xe9.txt").hex(),
        "error": "EmptyDocumentError",
        "message": "empty document",
    }
    assert summary["summary"]["added"] == 2
    assert "\\ud" not in added.stdout
    found = _run(runner, "query", store, "--file", os.fsdecode(latin), "--json")
    assert found.exit_code == 0, found.output
    key = "hex:" + latin.hex()
    assert _strict_json(found.stdout) == {"query": key, "key": key, "score": 1.0}
    removed = _run(runner, "remove", store, key)
    assert removed.exit_code == 0, removed.output
    with Store.open(store, read_only=True) as opened:
        assert list(opened) == [str(docs / "plain.txt")]


_SIGINT_AT_THE_THIRD_COMMIT = """
import os, signal, sys
from neardup_store import _faults
from neardup_store.cli import main

checkpoint, seen = _faults.checkpoint, []

def interrupting(name):
    checkpoint(name)
    if name == "after-commit":
        seen.append(name)
        if len(seen) == 3:  # LMDB's commit of the third batch has returned
            os.kill(os.getpid(), signal.SIGINT)

_faults.checkpoint = interrupting
sys.argv = ["neardup-admin", *sys.argv[1:]]
main()
"""


@pytest.mark.parametrize("command", ["dedup", "add --replace"])
def test_ctrl_c_during_a_batch_commit_counts_that_batch(tmp_path: Path, command: str) -> None:
    """A real SIGINT that arrives while a batch commits is raised once the commit has
    returned, marked transaction_committed: dedup, and add --replace of a batch that only
    replaced keys, said one batch fewer than the store had committed (review 41 #2)."""
    archive = tmp_path / "in.jsonl"
    with archive.open("w") as out:
        for i in range(60):
            words = " ".join(f"w{i}x{j}" for j in range(30))
            out.write(json.dumps({"id": f"d{i}", "text": f"document {i} {words}"}) + "\n")
    store = tmp_path / "s.ndx"
    if command == "dedup":
        Store.open(store, create=True, num_perm=32).close()
        args = ["dedup", str(archive), "--store", str(store), "--keep", str(tmp_path / "k"),
                "--dropped", str(tmp_path / "d")]  # fmt: skip
    else:
        with Store.open(store, create=True, num_perm=32) as opened:
            opened.add_many((f"d{i}", f"an older text {i} of the document") for i in range(60))
        args = ["add", str(store), str(archive), "--jsonl", "--replace"]
    before = commit_counter(store)
    process = subprocess.run(
        [sys.executable, "-c", _SIGINT_AT_THE_THIRD_COMMIT, *args, "--batch-size", "10"],
        capture_output=True,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        timeout=120,
    )
    assert process.returncode == 130, process.stderr
    assert commit_counter(store) - before == 3
    assert process.stderr.splitlines()[-1] == (
        "interrupted: 3 batches committed, nothing half-applied"
    )
    if command == "dedup":  # and the next run goes on after those three
        assert len((tmp_path / "k").read_text().splitlines()) == 30
        again = subprocess.run(
            [sys.executable, "-m", "neardup_store", *args, "--batch-size", "10", "--json"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["summary"]["resumed_from_line"] == 30
        assert len((tmp_path / "k").read_text().splitlines()) == 60


# -- review 45: keys in check, inputs that fail to read, walks, lost summaries, advice, demo ---


def test_check_names_a_damaged_record_by_the_key_remove_takes(
    runner: CliRunner, tmp_path: Path
) -> None:
    """check printed a damaged record's key as a Python repr, 'hex:00ff': typed without
    the quotes, as remove reads keys, it named the bytes key b"\\x00\\xff", and remove
    took out that healthy document instead (review 45)."""
    path = tmp_path / "s.ndx"
    with Store.open(path, create=True) as store:
        store.add(b"\x00\xff", "a healthy document stored under a bytes key, with words in it")
        store.add("hex:00ff", "a str key that reads like a bytes key; its record gets damaged")
    with raw_env(path) as (env, dbs), env.begin(write=True) as txn:
        doc_id = txn.get(codec.key_index(b"hex:00ff", True), db=dbs[codec.KEYS_DB])
        record = bytearray(txn.get(doc_id, db=dbs[codec.DOCS_DB]))
        record[20] ^= 0x40  # inside the signature: only the checksum can tell
        txn.put(doc_id, bytes(record), db=dbs[codec.DOCS_DB])
    table = _run(runner, "check", path)
    assert table.exit_code == 1
    assert "(key \\hex:00ff: remove it by that key, run check --repair" in table.stdout
    violation, _ = _jsonl(_run(runner, "check", path, "--json").stdout)
    assert violation["kind"] == "corrupt-record" and violation["key"] == "\\hex:00ff"
    assert _run(runner, "remove", path, violation["key"]).exit_code == 0
    with Store.open(path, read_only=True) as opened, opened.read() as txn:
        assert b"\x00\xff" in txn and "hex:00ff" not in txn
    assert _run(runner, "check", path, "--repair").exit_code == 0
    assert _run(runner, "check", path).exit_code == 0


_EIO = Path("/proc/self/mem")


def _fails_to_read(path: Path) -> bool:
    """Whether ``path`` opens and then fails its first read (/proc/self/mem gives EIO at
    offset 0 on Linux): the case of a failing disk, NFS or FUSE."""
    try:
        with path.open("rb") as stream:
            stream.read(1)
    except OSError:
        return True
    return False


@pytest.mark.skipif(not _fails_to_read(_EIO), reason="needs /proc/self/mem to give EIO")
@pytest.mark.parametrize("command", ["add", "query --jsonl", "query --exact", "remove", "dedup"])
def test_an_input_that_opens_but_fails_to_read_is_a_failure_or_one_error_line(
    runner: CliRunner, store_path: Path, tmp_path: Path, command: str
) -> None:
    """These crashed with an OSError traceback and exit 1 (review 45); dedup first made
    its store and output files. Where the command goes on past unusable input, the file
    is a failure (exit 1); where it needs all of it, one Error: line (exit 2)."""
    good = tmp_path / "g.jsonl"
    good.write_text('{"id": "new", "text": "some words of a new document"}\n')
    reason = "cannot read it: Input/output error"
    if command == "add":
        result = _run(runner, "add", store_path, _EIO, good, "--jsonl", "--json")
        failed, summary = _jsonl(result.stdout)
        assert summary["summary"]["added"] == 1 and summary["summary"]["failed"] == 1
    elif command == "query --jsonl":
        result = _run(runner, "query", store_path, "--jsonl", _EIO, "--json")
        [failed] = _jsonl(result.stdout)
    else:
        args = {
            "query --exact": ["query", store_path, "--text", "some words", "--exact", _EIO],
            "remove": ["remove", store_path, "--from-file", _EIO],
            "dedup": _dedup_args(_EIO, tmp_path),
        }[command]
        result = _run(runner, *args)
        assert result.exit_code == 2, result.output
        assert result.stderr.splitlines() == [
            f"Error: {_EIO}: {reason}"
            if command != "dedup"
            else f"Error: input='{_EIO}' is not valid: expected a file that can be read (it "
            "gives: Input/output error)"
        ]
        assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.ndx", "g.jsonl"]
        with Store.open(store_path, read_only=True) as opened:
            assert len(opened) == 5
        return
    assert result.exit_code == 1, result.output
    assert failed == {
        "failed": {"source": str(_EIO), "file": str(_EIO), "line": None, "key": None,
                   "error": "OSError", "message": reason}
    }  # fmt: skip


def test_dedup_input_that_fails_part_way_is_one_error_line_then_resumes(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An input that fails after some batches committed: one Error: line naming it that
    says what stands, exit 2, and the same command then finishes the job (review 45)."""
    archive = tmp_path / "a.jsonl"
    with archive.open("w") as out:
        for i in range(6):
            words = " ".join(f"w{i}x{j}" for j in range(20))
            out.write(json.dumps({"id": f"d{i}", "text": words}) + "\n")
    monkeypatch.setattr(ingest, "_read_lines", read_error_at_call(ingest._read_lines, 2))
    args = [*_dedup_args(archive, tmp_path), "--batch-size", 2]
    failed = _run(runner, *args)
    assert failed.exit_code == 2 and "Traceback" not in failed.output
    assert failed.stderr.splitlines() == [
        f"Error: {archive.resolve()}: Input/output error",
        "nothing of the batch being read was committed, any batches before it were: once "
        "the input can be read, run the same command again to resume after them",
    ]
    monkeypatch.undo()
    again = _run(runner, *args, "--json")
    assert again.exit_code == 0, again.output
    summary = _jsonl(again.stdout)[-1]["summary"]
    assert summary["resumed_from_line"] == 2 and summary["kept"] == 6


@pytest.mark.parametrize("denied", ["in/sub", "in"])
def test_add_reports_a_directory_it_cannot_list_and_exits_1(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, denied: str
) -> None:
    """A directory add could not list (mode 000) was skipped without a word: "failed 0",
    exit 0 (review 45). Listing is refused through os.scandir, so that the test holds as
    root too, whom a mode does not stop."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "b.txt").write_text("a document in a readable place, with some words")
    (tmp_path / "in" / "sub" / "a.txt").write_text("a document in a directory no one can list")
    store = tmp_path / "s.ndx"
    assert _run(runner, "init", store).exit_code == 0
    scandir, locked = os.scandir, tmp_path / denied

    def refusing(path: Any = ".") -> Any:
        if Path(os.fsdecode(path)) == locked:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fsdecode(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    result = _run(runner, "add", store, tmp_path / "in", "--json")
    monkeypatch.undo()
    assert result.exit_code == 1, result.output
    failed, summary = _jsonl(result.stdout)
    assert failed == {
        "failed": {"source": str(locked), "file": str(locked), "line": None, "key": None,
                   "error": "PermissionError", "message": "cannot read it: Permission denied"}
    }  # fmt: skip
    assert summary["summary"]["added"] == (1 if denied == "in/sub" else 0)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs named pipes")
def test_add_reports_a_named_pipe_met_in_a_directory_and_reads_one_named_alone(
    tmp_path: Path,
) -> None:
    """add of a directory holding a named pipe waited in open() for a writer for ever,
    the store open for writing (review 45). A pipe named on its own is still read."""
    store = tmp_path / "s.ndx"
    Store.open(store, create=True).close()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("an ordinary document with a few words in it\n")
    pipe = tmp_path / "in" / "pipe"
    os.mkfifo(pipe)
    walked = _admin("add", store, tmp_path / "in", "--json", stdout=subprocess.PIPE, timeout=60)
    assert walked.returncode == 1, walked.stderr
    failed, summary = _jsonl(walked.stdout)
    assert failed["failed"]["file"] == str(pipe) and failed["failed"]["message"].startswith(
        "a named pipe, not a regular file: a directory's walk reads regular files only"
    )
    assert summary["summary"]["added"] == 1 and summary["summary"]["failed"] == 1

    def write_the_pipe() -> None:
        with pipe.open("w") as writer:
            writer.write("a document written into the pipe by another process\n")

    writer = threading.Thread(target=write_the_pipe, daemon=True)
    writer.start()
    named = _admin("add", store, pipe, "--json", stdout=subprocess.PIPE, timeout=60)
    writer.join(timeout=60)
    assert named.returncode == 0, named.stderr
    assert _jsonl(named.stdout)[-1]["summary"]["added"] == 1


def _changing(command: str, store: Path, tmp_path: Path) -> tuple[list[object], str, Path, int]:
    """``command`` run on ``store`` (the five-document corpus): its arguments, what its
    Error: line must say stands, and the store that holds the change with its size."""
    if command == "init":
        new = tmp_path / "new.ndx"
        return ["init", new], f"the store was created at {new}", new, 0
    if command == "remove":
        done = "the store was changed: 1 of 1 documents removed"
        return ["remove", store, "storm-a"], done, store, 4
    if command == "import":
        with Store.open(store, read_only=True) as opened:
            opened.export_file(tmp_path / "ex.bin")
        copy = tmp_path / "copy.ndx"
        done = f"the store was changed: 5 documents imported into new store {copy}"
        return ["import", tmp_path / "ex.bin", copy], done, copy, 5
    if command == "add":
        archive = tmp_path / "a.jsonl"
        archive.write_text('{"id": "new", "text": "a new document with some words"}\n')
        done = "the documents were added (1 added, 0 replaced, 0 skipped, 0 failed)"
        return ["add", store, archive, "--jsonl"], done, store, 6
    if command == "purge":
        with Store.open(store) as opened:
            opened.remove("storm-a")
        return ["purge", store], "the band entries of 1 removed documents were purged", store, 4
    if command == "rebuild":
        done = "the store was rebuilt (5 documents re-banded)"
        return ["rebuild", store, "--threshold", 0.9], done, store, 5
    if command == "backup":
        backup = tmp_path / "b.ndx"
        return ["backup", store, backup], f"the backup was written to {backup}", backup, 5
    assert command == "compact"
    return ["compact", store], "the store was compacted (", store, 5


@_needs_dev_full
@pytest.mark.parametrize(
    "command", ["init", "remove", "import", "add", "purge", "rebuild", "backup", "compact"]
)
def test_a_summary_lost_after_the_store_changed_says_what_stands(
    store_path: Path, tmp_path: Path, command: str
) -> None:
    """With stdout on a full disk, these said only "Error: stdout: No space left on
    device" with exit 2, the code of input refused with nothing changed: a rerun of init
    or remove was then refused (review 45). add --report already said what stood."""
    args, done, changed, documents = _changing(command, store_path, tmp_path)
    with _FULL.open("wb") as full:
        result = _admin(*args, stdout=full, env=_stdout_env(buffered=True))
    assert result.returncode == 2, result.stderr
    error, note = result.stderr.splitlines()
    assert error == "Error: stdout: No space left on device"
    assert note.startswith(done) and note.endswith("; only this summary was not written")
    with Store.open(changed, read_only=True) as opened:
        assert len(opened) == documents


@pytest.mark.parametrize(
    ("args", "advice"),
    [
        (["params", "--threshold", "1"], None),
        (["params", "--threshold", "0"], None),
        (["params", "--threshold", "nan"], None),
        (["demo", "--threshold", "1"], None),
        (["init", "{tmp}/new.ndx", "--threshold", "1"],
         "a threshold of 1 needs the banding given instead: --bands B --rows R"),
        (["rebuild", "{store}", "--threshold", "1"], "a threshold of 1 needs the banding given "
         "instead: neardup-admin rebuild STORE --bands B --rows R"),
        (["dedup", "{tmp}/a.jsonl", "--store", "{tmp}/d.ndx", "--keep", "{tmp}/k",
          "--dropped", "{tmp}/x", "--threshold", "1"], "for a threshold of 1, make the store "
         "first with its banding given (neardup-admin init STORE --bands B --rows R), then "
         "run dedup into it"),
    ],
)  # fmt: skip
def test_a_threshold_no_banding_fits_is_advised_as_the_command_can_follow(
    runner: CliRunner, store_path: Path, tmp_path: Path, args: list[str], advice: str | None
) -> None:
    """Every command said "(a threshold of 1 needs bands and rows given (init --bands
    --rows))": to rebuild, whose store init refuses; to params and demo, which take no
    banding; and for 0, 1.5 or nan, which are no threshold of 1 (review 45)."""
    (tmp_path / "a.jsonl").write_text('{"id": "a", "text": "a document of a few words"}\n')
    names = {"tmp": tmp_path, "store": store_path}
    result = _run(runner, *(part.format(**names) for part in args))
    assert result.exit_code == 2
    [line] = result.output.splitlines()
    assert line.startswith("Error: threshold=") and "init --bands --rows" not in line
    if advice is None:
        assert "threshold of 1" not in line
    else:
        assert line.endswith(f"({advice})")
    assert not (tmp_path / "new.ndx").exists() and not (tmp_path / "d.ndx").exists()


@pytest.mark.parametrize("docs", [2, 3, 100])
def test_demo_makes_exactly_the_documents_asked_for(runner: CliRunner, docs: int) -> None:
    """--docs 2 made 4 documents and --docs 100 made 102: the last planted group's
    copies went past the count (review 45)."""
    result = runner.invoke(cli, ["demo", "--docs", str(docs), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output.splitlines()[-1])["summary"]["documents"] == docs
    for groups in (0, 1, 40, 1000):
        corpus = make_corpus(docs, groups, seed=docs)
        assert len(corpus.documents) == docs
        assert all(len(g) >= 2 and set(g) <= corpus.documents.keys() for g in corpus.planted)


def test_dedup_takes_the_encoding_its_failure_advises(runner: CliRunner, tmp_path: Path) -> None:
    """A Latin-1 line failed with "pass the right encoding", and dedup had no --encoding
    (review 53). It has now: the line is read, the outputs are UTF-8, and a rerun with
    another encoding is refused as another job."""
    source = tmp_path / "latin.jsonl"
    source.write_bytes('{"id": "L", "text": "café au lait with some words"}\n'.encode("latin-1"))
    args = ["dedup", source, "--store", tmp_path / "s.ndx", "--dropped", tmp_path / "d.jsonl"]
    failed = _run(runner, *args, "--keep", tmp_path / "k0.jsonl", "--json")
    assert failed.exit_code == 1
    assert _jsonl(failed.output)[0]["failed"]["message"] == (
        "not valid utf-8 at byte 24 (invalid continuation byte); pass the right encoding"
    )
    keep = tmp_path / "k.jsonl"
    read = _run(runner, *args, "--keep", keep, "--encoding", "latin-1", "--json")
    assert read.exit_code == 0, read.output
    assert _jsonl(read.output)[-1]["summary"]["kept"] == 1
    assert keep.read_bytes() == '{"id": "L", "text": "café au lait with some words"}\n'.encode()
    other = _run(runner, *args, "--keep", keep)
    assert other.exit_code == 2 and "differs in encoding" in other.output
    unusable = _run(runner, *args, "--keep", tmp_path / "k2.jsonl", "--encoding", "utf-16")
    assert unusable.exit_code == 2 and "byte 0x0a" in unusable.output
    assert not (tmp_path / "k2.jsonl").exists()


def test_dedup_refuses_an_encoding_that_reads_a_newline_from_other_bytes(
    runner: CliRunner, tmp_path: Path
) -> None:
    """With --encoding utf-7, `+AAo-` between a line's JSON tokens is a newline: the kept
    record was written as two lines, neither of them JSON (review 54). Exit 2 before any
    work, saying what encoding dedup needs."""
    source = tmp_path / "in7.jsonl"
    source.write_bytes(b'{"id":"a",+AAo-"text":"first document about apples and pears"}\n')
    keep, store = tmp_path / "k.jsonl", tmp_path / "s.ndx"
    args = ["dedup", source, "--store", store, "--keep", keep, "--dropped", tmp_path / "d.jsonl"]
    result = _run(runner, *args, "--encoding", "utf-7")
    assert result.exit_code == 2
    assert result.output == (
        "Error: encoding='utf-7' is not valid: expected for JSON lines, which are read line by "
        "line, one that writes a newline as the byte 0x0a alone and reads ASCII as ASCII "
        "(utf-8, latin-1, cp1252...); convert the file to UTF-8 first\n"
    )
    assert not keep.exists() and not store.exists()


def test_rebuild_too_wide_for_the_signatures_advises_only_the_banding(
    runner: CliRunner, store_path: Path
) -> None:
    """It advised "or more num_perm", which rebuild has no option for (review 53)."""
    with Store.open(store_path) as store:
        num_perm = store.config.num_perm
    result = _run(runner, "rebuild", store_path, "--bands", num_perm, "--rows", 2)
    assert result.exit_code == 2
    assert result.output == (
        f"Error: bands*rows='{num_perm}*2={2 * num_perm}' is not valid: expected at most the "
        f"store's num_perm={num_perm} (fixed when its signatures were made); use fewer bands "
        "or rows\n"
    )
