"""mlx-lm's generator for the bench's arms, and mlx-lm as shipped in a process of its own.

The arms that run mlx-lm as shipped ("mlx-lm", "speculative") must decode the profile's models as
mlx-lm holds them. Our ladder's layers hold the kernel's tiles, which mx would dequantize at every
call, so those arms need a copy in MLX's layout; loaded beside our ladder it would count in every
later arm's peak memory (the process's). So a spawned process loads the profile on the reference
route (MLX's layout on its quantized matmul: no tiles, no GGUF blocks, no fp32 copies) when the
first such arm runs, and answers each of them with the raw record the bench keeps. On a GPU our
ladder's layers are MLX's own modules, so those arms run on them in the bench's process (runner.py).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import time
from multiprocessing.connection import Connection
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.generate import stream_generate

from ..errors import UsageError
from ..profiles import Profile


def generated_record(
    model: nn.Module,
    tokenizer: Any,
    prompt_ids: list[int],
    max_tokens: int,
    name: str,
    read: float,
    draft_model: nn.Module | None = None,
) -> dict:
    """One answer by mlx-lm's stream_generate (its speculative decoding where `draft_model`), timed
    from its call: the raw record every speed arm keeps (`name` the tier its tokens are booked to,
    `read` the weight bytes a token reads)."""
    eos = tokenizer.eos_token_ids
    kwargs: dict[str, Any] = {} if draft_model is None else {"draft_model": draft_model}
    stamps: list[float] = []
    ids: list[int] = []
    drafted, peak = 0, 0.0
    start = time.perf_counter()
    mx.reset_peak_memory()
    for response in stream_generate(model, tokenizer, prompt_ids, max_tokens=max_tokens, **kwargs):
        if response.token in eos:
            break
        stamps.append(time.perf_counter() - start)
        ids.append(response.token)
        drafted += bool(getattr(response, "from_draft", False))
        peak = response.peak_memory
    return {
        "generated": len(ids),
        "prefilled": len(prompt_ids),
        "first_token_s": stamps[0] if stamps else None,
        "decode_s": stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0,
        "elapsed_s": time.perf_counter() - start,
        "peak_memory_gb": peak,
        "switches": 0,
        "catch_up_tokens": 0,
        "tier_counts": {name: len(ids)},
        "mean_bytes_per_token": read,
        "draft_share": drafted / len(ids) if ids and draft_model is not None else None,
        "text": tokenizer.decode(ids),
        "tokens": [{"id": t, "tier": name} for t in ids],
    }


def stock_ladder(profile: Profile):
    """The profile's models as mlx-lm holds them: its ladder built on the reference route (this
    process's route from then on: the stock process's)."""
    from ..api import build_ladder
    from ..kernels.route import resolve_route

    resolve_route("reference")
    return build_ladder(profile, with_probe=False)


def mlx_lm_answer(
    ladder, rung: int | None, prompt_ids: list[int], max_tokens: int, read: float | None = None
) -> dict:
    """mlx-lm's generator on `ladder`'s models (stock_ladder's in the stock process): stream_generate
    on tier `rung`, or (None) its speculative decoding, the bottom tier drafting for the top one.
    `read`: the weight bytes a token reads, where not the tier's (the fp32 kinds' copies)."""
    top = rung is None
    tier = ladder.tiers[-1 if top else rung]
    if not top:
        tier.activate()
    draft = ladder.tiers[0].model.model if top else None
    name = ladder.tier_names[-1 if top else rung]
    read = tier.bytes_per_token if read is None else read
    return generated_record(tier.model.model, ladder.tokenizer, prompt_ids, max_tokens, name, read, draft)


def _serve(connection: Connection, profile: Profile) -> None:
    """The stock process: load, then answer (rung, prompt ids, budget) until None; each reply
    (True, record) or (False, the error's message). A Ctrl-C reaches the whole process group: the
    bench's process handles it and ends this one, which prints nothing (nor where that process is
    gone)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(EOFError, OSError):  # the bench's process gone: end quietly
        try:
            ladder = stock_ladder(profile)
        except Exception as error:  # reported with the first request: the bench says it in one line
            failed = f"{error}"
            while connection.recv() is not None:
                connection.send((False, failed))
            return
        while (request := connection.recv()) is not None:
            rung, prompt_ids, max_tokens = request
            try:
                connection.send((True, mlx_lm_answer(ladder, rung, prompt_ids, max_tokens)))
            except Exception as error:  # the bench's process says it in one line
                connection.send((False, f"{type(error).__name__}: {error}"))


class StockModels:
    """mlx-lm as shipped in a process of its own (the module's docstring): started when the first
    answer is asked for, kept until close()."""

    def __init__(self, profile: Profile):
        self.profile = profile
        self._process: Any = None
        self._connection: Connection | None = None

    def answer(self, rung: int | None, prompt_ids: list[int], max_tokens: int) -> dict:
        """The raw record of mlx_lm_answer's answer on the stock ladder, from the stock process."""
        if self._connection is None:
            context = multiprocessing.get_context("spawn")  # a fresh interpreter: no threads forked
            self._connection, theirs = context.Pipe()
            self._process = context.Process(target=_serve, args=(theirs, self.profile), daemon=True)
            self._process.start()
            theirs.close()
        try:
            self._connection.send((rung, prompt_ids, max_tokens))
            done, payload = self._connection.recv()
        except (EOFError, OSError):
            raise UsageError("mlx-lm's arms: their process ended before it answered") from None
        if not done:
            raise UsageError(f"mlx-lm's arms: {payload}")
        return payload

    def close(self, wait: bool = True) -> None:
        """End the stock process: asked to, after its answer (`wait`), else at once (an error or a
        Ctrl-C in the bench, which may have left it mid-answer)."""
        if self._connection is not None:
            with contextlib.suppress(OSError):
                self._connection.send(None)
            self._connection.close()
            self._process.join(timeout=30 if wait else 0)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()
            self._connection = self._process = None

    def __enter__(self) -> StockModels:
        return self

    def __exit__(self, kind, *rest) -> None:
        self.close(wait=kind is None)
