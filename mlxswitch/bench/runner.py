"""`mlxswitch bench`: run every arm on one ladder, interleaved, and collect raw records.

Two kinds of measurement, both in one process:
- speed arms generate (each tier alone, the profile's own setting, a threshold sweep per policy,
  mlx-lm's stream_generate on each tier, and mlx-lm's speculative decoding for a pair), round-robin
  over prompts and repeats so that machine drift hits every arm alike;
- quality is teacher-forced along the top tier's own greedy answers (teacher.py), where every
  policy, the random control and the oracle are replayed exactly (simulate.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_unflatten
from mlx_lm.utils import dequantize_model

from ..decoding.answer import AnswerSummary
from ..decoding.mode import DecodingMode
from ..decoding.session import ChatSession, PolicyFactory
from ..decoding.tiers import Ladder
from ..json_numbers import json_float
from ..kernels.route import current_route, kernels_override
from ..models.model_bytes import bytes_per_token
from ..models.rows import Q6KLinear, TiledLinear
from ..profiles import Profile
from ..routing.registry import POLICY_BY_NAME
from ..routing.router import POLICY_NAMES, RouterConfig
from . import probe, simulate
from .prompts import BenchPrompt, check_answer
from .stock import StockModels, mlx_lm_answer
from .teacher import teacher_forced

Progress = Callable[[str, int, int], None]  # (stage, done, total)
INF = math.inf


@dataclass(frozen=True)
class BenchOptions:
    """How much to run."""

    quick: bool = False
    repeats: int = 1
    max_tokens: int = 32
    sweep_points: int = 5
    speed_prompts: int = 4  # prompts every speed arm generates for (the first ones)
    seed: int = 0


@dataclass(frozen=True)
class Arm:
    """One way of decoding: an engine configuration, or mlx-lm on one tier."""

    name: str
    kind: str  # "tier", "profile", "sweep", "mlx-lm", "speculative" (HumanEval: more, arms.py)
    config: RouterConfig | None = None
    decoding: DecodingMode = DecodingMode()  # with `config`: routed or verified, lookup
    tier: int | None = None  # for "tier" and MLX_LM_TIER_KINDS
    policy: str | None = None
    tau: float | None = None

    def to_dict(self) -> dict:
        """The arm's identity in the JSON."""
        return {
            "name": self.name,
            "kind": self.kind,
            "policy": self.policy,
            "tau": self.tau,
            "tier": self.tier,
            "router": None if self.config is None else self.config.settings(json_float),
            "decoding": None if self.config is None else self.decoding.settings(),
        }

    def engine_config(self) -> RouterConfig:
        """The router configuration of an engine arm ("tier", "profile", "sweep")."""
        if self.config is None:
            raise ValueError(f"arm {self.name} ({self.kind}) has no engine configuration")
        return self.config

    def rung(self) -> int:
        """The tier index of a "tier" or MLX_LM_TIER_KINDS arm."""
        if self.tier is None:
            raise ValueError(f"arm {self.name} ({self.kind}) names no tier")
        return self.tier


# One tier alone (forced_config's arms, the controls): plain decoding, no prompt lookup.
PLAIN = DecodingMode(lookup=False)


def forced_config(num_tiers: int, rung: int) -> RouterConfig:
    """A router that keeps every token on one rung (-inf below it, inf above): that tier alone
    (decoded PLAIN)."""
    return RouterConfig(up=tuple(-INF if i < rung else INF for i in range(num_tiers - 1)))


def sweep_config(policy: str, tau: float, num_tiers: int) -> RouterConfig:
    """One swept point: the same up threshold at every boundary, down = 0.6 × up.

    Window and min run are the policy's sweep timing (registry.py): `ead` as its paper runs it
    (window 5, min run 10) whatever the profile's timing — a profile tuned for `peek` (window 1,
    min run 1) would otherwise turn `ead` into a lagged `peek`; `peek` decides each position on
    its own (window 1, min run 1). The profile's own timing is the profile arm's.
    """
    window, min_run = POLICY_BY_NAME[policy].sweep_timing
    return RouterConfig(up=(tau,) * (num_tiers - 1), window=window, min_run=min_run, policy=policy)


def make_arms(profile: Profile, ladder: Ladder, sweep: Mapping[str, Sequence[float]]) -> list[Arm]:
    """Every speed arm for this ladder and each policy's swept thresholds (`sweep`: policy → τs)."""
    names, n = ladder.tier_names, len(ladder.tiers)
    arms = [Arm(f"{name} alone", "tier", forced_config(n, r), PLAIN, tier=r) for r, name in enumerate(names)]
    if n > 1:
        arms.append(
            Arm(
                f"profile ({profile.router.policy})",
                "profile",
                profile.router,
                profile.decoding,
                policy=profile.router.policy,
            )
        )
        for policy in POLICY_NAMES:
            for tau in sweep.get(policy, ()):
                arms.append(
                    Arm(
                        f"{policy} τ={tau:g}",
                        "sweep",
                        sweep_config(policy, tau, n),
                        policy=policy,
                        tau=tau,
                    )
                )
    arms += [Arm(f"mlx-lm {name}", "mlx-lm", tier=r) for r, name in enumerate(names)]
    if n == 2 and ladder.tiers[0].group is not ladder.tiers[1].group:
        arms.append(Arm("mlx-lm speculative", "speculative"))
    return arms


@contextlib.contextmanager
def _stock_kernels():
    # mlx-lm as shipped: our multi-row routes off while it runs (they would speed it up too).
    with kernels_override("reference"):
        yield


SPECULATIVE_KINDS = ("speculative", "speculative-ours", "speculative-fp32")
# mlx-lm as shipped, on the models as it holds them, in a process of their own (stock.py) where our
# ladder's layers are laid out for our kernels (a CPU); the other kinds run on our ladder's models.
STOCK_MODEL_KINDS = ("mlx-lm", "speculative")
# mlx-lm's stream_generate on one tier: as shipped, or with that model dequantized to fp32.
MLX_LM_TIER_KINDS = ("mlx-lm", "mlx-lm-fp32")
# Run on MLX's kernels with the weights dequantized to fp32 (mlx-lm's fair bar on x86, where its
# quantized mat-vec is a scalar loop).
FP32_KINDS = ("mlx-lm-fp32", "speculative-fp32")


def _engine_run(
    session: ChatSession, arm: Arm, prompt: BenchPrompt, max_tokens: int, control: PolicyFactory | None = None
) -> dict:
    session.decode_with(arm.engine_config(), arm.decoding)
    session.reset()
    summary: AnswerSummary = session.ask(prompt.prompt, max_tokens, control)
    decode_s = (summary.tokens[-1].elapsed_s - summary.tokens[0].elapsed_s) if summary.generated > 1 else 0.0
    return {
        "generated": summary.generated,
        "prefilled": summary.prefilled_tokens,
        "first_token_s": summary.first_token_s,
        "decode_s": decode_s,
        "elapsed_s": summary.elapsed_s,
        "peak_memory_gb": summary.peak_memory_gb,
        "switches": summary.switches,
        "catch_up_tokens": sum(summary.catch_up_tokens.values()),
        "tier_counts": summary.tier_counts,
        "mean_bytes_per_token": summary.mean_bytes_per_token,
        "initial_entropy": summary.initial_entropy,
        # Where the seconds went (decoding/ledger.py; None where the loop does not time its passes)
        # and the tokens drafted from something other than a tier (e.g. "lookup").
        "passes": summary.passes,
        "sources": summary.source_counts,
        "text": summary.text,
        "tokens": [
            {
                "id": e.id,
                "tier": e.tier,
                "entropy": e.entropy,
                "tried": list(e.tried) if e.tried else [e.tier],
            }
            for e in summary.tokens
        ],
    }


@contextlib.contextmanager
def _dequantized_fp32(models: list[nn.Module]):
    """The models' quantized layers swapped for fp32 ones (mlx-lm's dequantize_model, then a cast)
    while the block runs, and swapped back after: mlx-lm with the weights dequantized to fp32."""
    saved = []
    try:
        for model in models:
            layers = [
                (name, m)
                for name, m in model.named_modules()
                if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
            ]
            saved.append((model, layers))
            blocks = [
                (name, m.dense_linear()) for name, m in layers if isinstance(m, (Q6KLinear, TiledLinear))
            ]
            if blocks:
                model.update_modules(tree_unflatten(blocks))
            dequantize_model(model)
            swapped = {name for name, _ in layers}
            for name, dense in model.named_modules():
                if name in swapped:
                    dense.weight = dense.weight.astype(mx.float32)
        mx.eval([m.parameters() for m in models])
        yield
    finally:
        for model, layers in saved:
            model.update_modules(tree_unflatten(layers))


def _mlx_lm_run(ladder: Ladder, arm: Arm, prompt_ids: list[int], max_tokens: int, stock: StockModels) -> dict:
    rung = None if arm.kind in SPECULATIVE_KINDS else arm.rung()  # None: the pair, speculatively
    # On a GPU our ladder's layers are MLX's own modules: mlx-lm as shipped runs on them, here.
    if arm.kind in STOCK_MODEL_KINDS and current_route().plain_linears != "mlx-module":
        return stock.answer(rung, prompt_ids, max_tokens)
    if rung is not None:
        ladder.tiers[rung].activate()  # its gear, before the fp32 kinds dequantize its weights
    tiers = (ladder.tiers[-1], ladder.tiers[0]) if rung is None else (ladder.tiers[rung],)
    models = [tier.model.model for tier in tiers]
    # "speculative-ours": mlx-lm's generator on our CPU routes (its algorithm, our kernels); the
    # fp32 kinds on MLX's own kernels with the models dequantized to fp32.
    kernels: contextlib.AbstractContextManager = (
        contextlib.nullcontext() if arm.kind == "speculative-ours" else _stock_kernels()
    )
    fp32 = arm.kind in FP32_KINDS
    weights: contextlib.AbstractContextManager = (
        _dequantized_fp32(models) if fp32 else contextlib.nullcontext()
    )
    with kernels, weights:
        read = bytes_per_token(models[0]) if fp32 else None  # fp32: the weights this arm reads
        return mlx_lm_answer(ladder, rung, prompt_ids, max_tokens, read)


def engine_run(
    session: ChatSession, arm: Arm, prompt: BenchPrompt, max_tokens: int, control: PolicyFactory | None = None
) -> dict:
    """One answer by our engine on `arm`'s router (or a control policy: PreparedAnswer.control): the
    raw record every speed arm keeps."""
    return _engine_run(session, arm, prompt, max_tokens, control)


def mlx_lm_run(ladder: Ladder, arm: Arm, prompt_ids: list[int], max_tokens: int, stock: StockModels) -> dict:
    """One answer by mlx-lm's stream_generate (or its speculative decoding): the same raw record;
    mlx-lm as shipped in `stock`'s process on a CPU, the other kinds (and on a GPU every kind) on
    `ladder`'s models."""
    return _mlx_lm_run(ladder, arm, prompt_ids, max_tokens, stock)


@dataclass
class BenchRun:
    """Everything measured: raw records, teacher-forced positions and the arms they belong to."""

    arms: list[Arm]
    runs: list[dict] = field(default_factory=list)  # one per (repeat, prompt, arm)
    positions: list[simulate.Positions] = field(default_factory=list)
    taus: list[float] = field(default_factory=list)
    top_answers: dict[str, list[int]] = field(default_factory=dict)


def collect_positions(
    ladder: Ladder,
    prompts: list[BenchPrompt],
    max_tokens: int,
    progress: Progress | None = None,
    stage: str = "top-tier answers (teacher forcing)",
    hidden: bool = False,
):
    """The top tier's greedy answer to each prompt and every tier's view of it (teacher-forced).

    Returns the session used (reset between prompts), each prompt's rendered ids, its answer
    budget, the answers' ids and the Positions.
    """
    say = progress or (lambda stage, done, total: None)
    n = len(ladder.tiers)
    # One session, reset between runs; every arm's records keep each token's entropy.
    session = ChatSession(ladder, forced_config(n, n - 1), decoding=PLAIN, measure_signals=True)
    prompt_ids = {p.id: session.render([{"role": "user", "content": p.prompt}]) for p in prompts}
    budget = {p.id: min(max_tokens, p.max_tokens or max_tokens) for p in prompts}
    top = Arm("top", "tier", forced_config(n, n - 1), PLAIN, tier=n - 1)
    answers, positions = {}, []
    scored = ladder.probe is not None  # a profile routed on the probe: its replay reads the scores
    for i, prompt in enumerate(prompts):
        say(stage, i, len(prompts))
        answer = _engine_run(session, top, prompt, budget[prompt.id])
        answers[prompt.id] = [t["id"] for t in answer["tokens"]]
        forced = teacher_forced(
            ladder, prompt.id, prompt_ids[prompt.id], answers[prompt.id], hidden or scored
        )
        if ladder.probe is not None and forced.hidden is not None:  # scored
            features = probe.features([forced])
            assert features is not None  # forced has its hidden states
            forced = dataclasses.replace(forced, probe=ladder.probe.score(features))
        positions.append(forced)
    say(stage, len(prompts), len(prompts))
    return session, prompt_ids, budget, answers, positions


def run_bench(
    profile: Profile,
    ladder: Ladder,
    prompts: list[BenchPrompt],
    options: BenchOptions,
    progress: Progress | None = None,
) -> BenchRun:
    """Measure quality on every prompt, speed on the first `speed_prompts`, interleaved."""
    say = progress or (lambda stage, done, total: None)
    n = len(ladder.tiers)
    speed = prompts[: max(1, options.speed_prompts)]
    # One tier has nothing to route: its quality needs no teacher forcing beyond the speed prompts.
    session, prompt_ids, budget, answers, positions = collect_positions(
        ladder, prompts if n > 1 else speed, options.max_tokens, progress
    )
    run = BenchRun(arms=[], positions=positions, top_answers=answers)
    run.taus = simulate.sweep_thresholds(run.positions, options.sweep_points) if n > 1 else []
    run.arms = make_arms(profile, ladder, dict.fromkeys(POLICY_NAMES, run.taus))

    total, done = options.repeats * len(speed) * len(run.arms), 0
    with StockModels(profile) as stock:
        for repeat in range(options.repeats):
            for prompt in speed:  # round-robin: every arm sees the same moment of the machine
                for arm in run.arms:
                    say("speed arms", done, total)
                    if arm.kind in ("mlx-lm", "speculative"):
                        record = _mlx_lm_run(ladder, arm, prompt_ids[prompt.id], budget[prompt.id], stock)
                    else:
                        record = _engine_run(session, arm, prompt, budget[prompt.id])
                    record.update(
                        arm=arm.name,
                        repeat=repeat,
                        prompt_id=prompt.id,
                        correct=check_answer(prompt, record["text"]),
                    )
                    run.runs.append(record)
                    done += 1
    say("speed arms", total, total)
    return run
