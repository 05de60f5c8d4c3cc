"""`mlxswitch chat`: a terminal chat, prompts piped through stdin, or one --prompt."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from . import options as o
from . import ui
from .engine_options import EngineOptions, resolve, takes_engine_options


@takes_engine_options
def chat(
    prompt: Annotated[
        str | None,
        typer.Option("--prompt", "-p", help="Answer this one prompt and exit (as mlx_lm.generate)."),
    ] = None,
    max_tokens: o.MaxTokensOpt = 512,
    json_output: o.JsonLinesOpt = False,
    color: Annotated[
        bool | None,
        typer.Option("--color/--no-color", help="Colour tokens by tier (default: only on a terminal)."),
    ] = None,
    shade: Annotated[bool, typer.Option(help="Shade tokens by entropy (bold = unsure).")] = False,
    telemetry: Annotated[
        Path | None, typer.Option(help="Write per-token records as JSON Lines to FILE.")
    ] = None,
    whole: Annotated[bool, typer.Option(help="Piped: all of stdin is one prompt.")] = False,
    keep_history: Annotated[bool, typer.Option(help="Piped: the lines are one conversation.")] = False,
    *,
    engine: EngineOptions,
) -> None:
    """Chat on a terminal, answer prompts piped through stdin, or answer one --prompt."""
    from ..api import default_note, open_chat
    from .chat import ChatRunner
    from .streams import TelemetryFile, peek_prompts

    # Every flag is checked before anything is read or loaded: a flag error wins.
    if prompt is not None and not prompt.strip():
        from ..errors import UsageError

        # Not a cue to chat instead: a script passing an empty variable gets an error, not a banner.
        raise UsageError("--prompt is empty: give it the text to answer (or leave it out to read stdin)")
    chosen, settings = resolve(engine, max_tokens)
    sink = TelemetryFile.open(telemetry)  # refuses an unwritable path now, not after loading
    with sink:
        if prompt is not None:
            prompts = peek_prompts([prompt])
        elif sys.stdin.isatty() and not json_output:
            prompts = None  # interactive
        else:
            if sys.stdin.isatty():
                ui.print_dim(
                    ui.make_console(stderr=True),
                    "reading prompts from the terminal, one per line; Ctrl-D ends",
                )
            prompts = peek_prompts(sys.stdin.buffer, whole=whole)
            if prompts is None:
                raise typer.Exit(0)  # nothing asked, nothing loaded
        note = default_note(chosen) if engine.profile is None else ""
        if note:
            ui.print_warning(note)  # the default fell back (the pair is not here): how to get it
        with ui.loading_status(ui.stderr_is_terminal()) as progress:
            session = open_chat(
                chosen,
                settings=settings,
                system=engine.system,
                progress=progress,
                force_memory=engine.force_memory,
                require_resident=engine.require_resident,
                measure_signals=shade,  # shading reads every token's entropy, routed or not
            )
        runner = ChatRunner(session, json_output=json_output, color=color, shade=shade, telemetry=sink)
        code = runner.interactive() if prompts is None else runner.piped(prompts, keep_history)
    raise typer.Exit(code)
