"""The options `chat` and `serve` share — models, routing, drafting, sampling, cloud — declared once.

Each field of `EngineOptions` is a flag of both commands, typed and documented by its alias in
options.py. `takes_engine_options` puts every field into a command's signature (so Typer parses
it) and hands the command one `EngineOptions`; `resolve` turns that into the checked profile and
sampling settings. A reader follows a flag by name: `--tau` → EngineOptions.tau →
resolve_profile(tau=…) → RouterConfig.up.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, get_type_hints

from . import options as o


@dataclass(frozen=True)
class EngineOptions:
    """What to load and how to decode, as the flags gave it (None: the profile's own)."""

    profile: o.ProfileOpt = None
    small: o.SmallOpt = None
    large: o.LargeOpt = None
    model: o.ModelOpt = None
    draft_model: o.DraftModelOpt = None
    gears: o.GearsOpt = None
    tau: o.TauOpt = None
    tau_down: o.TauDownOpt = None
    window: o.WindowOpt = None
    min_run: o.MinRunOpt = None
    normalize: o.NormalizeOpt = None
    policy: o.PolicyOpt = None
    signal: o.SignalOpt = None
    verify: o.VerifyOpt = None
    draft: o.DraftRuleOpt = None
    lookup: o.LookupOpt = None
    threads: o.ThreadsOpt = None
    require_resident: o.RequireResidentOpt = False
    temp: o.TempOpt = 0.0
    top_p: o.TopPOpt = 1.0
    top_k: o.TopKOpt = 0
    min_p: o.MinPOpt = 0.0
    seed: o.SeedOpt = None
    max_kv_size: o.MaxKvSizeOpt = None
    system: o.SystemOpt = None
    stop: o.StopOpt = None
    force_memory: o.ForceMemoryOpt = False
    cloud: o.CloudOpt = None
    cloud_model: o.CloudModelOpt = None
    cloud_budget: o.CloudBudgetOpt = None
    cloud_calls: o.CloudCallsOpt = None
    cloud_timeout: o.CloudTimeoutOpt = None
    cloud_span_tokens: o.CloudSpanTokensOpt = None
    cloud_threshold: o.CloudThresholdOpt = None


_FIELDS = [f.name for f in dataclasses.fields(EngineOptions)]


def takes_engine_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """`command(..., engine: EngineOptions)` as a Typer command taking every field as a flag."""
    hints = get_type_hints(EngineOptions, include_extras=True)
    own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "engine"]
    shared = [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=hints[f.name])
        for f in dataclasses.fields(EngineOptions)
    ]

    @functools.wraps(command)
    def wrapper(**kwargs: Any) -> Any:
        engine = EngineOptions(**{name: kwargs.pop(name) for name in _FIELDS})
        return command(engine=engine, **kwargs)

    wrapper.__signature__ = inspect.Signature(own + shared)  # type: ignore[attr-defined]
    return wrapper


def resolve(engine: EngineOptions, max_tokens: int):
    """The profile with the flags laid over it, and the sampling settings; all checked, nothing
    loaded. The BLAS thread count is set here, once, for the whole process."""
    from ..api import PROFILE_FLAGS, resolve_profile
    from ..decoding.session import GenerationSettings, check_cache_bound
    from ..kernels._common import set_blas_threads

    chosen = resolve_profile(
        engine.profile,
        **{flag: getattr(engine, flag) for flag in PROFILE_FLAGS},
        cloud_options=o.cloud_options(
            engine.cloud_model,
            engine.cloud_budget,
            engine.cloud_calls,
            engine.cloud_timeout,
            engine.cloud_span_tokens,
            engine.cloud_threshold,
        ),
    )
    if chosen.cloud is not None:
        from ..cloud.client import require_key

        require_key()  # no key: one error line now, before anything is read or loaded
    settings = GenerationSettings(
        max_tokens=max_tokens,
        temperature=engine.temp,
        top_p=engine.top_p,
        top_k=engine.top_k,
        min_p=engine.min_p,
        seed=engine.seed,
        stop=tuple(engine.stop or ()),
        max_kv_size=engine.max_kv_size,
    )
    check_cache_bound(settings, chosen.tier_names())
    if engine.threads is not None and engine.threads < 1:
        from ..errors import UsageError

        raise UsageError(f"--threads must be at least 1 (got {engine.threads})")
    set_blas_threads(engine.threads)
    return chosen, settings
