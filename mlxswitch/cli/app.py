"""The `mlxswitch` Typer app: `main`, `--version` and the error mapping; the commands are in cmd_*.py.

Every failure leaves as one `error:` line on stderr and the exit code of its class
(errors.py); Typer's own usage errors too, and an unexpected exception becomes one
`error: internal error` line with the path of a log holding its traceback.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from .. import __version__
from ..errors import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, MlxSwitchError, one_line
from . import cmd_bench, cmd_chat, cmd_models, cmd_serve, ui
from .streams import silence_stdout, write_crash_log

# transformers warns on stderr about long prompts; our own checks say what matters, in one line.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _usage_problem(exc: Exception) -> bool:
    # Typer's parser errors (its vendored click's UsageError, BadParameter, …) carry an exit code
    # and a formatted message; typer exports none of their base classes.
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


def _no_value(ctx) -> None:
    return None


class _FlagsTakeNoValue:
    """Help that shows no value after a flag: Typer's Rich help gives `--version <bool>`, as if
    the flag took one (its plain help already leaves flags bare)."""

    def get_params(self, ctx):
        params = super().get_params(ctx)  # the click Command beside this mixin
        for param in params:
            if getattr(param, "is_flag", False) or getattr(param, "count", False):
                param.display_type_rich = _no_value
        return params


class _Command(_FlagsTakeNoValue, TyperCommand):
    """A command whose help shows its flags bare."""


class _Group(_FlagsTakeNoValue, TyperGroup):
    """A group (`gears`) whose help shows its flags bare."""


def _mlx_import_problem(exc: BaseException) -> str | None:
    """What to do when MLX itself cannot be imported (None: `exc` is something else).

    `uv sync --all-extras` installs mlx[cuda]; without an NVIDIA driver importing mlx.core fails
    with `libcuda.so.1: cannot open shared object file`, in whichever command first needs MLX.
    """
    if not isinstance(exc, ImportError):
        return None
    text = str(exc)
    # A shared library that fails to load names no module; its path is mlx's extension module.
    from_mlx = (exc.name or "").split(".")[0] == "mlx" or "mlx" in Path(exc.path or "").parts
    if any(lib in text for lib in ("libcuda", "libcudart", "libcublas", "libcudnn", "libnvrtc")):
        return (
            f"MLX's CUDA backend cannot load ({one_line(text, 120)}): the cuda extra needs an "
            "NVIDIA GPU and its driver; without them reinstall without that extra: uv sync "
            "(not --all-extras; --extra NAME for the others you want), "
            "or pip uninstall mlx-cuda-12 && pip install 'mlx[cpu]'"
        )
    if from_mlx or "libmlx" in text:
        return (
            f"MLX cannot be imported ({one_line(text, 120)}): reinstall it: uv sync --reinstall-package "
            "mlx (or pip install --force-reinstall 'mlx[cpu]' on Linux, 'mlx' on macOS)"
        )
    return None


class _OneLineErrors(_FlagsTakeNoValue, TyperGroup):
    """Runs a command and turns whatever escapes it into one `error:` line and an exit code."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except MlxSwitchError as exc:
            ui.print_error(str(exc))
            code = exc.exit_code
        except (typer.Abort, KeyboardInterrupt):
            ui.print_warning("interrupted")
            code = EXIT_INTERRUPTED
        except Exception as exc:
            ctx = getattr(exc, "ctx", None)
            if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
                typer.echo(ctx.get_help())
                code = 0
            elif _usage_problem(exc):
                where = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
                ui.print_error(exc.format_message() + where)
                code = exc.exit_code
            elif (problem := _mlx_import_problem(exc)) is not None:
                ui.print_error(problem)
                code = MlxSwitchError.exit_code
            else:  # the last resort: one line, the traceback in a log
                ui.print_error(
                    f"internal error: {type(exc).__name__}: {exc} (traceback in {write_crash_log(exc)})"
                )
                code = EXIT_INTERNAL
        if not standalone_mode:
            return code
        sys.exit(code or 0)

    def invoke(self, ctx):
        # Here, before Typer's own handler turns a closed pipe into a plain exit 1.
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            silence_stdout()  # the reader left: no more output, no complaint (as `yes | head`)
            raise typer.Exit(EXIT_BROKEN_PIPE) from None


app = typer.Typer(
    cls=_OneLineErrors,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Entropy-routed decoding on MLX: a cheap tier by default, a stronger one where it is unsure.",
)
gears_app = typer.Typer(
    cls=_Group, no_args_is_help=True, help="Build nested-gear models (one footprint, every precision)."
)
app.add_typer(gears_app, name="gears")


def main() -> None:
    """Console-script entry point. Once the command has finished, its output flushed and its
    threads joined, the process ends without Python's teardown (os._exit): freeing a loaded pair's
    ~2 GB of arrays and the thousand modules mlx-lm and transformers import took ~0.2 s of a
    one-prompt `chat -p` (git show 824b46b:bench/results/cold-start-pair.txt), after the answer was out."""
    try:
        app()
        code: int | str | None = 0
    except SystemExit as done:
        code = done.code
    if not isinstance(code, int):  # sys.exit's other forms, as the interpreter reads them
        if code is not None:
            print(code, file=sys.stderr)
        code = 0 if code is None else 1
    os._exit(finish_process(code))


def finish_process(code: int) -> int:
    """What the interpreter's exit would have done that anyone can notice: threads still running
    joined, logging and the standard streams flushed (a reader that left: quietly); the code to
    exit with."""
    import logging
    import threading

    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BrokenPipeError:
            if stream is sys.stdout:
                silence_stdout()
                code = code or EXIT_BROKEN_PIPE
        except (OSError, ValueError, AttributeError):  # closed, or not a real stream
            pass
    return code


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"mlxswitch {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Entropy-routed decoding on MLX: a cheap tier by default, a stronger one where it is unsure."""


# The commands live in cmd_*.py; registered here, in the order `--help` lists them.
app.command(cls=_Command)(cmd_chat.chat)
app.command(cls=_Command)(cmd_serve.serve)
app.command(cls=_Command)(cmd_models.models)
app.command(cls=_Command)(cmd_models.doctor)
gears_app.command("build", cls=_Command)(cmd_models.gears_build)
app.command(cls=_Command)(cmd_bench.bench)
app.command(cls=_Command)(cmd_bench.calibrate)
