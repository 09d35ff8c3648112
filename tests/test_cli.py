"""The console command."""

from __future__ import annotations

import subprocess


def test_help_lists_the_commands():
    out = subprocess.run(["pgmedallion", "--help"], capture_output=True, text=True, check=True)
    for command in (
        "demo",
        "doctor",
        "capture",
        "run",
        "verify",
        "status",
        "sql",
        "sdp",
        "postgres",
    ):
        assert command in out.stdout


def test_malformed_config_exits_2_with_the_key(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[source]\nport = 'x'\n")
    proc = subprocess.run(
        ["pgmedallion", "-c", str(bad), "postgres", "status"], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert "[source] port must be an integer" in proc.stderr
