"""scripts/check-arm64.sh, without building its arm64 root (far too slow for a test): it is
valid bash, shellcheck-clean where shellcheck is installed, and a bad option is one line
and exit 2, before it touches anything."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.helpers import REPO

SCRIPT = REPO / "scripts" / "check-arm64.sh"
USAGE = "(usage: bash scripts/check-arm64.sh [--dir DIR] [--out FILE] [--reuse-venvs])"


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30, cwd=REPO
    )


def test_the_script_is_valid_bash() -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_the_script_is_shellcheck_clean() -> None:
    result = subprocess.run(["shellcheck", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--bogus"], "unknown option '--bogus'"),
        (["--dir"], "--dir needs a path"),
        (["--out", "x.json", "--out"], "--out needs a path"),
    ],
)
def test_a_bad_option_is_one_line_and_exit_2(args: list[str], said: str) -> None:
    result = _script(*args)
    assert result.returncode == 2
    assert result.stderr == f"check-arm64: {said} {USAGE}\n"
    assert result.stdout == ""


def test_help_says_how_to_run_it() -> None:
    result = _script("--help")
    assert result.returncode == 0, result.stderr
    assert "bash scripts/check-arm64.sh [--dir DIR] [--out FILE] [--reuse-venvs]" in result.stdout
    assert "not device times" in result.stdout
