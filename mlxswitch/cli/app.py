"""The `mlxswitch` command: thin wrappers over the library; Rich lives in ui.py."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from . import ui
from ..errors import MlxSwitchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Entropy-routed decoding on MLX: a cheap tier by default, a stronger one where it is unsure.")
gears_app = typer.Typer(no_args_is_help=True, help="Build nested-gear models (one footprint, every precision).")
app.add_typer(gears_app, name="gears")

def main() -> None:
    """Console-script entry point: run the app, turning our errors into one line and an exit code."""
    try:
        app()
    except MlxSwitchError as exc:
        ui.print_error(str(exc))
        sys.exit(exc.exit_code)


def _fail(exc: MlxSwitchError) -> typer.Exit:
    ui.print_error(str(exc))
    return typer.Exit(exc.exit_code)


@app.command()
def chat(
    profile: Annotated[Optional[str], typer.Option("--profile", "-p", help="Profile from models.toml (default: its default).")] = None,
    small: Annotated[Optional[str], typer.Option(help="Ad-hoc pair: the cheap model (with --large).")] = None,
    large: Annotated[Optional[str], typer.Option(help="Ad-hoc pair: the strong model (with --small).")] = None,
    model: Annotated[Optional[str], typer.Option(help="Ad-hoc single model, or the geared model with --gears.")] = None,
    gears: Annotated[Optional[str], typer.Option(help="Gear bits low→high for --model, e.g. 4,8,16.")] = None,
    tau: Annotated[Optional[str], typer.Option(help="Up thresholds in bits, one per rung boundary (inf/-inf allowed).")] = None,
    tau_down: Annotated[Optional[str], typer.Option(help="Down thresholds (≤ up): the hysteresis band.")] = None,
    window: Annotated[Optional[int], typer.Option(help="Rolling-mean window in tokens.")] = None,
    min_run: Annotated[Optional[int], typer.Option(help="Tokens a tier makes before the router may move.")] = None,
    normalize: Annotated[Optional[bool], typer.Option("--normalize/--no-normalize", help="Compare entropy / log2(vocab) instead of bits.")] = None,
    max_tokens: Annotated[int, typer.Option(help="Most tokens per answer.")] = 512,
    temp: Annotated[float, typer.Option(help="Sampling temperature (0 = greedy).")] = 0.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling mass.")] = 1.0,
    top_k: Annotated[int, typer.Option(help="Sample among the k likeliest (0 = all).")] = 0,
    min_p: Annotated[float, typer.Option(help="Drop tokens below min_p × the top probability.")] = 0.0,
    seed: Annotated[Optional[int], typer.Option(help="Random seed for sampling.")] = None,
    system: Annotated[Optional[str], typer.Option(help="System prompt.")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop string (repeatable).")] = None,
    json_output: Annotated[bool, typer.Option("--json", help="One JSON object per answer on stdout (JSON Lines).")] = False,
    color: Annotated[Optional[bool], typer.Option("--color/--no-color", help="Colour tokens by tier (default: only on a terminal).")] = None,
    shade: Annotated[bool, typer.Option(help="Shade tokens by entropy (bold = unsure).")] = False,
    telemetry: Annotated[Optional[Path], typer.Option(help="Write per-token records as JSON Lines to FILE.")] = None,
    whole: Annotated[bool, typer.Option(help="Piped: all of stdin is one prompt.")] = False,
    keep_history: Annotated[bool, typer.Option(help="Piped: the lines are one conversation.")] = False,
    force_memory: Annotated[bool, typer.Option(help="Load even if the memory estimate says it will not fit.")] = False,
) -> None:
    """Chat on a terminal, or answer prompts piped through stdin."""
    from ..api import open_chat, resolve_profile
    from ..decoding.session import GenerationSettings

    try:
        chosen = resolve_profile(profile, small=small, large=large, model=model, gears=gears,
                                 tau=tau, tau_down=tau_down, window=window, min_run=min_run,
                                 normalize=normalize)
        settings = GenerationSettings(max_tokens=max_tokens, temperature=temp, top_p=top_p,
                                      top_k=top_k, min_p=min_p, seed=seed, stop=tuple(stop or ()))
        interactive = sys.stdin.isatty() and not json_output
        prompts = None if interactive else _read_prompts(whole)
        if prompts == []:
            raise typer.Exit(0)  # nothing asked, nothing loaded
        with ui.loading_status(ui.stderr_is_terminal()) as progress:
            session = open_chat(chosen, settings=settings, system=system, progress=progress,
                                force_memory=force_memory)
    except MlxSwitchError as exc:
        raise _fail(exc)
    from .chat import ChatRunner

    runner = ChatRunner(session, json_output=json_output, color=color, shade=shade,
                        telemetry=telemetry)
    code = runner.interactive() if prompts is None else runner.piped(prompts, keep_history)
    raise typer.Exit(code)


def _read_prompts(whole: bool) -> list[str]:
    text = sys.stdin.read()
    if whole:
        return [text.strip()] if text.strip() else []
    return [line.strip() for line in text.splitlines() if line.strip()]


@app.command()
def models() -> None:
    """List the profiles of models.toml and whether their models are on this machine."""
    from ..checks import profile_rows

    try:
        rows = profile_rows()
    except MlxSwitchError as exc:
        raise _fail(exc)
    ui.make_console().print(ui.profiles_table(rows))


@app.command()
def doctor() -> None:
    """Check MLX, the backends, the kernels, the embedded model and the Anthropic key."""
    from ..checks import doctor_report

    try:
        report = doctor_report()
    except MlxSwitchError as exc:
        raise _fail(exc)
    console = ui.make_console()
    for title, rows in report.sections:
        console.print(ui.key_value_table(title, rows))
        console.print()
    console.print(report.verdict(), soft_wrap=True)
    raise typer.Exit(0 if report.ok else 1)


@gears_app.command("build")
def gears_build(
    source: Annotated[str, typer.Argument(help="HF repo id, mlx-lm directory or .gguf file.")],
    out: Annotated[Path, typer.Option("--out", help="Directory to write the nested-gear model to.")],
    planes: Annotated[Optional[str], typer.Option(help="Plane bit-widths, e.g. 4,4,8 (default: honest for the source).")] = None,
    group_size: Annotated[int, typer.Option(help="Quantization group size.")] = 64,
) -> None:
    """Turn a model into a nested-gear model saved as safetensors plus config."""
    from ..api import build_gears, parse_int_list

    try:
        plane_bits = parse_int_list(planes, "--planes") if planes else None
        report = build_gears(source, out, plane_bits=plane_bits, group_size=group_size)
    except MlxSwitchError as exc:
        raise _fail(exc)
    console = ui.make_console()
    for line in report:
        console.print(line)
