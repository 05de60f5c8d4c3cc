"""The options several commands share, declared once as typed aliases (one help text each).

Defaults stay with each command (`chat` answers up to 512 tokens, `calibrate` 32); the name,
type and help of an option live here only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

# -- which models: a profile, or an ad-hoc pair, single model or gears ------------------------
ProfileOpt = Annotated[
    str | None, typer.Option("--profile", help="Profile from models.toml (default: its default).")
]
SmallOpt = Annotated[str | None, typer.Option("--small", help="Ad-hoc pair: the cheap model (with --large).")]
LargeOpt = Annotated[
    str | None, typer.Option("--large", help="Ad-hoc pair: the strong model (with --small).")
]
ModelOpt = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Ad-hoc single model, the geared model with --gears, or the large model with --draft-model.",
    ),
]
DraftModelOpt = Annotated[
    str | None,
    typer.Option(
        "--draft-model", help="With --model: a pair whose cheap tier is this model (mlx-lm's spelling)."
    ),
]
GearsOpt = Annotated[str | None, typer.Option("--gears", help="Gear bits low→high for --model, e.g. 4,8,16.")]
ForceMemoryOpt = Annotated[
    bool, typer.Option("--force-memory", help="Load even if the memory estimate says it will not fit.")
]

# -- routing --------------------------------------------------------------------------------
TauOpt = Annotated[
    str | None,
    typer.Option("--tau", help="Up thresholds in bits, one per rung boundary (inf/-inf allowed)."),
]
TauDownOpt = Annotated[
    str | None, typer.Option("--tau-down", help="Down thresholds (≤ up): the hysteresis band.")
]
WindowOpt = Annotated[int | None, typer.Option("--window", help="Rolling-mean window in tokens.")]
MinRunOpt = Annotated[
    int | None, typer.Option("--min-run", help="Tokens a tier makes before the router may move.")
]
NormalizeOpt = Annotated[
    bool | None,
    typer.Option("--normalize/--no-normalize", help="Compare entropy / log2(vocab) instead of bits."),
]
PolicyOpt = Annotated[
    str | None,
    typer.Option(
        "--policy",
        help="ead: token t's entropy picks t+1's tier; peek: the cheap tier computes a position, "
        "a stronger one redoes it when unsure.",
    ),
]
VerifyOpt = Annotated[
    bool | None,
    typer.Option(
        "--verify/--no-verify",
        help="The large tier checks every token the small one drafts (lossless, as speculative "
        "decoding); a draft ends where the small tier's signal exceeds the first --tau (the "
        "router's policy, window and min run do not apply). Needs two local tiers.",
    ),
]
DraftRuleOpt = Annotated[
    str | None,
    typer.Option(
        "--draft",
        help="With --verify: adaptive (draft as far as drafts are kept and checks are cheap here; the "
        "large tier alone where drafting does not pay) or fixed (up to 32 tokens while the small "
        "tier is sure). Default: the profile's (adaptive).",
    ),
]
LookupOpt = Annotated[
    bool | None,
    typer.Option(
        "--lookup/--no-lookup",
        help="Drafts may also come free from the text itself (the tokens that followed the answer's "
        "last words earlier in the prompt or answer), checked by the tier that makes the token: the "
        "large tier with --verify, the tier the router chose otherwise. Answers are unchanged; only "
        "the time is. Default: the profile's (on).",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        help="CPU route: BLAS threads for NumPy's products (steps, prefill, checks, catch-ups). "
        "Default: every core; on cores another busy process shares, 1 can be faster.",
    ),
]
RequireResidentOpt = Annotated[
    bool,
    typer.Option(
        "--require-resident",
        help="CPU route: refuse to run a model without its resident fp32 copy (it is skipped when "
        "it does not fit half of the free memory, and the model then decodes about 2× slower).",
    ),
]
SignalOpt = Annotated[
    str | None,
    typer.Option(
        "--signal",
        help="What the policy reads: entropy (bits), varentropy (bits²), margin (1 − (p1 − p2)) "
        "or probe (p(the top tier helps), trained by calibrate; peek only); --tau is in "
        "its units.",
    ),
]

# -- sampling and stopping ------------------------------------------------------------------
MaxTokensOpt = Annotated[int, typer.Option("--max-tokens", help="Most tokens per answer.")]
OptionalMaxTokensOpt = Annotated[int | None, typer.Option("--max-tokens", help="Most tokens per answer.")]
TempOpt = Annotated[float, typer.Option("--temp", help="Sampling temperature (0 = greedy).")]
TopPOpt = Annotated[float, typer.Option("--top-p", help="Nucleus sampling mass.")]
TopKOpt = Annotated[int, typer.Option("--top-k", help="Sample among the k likeliest (0 = all).")]
MinPOpt = Annotated[float, typer.Option("--min-p", help="Drop tokens below min_p × the top probability.")]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="Random seed for sampling.")]
MaxKvSizeOpt = Annotated[
    int | None,
    typer.Option("--max-kv-size", help="Keep at most this many tokens in each KV cache (a rotating cache)."),
]
SystemOpt = Annotated[str | None, typer.Option("--system", "--system-prompt", help="System prompt.")]
StopOpt = Annotated[list[str] | None, typer.Option("--stop", help="Stop string (repeatable).")]

# -- the cloud tier -------------------------------------------------------------------------
CloudOpt = Annotated[
    str | None,
    typer.Option(
        "--cloud",
        help="Cloud tier: off (all local), span (Claude as the top rung) or answer (re-ask "
        "uncertain answers). Default: the profile's.",
    ),
]
CloudModelOpt = Annotated[
    str | None, typer.Option("--cloud-model", help="Anthropic model id of the cloud tier.")
]
CloudBudgetOpt = Annotated[
    float | None, typer.Option("--cloud-budget", help="Most US dollars the cloud may cost this session.")
]
CloudCallsOpt = Annotated[int | None, typer.Option("--cloud-calls", help="Most cloud calls this session.")]
CloudTimeoutOpt = Annotated[
    float | None, typer.Option("--cloud-timeout", help="Seconds to wait for a cloud reply.")
]
CloudSpanTokensOpt = Annotated[
    int | None, typer.Option("--cloud-span-tokens", help="Most tokens of one cloud span.")
]
CloudThresholdOpt = Annotated[
    float | None,
    typer.Option(
        "--cloud-threshold", help="--cloud answer: re-ask answers whose mean entropy exceeds this many bits."
    ),
]

# -- outputs and prompts --------------------------------------------------------------------
JsonLinesOpt = Annotated[
    bool, typer.Option("--json", help="One JSON object per answer on stdout (JSON Lines).")
]
JsonFileOpt = Annotated[
    Path | None, typer.Option("--json", help="Write every figure and raw record to FILE.")
]
PromptsOpt = Annotated[
    Path | None,
    typer.Option(
        "--prompts", help="Prompt file (JSON Lines, bench/prompts format; default: the bundled suite)."
    ),
]


def cloud_options(model, budget, calls, timeout, span_tokens, threshold) -> dict:
    """The --cloud-… flags given, as CloudSettings values (checked with the profile's)."""
    values = {
        "model": model,
        "budget_usd": budget,
        "budget_calls": calls,
        "timeout_s": timeout,
        "span_tokens": span_tokens,
        "handoff_threshold": threshold,
    }
    return {key: value for key, value in values.items() if value is not None}
