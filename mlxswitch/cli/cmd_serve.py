"""`mlxswitch serve`: the profile behind an OpenAI-compatible HTTP API."""

from __future__ import annotations

from typing import Annotated

import typer

from . import ui
from .engine_options import EngineOptions, resolve, takes_engine_options


@takes_engine_options
def serve(
    max_tokens: Annotated[
        int,
        typer.Option(
            "--max-tokens",
            help="Tokens per answer when a request does not say; a request asking more gets this many.",
        ),
    ] = 512,
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
        typer.Option("--queue-size", help="Requests that may wait behind those generating; more get 429."),
    ] = 8,
    max_batch: Annotated[
        int,
        typer.Option(
            "--max-batch",
            help="Answers decoded together (continuous batching; routed, verified and geared"
            " ladders too); 1: one at a time. A cloud tier or the probe signal answers one at a time.",
        ),
    ] = 8,
    max_body_bytes: Annotated[
        int, typer.Option("--max-body-bytes", help="Larger request bodies are refused (413) unread.")
    ] = 1_000_000,
    prompt_cache_size: Annotated[
        int,
        typer.Option(
            "--prompt-cache-size",
            help="Conversations whose KV caches are kept besides the one answering (least recently"
            " used out first; on a batched ladder, per tier), so alternating clients do not prefill"
            " their history again; 0 keeps none.",
        ),
    ] = 4,
    prompt_cache_bytes: Annotated[
        int,
        typer.Option(
            "--prompt-cache-bytes",
            help="Most bytes of K/V the kept conversations may hold together (least recently used out"
            " first); a conversation larger than this alone is not kept.",
        ),
    ] = 4 << 30,
    log_level: Annotated[
        str, typer.Option("--log-level", help="uvicorn's log level: critical, error, warning, info, debug.")
    ] = "info",
    *,
    engine: EngineOptions,
) -> None:
    """Serve the profile over an OpenAI-compatible HTTP API; every token says which tier made it."""
    from ..api import open_chat
    from ..checks import profile_rows
    from ..decoding.engine import ONE_AT_A_TIME, batching
    from ..errors import UsageError
    from ..server import BatchWorker, ServeConfig, ServerLimits, Worker, is_loopback, run

    chosen, settings = resolve(engine, max_tokens)
    limits = ServerLimits(
        max_body_bytes=max_body_bytes,
        queue_size=queue_size,
        max_batch=max_batch,
        prompt_cache_size=prompt_cache_size,
        prompt_cache_bytes=prompt_cache_bytes,
    )
    prompt_caches = limits.prompt_caches()
    if not 0 < port < 65536:
        raise UsageError(f"--port must be between 1 and 65535 (got {port})")
    if api_key is not None and not api_key.strip():
        raise UsageError("--api-key (or MLXSWITCH_API_KEY) is empty")
    if not is_loopback(host):
        ui.print_warning(
            f"listening on {host}: other machines can reach this server"
            + ("" if api_key else "; anyone who can reach it may use it (set --api-key)")
        )
    # One local model, a routed or verified pair, gears: many requests decoded together
    # (decoding/engine.py); a cloud tier or the probe, one at a time.
    kind = batching(chosen.cloud is not None, chosen.router.signal)
    batched = kind != ONE_AT_A_TIME and limits.max_batch > 1
    worker: Worker | BatchWorker = (
        BatchWorker(limits.queue_size, limits.max_batch, prompt_caches)
        if batched
        else Worker(limits.queue_size)
    )
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        # The session is opened on the worker's thread: MLX streams belong to their thread.
        worker.open(
            lambda: open_chat(
                chosen,
                settings=settings,
                progress=progress,
                force_memory=engine.force_memory,
                require_resident=engine.require_resident,
                prompt_caches=None if batched else prompt_caches,
                measure_signals=True,  # the provenance extension gives every token's entropy
            )
        )
    config = ServeConfig(
        model=chosen.name,
        settings=settings,
        limits=limits,
        api_key=api_key,
        system=engine.system,
        profiles=profile_rows(),
    )
    how = f"up to {limits.max_batch} answers at once" if batched else "one answer at a time"
    ui.print_dim(ui.make_console(stderr=True), f"serving '{chosen.name}' on http://{host}:{port}/v1 ({how})")
    run(config, worker, host, port, log_level=log_level)
