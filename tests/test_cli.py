"""The neardup-admin command line: help, version, demo, error handling."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from neardup_store import __version__
from neardup_store.cli import cli


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
    result = runner.invoke(cli, ["demo"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "bands x" in lines[0] and "threshold=0.7" in lines[0]
    summary = lines[-1]
    assert summary.endswith("planted groups found exactly.")
    found, planted = (
        int(summary.split(" of ")[0].split("; ")[1]),
        int(summary.split(" of ")[1].split()[0]),
    )
    assert planted == 40 and found >= 34


def test_demo_json_lines(runner: CliRunner) -> None:
    result = runner.invoke(cli, ["demo", "--docs", "120", "--groups", "10", "--json"])
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.output.splitlines()]
    groups, summary = records[:-1], records[-1]["summary"]
    assert summary["planted_groups"] == 10 and summary["groups_found"] == len(groups)
    assert all(len(g["keys"]) >= 2 and g["similarities"][0] == 1.0 for g in groups)
    assert summary["config"]["num_perm"] == 128


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
