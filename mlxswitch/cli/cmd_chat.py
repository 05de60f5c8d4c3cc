"""`mlxswitch chat` and `mlxswitch serve`, and the routing, sampling and cloud options they share."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from . import options as o
from . import ui


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
    if prompt is not None and not prompt.strip():
        from ..errors import UsageError

        # Not a cue to chat instead: a script passing an empty variable gets an error, not a banner.
        raise UsageError("--prompt is empty: give it the text to answer (or leave it out to read stdin)")
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
    prompt_cache_size: Annotated[
        int,
        typer.Option(
            "--prompt-cache-size",
            help="Conversations whose KV caches are kept besides the one answering (least recently"
            " used out first), so alternating clients do not prefill their history again; 0 keeps none.",
        ),
    ] = 4,
    log_level: Annotated[
        str, typer.Option("--log-level", help="uvicorn's log level: critical, error, warning, info, debug.")
    ] = "info",
) -> None:
    """Serve the profile over an OpenAI-compatible HTTP API; every token says which tier made it."""
    from ..api import open_chat
    from ..checks import profile_rows
    from ..decoding.prompt_caches import PromptCaches
    from ..errors import UsageError
    from ..server import ServeConfig, ServerLimits, Worker, is_loopback, run

    chosen, settings = _routing_and_sampling(**{k: v for k, v in locals().items() if k in _SHARED})
    limits = ServerLimits(max_body_bytes=max_body_bytes, queue_size=queue_size)
    prompt_caches = PromptCaches(prompt_cache_size)
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
            lambda: open_chat(
                chosen,
                settings=settings,
                progress=progress,
                force_memory=force_memory,
                prompt_caches=prompt_caches,
            )
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
