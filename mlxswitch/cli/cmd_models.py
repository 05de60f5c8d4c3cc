"""`mlxswitch models`, `mlxswitch doctor` and `mlxswitch gears build`: the models on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import ui
from .ui_tables import literal


def models() -> None:
    """List the profiles of models.toml and whether their models are on this machine."""
    from ..checks import profile_rows

    rows = [{key: literal(value) for key, value in row.items()} for row in profile_rows()]
    ui.make_console().print(ui.profiles_table(rows))


def doctor() -> None:
    """Check MLX, the backends, the models.toml files, the kernels, the default profile and the key."""
    from ..checks import doctor_report

    report = doctor_report()
    console = ui.make_console()
    for title, rows in report.sections:
        console.print(ui.key_value_table(literal(title), literal(rows)))
        console.print()
    console.print(literal(report.verdict()), soft_wrap=True)
    raise typer.Exit(0 if report.ok else 1)


def gears_build(
    source: Annotated[str, typer.Argument(help="HF repo id, mlx-lm directory or .gguf file.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the nested-gear model to.")],
    planes: Annotated[
        str | None, typer.Option(help="Plane bit-widths, e.g. 4,4,8 (default: honest for the source).")
    ] = None,
    group_size: Annotated[int, typer.Option(help="Quantization group size: 32, 64 or 128.")] = 64,
    force: Annotated[bool, typer.Option(help="Replace a non-empty --out directory.")] = False,
) -> None:
    """Turn a model into a nested-gear model saved as safetensors plus config."""
    from ..api import build_gears

    console = ui.make_console()
    for line in build_gears(source, out, planes=planes, group_size=group_size, force=force):
        console.print(literal(line))
