"""What the CLI tests share: invoking `mlxswitch` in-process, and the one `error:` line every
failure must give (conftest.py holds `pair_args`)."""

from __future__ import annotations

from typer.testing import CliRunner

from mlxswitch.cli import app

runner = CliRunner()


def invoke(args, stdin: str | bytes = ""):
    """Run `mlxswitch ARGS` with `stdin`; the click Result."""
    return runner.invoke(app, args, input=stdin)


def one_error_line(result) -> str:
    """The failure's one `error:` line on stderr (and no traceback anywhere)."""
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("error:")]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout
    return errors[0]
