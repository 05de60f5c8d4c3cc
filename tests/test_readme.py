"""The README's option tables against the CLI's own options, so neither can drift from the other."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer

from mlxswitch.cli.app import app

README = Path(__file__).resolve().parent.parent / "README.md"
# Commands whose options the README documents in a table; a command with options but no table
# fails below, so a new command gets one.
DOCUMENTED = ("chat", "serve", "bench", "calibrate", "gears build")
_NAME = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def _commands(group=None, prefix: str = "") -> dict:
    """Every command by its full name under `mlxswitch`, subcommands included ("gears build")."""
    found = {}
    for name, command in (group or typer.main.get_command(app)).commands.items():
        if hasattr(command, "commands"):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[f"{prefix}{name}"] = command
    return found


def _accepted(command) -> tuple[set[str], set[str]]:
    """(names that must be documented, every name the command accepts) of its options."""
    options = [p for p in command.params if p.param_type_name == "option"]
    primary = {name for p in options for name in p.opts}
    return primary, primary | {name for p in options for name in p.secondary_opts}


def _table(name: str) -> list[str]:
    """The first cells of the rows of `### Options of `mlxswitch NAME``."""
    text = README.read_text(encoding="utf-8")
    heading = re.search(rf"^### Options of `mlxswitch {name}`\n", text, re.MULTILINE)
    assert heading, f"README.md has no '### Options of `mlxswitch {name}`' table"
    cells = []
    for line in text[heading.end() :].splitlines():
        if line.startswith("#"):
            break
        if line.startswith("| `") or line.startswith("| -"):
            cells.append(line.split(" | ")[0])
    assert cells, f"the table of mlxswitch {name} has no option rows"
    return cells


def _documented(name: str) -> set[str]:
    return {option for cell in _table(name) for option in _NAME.findall(cell)}


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_option_is_in_the_readme_table(name):
    needed, _ = _accepted(_commands()[name])
    missing = sorted(needed - _documented(name))
    assert not missing, f"mlxswitch {name}: options missing from README.md's table: {missing}"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_option_in_the_readme_table_exists(name):
    _, accepted = _accepted(_commands()[name])
    unknown = sorted(_documented(name) - accepted)
    assert not unknown, f"README.md's table of mlxswitch {name} names options it lacks: {unknown}"


def test_every_command_with_options_has_a_table():
    with_options = {
        name
        for name, command in _commands().items()
        if any(p.param_type_name == "option" for p in getattr(command, "params", []))
    }
    assert with_options <= set(DOCUMENTED), sorted(with_options - set(DOCUMENTED))


def test_the_headline_is_what_bench_headline_writes_from_its_report():
    import importlib.util

    spec = importlib.util.spec_from_file_location("headline", README.parent / "bench" / "headline.py")
    assert spec is not None and spec.loader is not None
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    found = headline.written(README.read_text(encoding="utf-8"))
    assert found, "README.md has no <!-- headline: REPORT --> … <!-- /headline --> section"
    report, section = found
    assert section == headline.render(report), "run: uv run python bench/headline.py --write"
