"""The linters configured in pyproject.toml run with the tests: ruff (check and format) and mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PATHS = ["mlxswitch", "tests", "bench", "docs"]


def _run(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"{' '.join(args[:3])} failed:\n{done.stdout}{done.stderr}"


@pytest.mark.parametrize(
    "command",
    [["check", "--no-cache", *PATHS], ["format", "--check", "--no-cache", *PATHS]],
    ids=["check", "format"],
)
def test_ruff(command):
    _run("ruff", *command)


def test_mypy(tmp_path):
    # The files and settings come from pyproject.toml; the cache stays out of the repository.
    _run("mypy", "--cache-dir", str(tmp_path / "mypy"))
