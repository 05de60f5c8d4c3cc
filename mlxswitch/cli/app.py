"""The `mlxswitch` command: thin Typer wrappers over the library; Rich lives in ui.py and ui_tables.py.

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
from typer.core import TyperGroup

from .. import __version__
from ..errors import EXIT_BROKEN_PIPE, EXIT_INTERNAL, EXIT_INTERRUPTED, MlxSwitchError
from . import options as o
from . import ui, ui_tables
from .streams import silence_stdout, write_crash_log

# transformers warns on stderr about long prompts; our own checks say what matters, in one line.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _usage_problem(exc: Exception) -> bool:
    # Typer's parser errors (its vendored click's UsageError, BadParameter, …) carry an exit code
    # and a formatted message; typer exports none of their base classes.
    return callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)


class _OneLineErrors(TyperGroup):
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
    no_args_is_help=True, help="Build nested-gear models (one footprint, every precision)."
)
app.add_typer(gears_app, name="gears")


def main() -> None:
    """Console-script entry point."""
    app()


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


@app.command()
def chat(
    prompt: Annotated[
        str | None,
        typer.Option("--prompt", "-p", help="Answer this one prompt and exit (as mlx_lm.generate)."),
    ] = None,
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    draft_model: o.DraftModelOpt = None,
    gears: o.GearsOpt = None,
    tau: o.TauOpt = None,
    tau_down: o.TauDownOpt = None,
    window: o.WindowOpt = None,
    min_run: o.MinRunOpt = None,
    normalize: o.NormalizeOpt = None,
    policy: o.PolicyOpt = None,
    signal: o.SignalOpt = None,
    verify: o.VerifyOpt = None,
    max_tokens: o.MaxTokensOpt = 512,
    temp: o.TempOpt = 0.0,
    top_p: o.TopPOpt = 1.0,
    top_k: o.TopKOpt = 0,
    min_p: o.MinPOpt = 0.0,
    seed: o.SeedOpt = None,
    max_kv_size: o.MaxKvSizeOpt = None,
    system: o.SystemOpt = None,
    stop: o.StopOpt = None,
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
    force_memory: o.ForceMemoryOpt = False,
    cloud: o.CloudOpt = None,
    cloud_model: o.CloudModelOpt = None,
    cloud_budget: o.CloudBudgetOpt = None,
    cloud_calls: o.CloudCallsOpt = None,
    cloud_timeout: o.CloudTimeoutOpt = None,
    cloud_span_tokens: o.CloudSpanTokensOpt = None,
    cloud_threshold: o.CloudThresholdOpt = None,
) -> None:
    """Chat on a terminal, answer prompts piped through stdin, or answer one --prompt."""
    from ..api import open_chat
    from .chat import ChatRunner
    from .streams import TelemetryFile, peek_prompts

    # Every flag is checked before anything is read or loaded: a flag error wins.
    chosen, settings = _routing_and_sampling(**{k: v for k, v in locals().items() if k in _SHARED})
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
        with ui.loading_status(ui.stderr_is_terminal()) as progress:
            session = open_chat(
                chosen, settings=settings, system=system, progress=progress, force_memory=force_memory
            )
        runner = ChatRunner(session, json_output=json_output, color=color, shade=shade, telemetry=sink)
        code = runner.interactive() if prompts is None else runner.piped(prompts, keep_history)
    raise typer.Exit(code)


# The routing, sampling and cloud options `chat` and `serve` share, resolved in one place.
_SHARED = (
    "profile",
    "small",
    "large",
    "model",
    "draft_model",
    "gears",
    "tau",
    "tau_down",
    "window",
    "min_run",
    "normalize",
    "policy",
    "signal",
    "verify",
    "max_tokens",
    "temp",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "max_kv_size",
    "stop",
    "cloud",
    "cloud_model",
    "cloud_budget",
    "cloud_calls",
    "cloud_timeout",
    "cloud_span_tokens",
    "cloud_threshold",
)


def _routing_and_sampling(
    profile,
    small,
    large,
    model,
    draft_model,
    gears,
    tau,
    tau_down,
    window,
    min_run,
    normalize,
    policy,
    signal,
    verify,
    max_tokens,
    temp,
    top_p,
    top_k,
    min_p,
    seed,
    max_kv_size,
    stop,
    cloud,
    cloud_model,
    cloud_budget,
    cloud_calls,
    cloud_timeout,
    cloud_span_tokens,
    cloud_threshold,
):
    """The profile with the flags laid over it, and the sampling settings; all checked, nothing loaded."""
    from ..api import resolve_profile
    from ..decoding.session import GenerationSettings, check_cache_bound

    chosen = resolve_profile(
        profile,
        small=small,
        large=large,
        model=model,
        draft_model=draft_model,
        gears=gears,
        tau=tau,
        tau_down=tau_down,
        window=window,
        min_run=min_run,
        normalize=normalize,
        policy=policy,
        signal=signal,
        verify=verify,
        cloud=cloud,
        cloud_options=o.cloud_options(
            cloud_model, cloud_budget, cloud_calls, cloud_timeout, cloud_span_tokens, cloud_threshold
        ),
    )
    if chosen.cloud is not None:
        from ..cloud.client import require_key

        require_key()  # no key: one error line now, before anything is read or loaded
    settings = GenerationSettings(
        max_tokens=max_tokens,
        temperature=temp,
        top_p=top_p,
        top_k=top_k,
        min_p=min_p,
        seed=seed,
        stop=tuple(stop or ()),
        max_kv_size=max_kv_size,
    )
    check_cache_bound(settings, chosen.tier_names())
    return chosen, settings


@app.command()
def serve(
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    draft_model: o.DraftModelOpt = None,
    gears: o.GearsOpt = None,
    tau: o.TauOpt = None,
    tau_down: o.TauDownOpt = None,
    window: o.WindowOpt = None,
    min_run: o.MinRunOpt = None,
    normalize: o.NormalizeOpt = None,
    policy: o.PolicyOpt = None,
    signal: o.SignalOpt = None,
    verify: o.VerifyOpt = None,
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            help="Tokens per answer when a request does not say; a request asking more gets this many.",
        ),
    ] = 512,
    temp: o.TempOpt = 0.0,
    top_p: o.TopPOpt = 1.0,
    top_k: o.TopKOpt = 0,
    min_p: o.MinPOpt = 0.0,
    seed: o.SeedOpt = None,
    max_kv_size: o.MaxKvSizeOpt = None,
    system: o.SystemOpt = None,
    stop: o.StopOpt = None,
    force_memory: o.ForceMemoryOpt = False,
    cloud: o.CloudOpt = None,
    cloud_model: o.CloudModelOpt = None,
    cloud_budget: o.CloudBudgetOpt = None,
    cloud_calls: o.CloudCallsOpt = None,
    cloud_timeout: o.CloudTimeoutOpt = None,
    cloud_span_tokens: o.CloudSpanTokensOpt = None,
    cloud_threshold: o.CloudThresholdOpt = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (anything but loopback is warned about).")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8080,
    api_key: Annotated[
        str | None,
        typer.Option(
            "--api-key",
            envvar="MLXSWITCH_API_KEY",
            show_default=False,
            help="Require 'Authorization: Bearer KEY' on /v1/… (or set MLXSWITCH_API_KEY).",
        ),
    ] = None,
    queue_size: Annotated[
        int,
        typer.Option("--queue-size", help="Requests that may wait behind the one generating; more get 429."),
    ] = 8,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", help="Larger request bodies are refused (413) unread.")
    ] = 1_000_000,
    log_level: Annotated[
        str, typer.Option("--log-level", help="uvicorn's log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Serve the profile over an OpenAI-compatible HTTP API; every token says which tier made it."""
    from ..api import open_chat
    from ..checks import profile_rows
    from ..errors import UsageError
    from ..server import ServeConfig, ServerLimits, Worker, is_loopback, run

    chosen, settings = _routing_and_sampling(**{k: v for k, v in locals().items() if k in _SHARED})
    limits = ServerLimits(max_body_bytes=max_body_bytes, queue_size=queue_size)
    if not 0 < port < 65536:
        raise UsageError(f"--port must be between 1 and 65535 (got {port})")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key (or MLXSWITCH_API_KEY) is empty")
    if not is_loopback(host):
        ui.print_warning(
            f"listening on {host}: other machines can reach this server"
            + ("" if api_key else "; anyone who can reach it may use it (set --api-key)")
        )
    worker = Worker(limits.queue_size)
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        # The session is opened on the worker's thread: MLX streams belong to their thread.
        worker.open(
            lambda: open_chat(chosen, settings=settings, progress=progress, force_memory=force_memory)
        )
    config = ServeConfig(
        model=chosen.name,
        settings=settings,
        limits=limits,
        api_key=api_key,
        system=system,
        profiles=profile_rows(),
    )
    ui.print_dim(ui.make_console(stderr=True), f"serving '{chosen.name}' on http://{host}:{port}/v1")
    run(config, worker, host, port, log_level=log_level)


@app.command()
def models() -> None:
    """List the profiles of models.toml and whether their models are on this machine."""
    from ..checks import profile_rows

    ui.make_console().print(ui.profiles_table(profile_rows()))


@app.command()
def doctor() -> None:
    """Check MLX, the backends, the models.toml files, the kernels, the default profile and the key."""
    from ..checks import doctor_report

    report = doctor_report()
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
        console.print(line)


@app.command()
def bench(
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    gears: o.GearsOpt = None,
    prompts: o.PromptsOpt = None,
    quick: Annotated[
        bool, typer.Option(help="One prompt per category, short answers, 3 sweep points: about 2 minutes.")
    ] = False,
    repeats: Annotated[int, typer.Option(help="Repeats of every speed arm (figures: median, min–max).")] = 1,
    max_tokens: o.OptionalMaxTokensOpt = None,
    speed_prompts: Annotated[
        int | None, typer.Option(help="Prompts every speed arm runs (default 4; --quick 1).")
    ] = None,
    json_path: o.JsonFileOpt = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a two-panel PNG (retained fidelity vs share and vs bytes).")
    ] = None,
    force_memory: o.ForceMemoryOpt = False,
    suite: Annotated[
        str,
        typer.Option(
            help="prompts (the prompt suite) or humaneval (pass@1 by execution; needs the humaneval extra)."
        ),
    ] = "prompts",
    records: Annotated[
        Path | None,
        typer.Option(
            help="humaneval: the resumable records file (default: one per profile in the user directory)."
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option(help="humaneval: start the records file over instead of resuming it.")
    ] = False,
    problems: Annotated[
        str | None, typer.Option(help="humaneval: only these problems (ids or numbers, comma-separated).")
    ] = None,
    split: Annotated[
        str, typer.Option(help="humaneval: calibration (even ids), heldout (odd ids) or all.")
    ] = "all",
    limit: Annotated[
        int | None, typer.Option(help="humaneval: the first N problems (after --problems and --split).")
    ] = None,
    arms: Annotated[
        str | None,
        typer.Option(
            help="humaneval: arm groups among profile,ead,peek,random,oracle,mlx-lm,speculative"
            " (bottom and top always run)."
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="humaneval: seconds each program may run (default 10).")
    ] = None,
    report: Annotated[
        bool,
        typer.Option(
            help="humaneval: the figures from the records file as it stands; loads no model, decodes nothing."
        ),
    ] = False,
) -> None:
    """Does switching pay on this machine? Speed, quality and cost of every arm, side by side."""
    from ..api import build_ladder, resolve_profile
    from ..bench.command import QUICK, check_output_path, choose_prompts, write_json
    from ..bench.command import bench as run
    from ..bench.runner import BenchOptions
    from ..errors import UsageError

    chosen = resolve_profile(profile, small=small, large=large, model=model, gears=gears)
    if suite not in ("prompts", "humaneval"):
        raise UsageError(f"--suite must be prompts or humaneval (got '{suite}')")
    if suite == "humaneval":
        from .humaneval import bench_humaneval

        bench_humaneval(
            chosen,
            prompts=prompts,
            repeats=repeats,
            speed_prompts=speed_prompts,
            quick=quick,
            max_tokens=max_tokens,
            json_path=json_path,
            plot=plot,
            force_memory=force_memory,
            records=records,
            restart=restart,
            problems=problems,
            split=split,
            limit=limit,
            arms=arms,
            timeout=timeout,
            report_only=report,
        )
        return
    for value, flag in (
        (repeats, "--repeats"),
        (max_tokens, "--max-tokens"),
        (speed_prompts, "--speed-prompts"),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1 (got {value})")
    check_output_path(json_path, "--json")
    check_output_path(plot, "--plot")
    if plot is not None:
        from ..bench.plot import _pyplot

        _pyplot()  # a missing matplotlib is said now, not after the run
    items = choose_prompts(prompts, quick)
    options = BenchOptions(
        quick=quick,
        repeats=repeats,
        max_tokens=max_tokens or (QUICK["max_tokens"] if quick else 32),
        sweep_points=QUICK["sweep_points"] if quick else 5,
        speed_prompts=speed_prompts or (QUICK["speed_prompts"] if quick else 4),
    )
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        ladder = build_ladder(chosen, progress=progress, force_memory=force_memory)
    with ui.bench_progress() as progress:
        record = run(chosen, ladder, items, options, progress)
    if json_path is not None:
        write_json(record, json_path)
    if plot is not None:
        from ..bench.plot import save_plot

        save_plot(
            record,
            f"mlxswitch bench · {chosen.name} ({' → '.join(ladder.tier_names)}) · "
            f"{record['machine']['backend']} · {len(items)} prompts",
            plot,
        )
    ui.make_console().print(ui_tables.bench_table(record))


@app.command()
def calibrate(
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    gears: o.GearsOpt = None,
    target_share: Annotated[float | None, typer.Option(help="Wanted share of top-tier tokens (0–1).")] = None,
    target_retained: Annotated[
        float | None,
        typer.Option(help="Wanted retained fidelity (0–1): the cheapest setting reaching it."),
    ] = None,
    write: Annotated[
        bool, typer.Option(help="Store the chosen setting as this profile in your models.toml.")
    ] = False,
    prompts: o.PromptsOpt = None,
    quick: Annotated[bool, typer.Option(help="Two prompts per category and split.")] = False,
    max_tokens: o.MaxTokensOpt = 32,
    json_path: o.JsonFileOpt = None,
    force_memory: o.ForceMemoryOpt = False,
) -> None:
    """Choose policy and threshold for a target share or fidelity; report them on held-out prompts."""
    import dataclasses

    from ..api import build_ladder, resolve_profile
    from ..bench.calibrate import calibrate as run
    from ..bench.command import check_output_path, finite, write_json
    from ..bench.prompts import default_suite_path, load_prompts, select
    from ..errors import UsageError
    from ..profile_edit import write_profile
    from ..routing.router import RouterConfig

    if (target_share is None) == (target_retained is None):
        raise UsageError("give exactly one of --target-share and --target-retained")
    for value, flag in ((target_share, "--target-share"), (target_retained, "--target-retained")):
        if value is not None and not 0 <= value <= 1:
            raise UsageError(f"{flag} must be between 0 and 1 (got {value:g})")
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 (got {max_tokens})")
    chosen = resolve_profile(profile, small=small, large=large, model=model, gears=gears)
    if len(chosen.tier_names()) < 2:
        raise UsageError(f"profile '{chosen.name}' has a single tier: there is nothing to calibrate")
    if write and chosen.name.startswith("ad-hoc"):
        raise UsageError("--write stores the setting in a named profile: give --profile NAME")
    if write and chosen.cloud is not None:
        raise UsageError(
            "--write keeps local profiles only; calibrate the cascade's local ladder as its own profile"
        )
    check_output_path(json_path, "--json")
    items = load_prompts(prompts or default_suite_path())
    calibration = select(items, quick=quick, split="calibration", per_category=2)
    heldout = select(items, quick=quick, split="heldout", per_category=2)
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        ladder = build_ladder(chosen, progress=progress, force_memory=force_memory, with_probe=False)
    with ui.bench_progress() as progress:
        result = run(
            chosen, ladder, calibration, heldout, target_share, target_retained, max_tokens, progress
        )
    if json_path is not None:
        write_json(finite(result), json_path)
    ui.make_console().print(ui_tables.calibration_report(chosen.name, result))
    if write:
        pick = result["chosen"]
        tiers = len(chosen.tier_names())
        router = RouterConfig(
            up=(pick["tau"],) * (tiers - 1),
            down=(pick["down"],) * (tiers - 1),
            window=pick["window"],
            min_run=pick["min_run"],
            policy=pick["policy"],
            signal=pick["signal"],
        )
        held = result["heldout"]
        note = (
            f"mlxswitch calibrate --target-{'share' if target_share is not None else 'retained'} "
            f"{target_share if target_share is not None else target_retained}: held-out share "
            f"{held['top_share']:.2f}, retained {held['retained']:.2f} (random {held['random_retained']:.2f})"
        )
        path = write_profile(dataclasses.replace(chosen, router=router), note)
        ui.print_dim(ui.make_console(), f"wrote profile '{chosen.name}' to {path}")
