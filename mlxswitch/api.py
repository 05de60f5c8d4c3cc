"""The library API: resolve a profile, build its ladder, open a chat session — no CLI needed.

from mlxswitch.api import open_chat
session = open_chat("embedded")
for event in session.stream("What is the capital of France?"):
    ...
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .cloud.budget import CLOUD_MODES, cloud_settings
from .decoding.mode import MODE_SETTINGS, DecodingMode
from .decoding.prompt_caches import PromptCaches
from .decoding.session import ChatSession, GenerationSettings, check_cache_bound
from .decoding.tiers import Ladder, gear_ladder, pair_ladder, single_model_ladder
from .draft_store import load_draft_costs, save_draft_costs
from .errors import UsageError
from .kernels.route import current_route
from .models.gear_files import build_geared, check_writable_dir, prepare_geared
from .models.gears import DEFAULT_GROUP_SIZE, GROUP_SIZES
from .models.loading import shared_tokenizers
from .models.memory import check_memory
from .models.nesting import plane_bits_for
from .models.sources import load_model
from .models.tokenizers import check_shared_tokenizer
from .profile_load import load_profiles
from .profiles import Profile
from .routing.probe import load_probe
from .routing.router import BOTTOM_ONLY_SIGNALS, SETTINGS_BY_NAME, RouterConfig, parse_thresholds

Progress = Callable[[str], None]


# resolve_profile's overrides that are flags of `chat` and `serve` of the same name (EngineOptions).
PROFILE_FLAGS = (
    "small",
    "large",
    "model",
    "draft_model",
    "gears",
    "tau",
    "tau_down",
    *SETTINGS_BY_NAME,
    *MODE_SETTINGS,
    "cloud",
)


def resolve_profile(
    name: str | Profile | None = None,
    *,
    small: str | None = None,
    large: str | None = None,
    model: str | None = None,
    draft_model: str | None = None,
    gears: str | None = None,
    tau: str | None = None,
    tau_down: str | None = None,
    window: int | None = None,
    min_run: int | None = None,
    normalize: bool | None = None,
    policy: str | None = None,
    signal: str | None = None,
    verify: bool | None = None,
    draft: str | None = None,
    lookup: bool | None = None,
    cloud: str | None = None,
    cloud_options: dict | None = None,
) -> Profile:
    """A profile from models.toml with command-line overrides applied (flags win), fully checked.

    `cloud` is off, span or answer (None: the profile's own); `cloud_options` are CloudSettings
    values (model, budget_usd, …) laid over the profile's, checked by the same cloud_settings.
    """
    profiles = load_profiles()
    base = name if isinstance(name, Profile) else profiles.get(name)
    # An ad-hoc ladder routes from [defaults] (ead on entropy), not from the default profile's
    # tuned settings, which belong to that profile's models.
    ad_hoc = RouterConfig(up=(), **profiles.defaults)
    changes: dict = {}
    if draft_model:
        if not model or small or large or gears:
            raise UsageError(
                "--draft-model goes with --model (the large model) and nothing else: "
                "it is mlx-lm's spelling of --small/--large"
            )
        small, large, model = draft_model, model, None
    if small or large:
        if not (small and large):
            raise UsageError("--small and --large go together (an ad-hoc pair needs both)")
        if model or gears:
            raise UsageError("use either --small/--large or --model, not both")
        changes.update(
            name="ad-hoc pair",
            mode="pair",
            models=(small, large),
            gears=(),
            cloud=None,
            router=ad_hoc,
            decoding=DecodingMode(),
            description="",
        )
    elif model:
        gear_bits = _parse_gears(gears) if gears else ()
        changes.update(
            name="ad-hoc",
            mode="gears" if gear_bits else "single",
            models=(model,),
            gears=gear_bits,
            cloud=None,
            router=ad_hoc,
            decoding=DecodingMode(),
            description="",
        )
    elif gears:
        if base.mode != "gears":
            raise UsageError(f"--gears needs --model or a gears profile ('{base.name}' is {base.mode})")
        changes.update(gears=_parse_gears(gears))
    profile = dataclasses.replace(base, **changes) if changes else base
    had_cloud_rung = "cloud" in profile.tier_names()
    profile = _with_cloud(profile, cloud, cloud_options or {})
    tiers = len(profile.tier_names())
    old = profile.router
    if tau is not None:
        up, down = parse_thresholds(tau), None
    elif len(old.up) == tiers - 1:
        up, down = old.up, old.down
    elif "cloud" in profile.tier_names() and not had_cloud_rung and len(old.up) == tiers - 2:
        # A cloud rung on a local ladder: its boundary repeats the highest local one.
        top = max(old.up) if old.up else 1.0
        up = old.up + (top,)
        down = None if old.down is None else old.down + (min(old.downs()[-1:] or (top,)),)
    elif had_cloud_rung and len(old.up) == tiers:
        up, down = old.up[:-1], None if old.down is None else old.down[:-1]  # the cloud rung went
    else:
        # The ladder changed shape: repeat the profile's first threshold at every boundary.
        up, down = ((old.up[0] if old.up else 1.0),) * (tiers - 1), None
    if tau_down is not None:
        down = parse_thresholds(tau_down)
    # Each setting a flag gives wins; the profile's own stands where none is given.
    given: dict[str, Any] = dict(
        zip(SETTINGS_BY_NAME, (window, min_run, normalize, policy, signal), strict=True)
    )
    settings = {name: getattr(old, name) if value is None else value for name, value in given.items()}
    router = RouterConfig(up=up, down=down, **settings)
    router.validate(tiers)
    flags: dict[str, Any] = dict(zip(MODE_SETTINGS, (verify, draft, lookup), strict=True))
    modes = {
        name: getattr(profile.decoding, name) if value is None else value for name, value in flags.items()
    }
    decoding = DecodingMode(**modes)
    decoding.validate(router, tiers)
    return dataclasses.replace(profile, router=router, decoding=decoding)


def default_note(profile: Profile) -> str:
    """When `profile` is the default and models.toml's first choice of default was not on this
    machine: one line saying how to get that one (profiles.choose_default); else ""."""
    profiles = load_profiles()
    return profiles.default_note if profile.name == profiles.default else ""


def _with_cloud(profile: Profile, mode: str | None, options: dict) -> Profile:
    """The profile with its cloud tier switched (off/span/answer) and its settings overridden."""
    if mode is not None and mode != "off" and mode not in CLOUD_MODES:
        raise UsageError(f"--cloud must be off, {' or '.join(CLOUD_MODES)} (got '{mode}')")
    if mode == "off":
        return dataclasses.replace(profile, cloud=None)
    if mode is None and profile.cloud is None:
        if options:
            raise UsageError(
                "the --cloud-… options need a cloud tier: add --cloud span or "
                "--cloud answer, or use a cascade profile"
            )
        return profile
    values = dataclasses.asdict(profile.cloud) if profile.cloud is not None else {}
    values.update(options)
    if mode is not None:
        values["mode"] = mode
    return dataclasses.replace(profile, cloud=cloud_settings(**values))


def parse_int_list(text: str, flag: str) -> tuple[int, ...]:
    """'4,8,16' → (4, 8, 16); a UsageError naming the flag otherwise."""
    try:
        return tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise UsageError(f"{flag} takes comma-separated whole numbers like 4,8,16 (got '{text}')") from None


def _parse_gears(text: str) -> tuple[int, ...]:
    bits = parse_int_list(text, "--gears")
    if not bits or list(bits) != sorted(set(bits)):
        raise UsageError(f"--gears must list increasing bit counts like 4,8,16 (got '{text}')")
    return bits


def build_ladder(
    profile: Profile,
    progress: Progress | None = None,
    force_memory: bool = False,
    with_probe: bool = True,
    require_resident: bool = False,
) -> Ladder:
    """Check memory, load the profile's models and assemble its tiers (with its probe, when routed
    on one and `with_probe`: calibrate, which trains it, does not need it)."""
    # A missing probe is refused before any model loads.
    routed = with_probe and profile.router.signal in BOTTOM_ONLY_SIGNALS
    probe = load_probe(*profile.probe_key()) if routed else None
    check_memory(profile, force=force_memory)
    say = progress or (lambda message: None)
    for source in profile.models:
        say(f"loading {source}")
    if len(profile.models) == 2:  # a pair, or a cascade on a pair
        with shared_tokenizers():  # the pair's tokenizer files are the same: parsed once
            small, large = (load_model(source, say) for source in profile.models)
        check_shared_tokenizer(small.source, small.tokenizer, large.source, large.tokenizer)
        ladder = pair_ladder(small, large)
    else:
        loaded = load_model(profile.models[0], say)
        if profile.gears:
            ladder = gear_ladder(prepare_geared(loaded, profile.gears, progress=say), list(profile.gears))
        else:
            ladder = single_model_ladder(loaded, name=profile.tier_names()[0])
    if probe is not None:
        ladder.attach_probe(probe)
    if len(ladder.tiers) > 1:
        # The pass costs verified drafting timed here before (draft_store): whichever arm or
        # session drafts on this ladder starts from them, not from a first answer spent timing.
        load_draft_costs(ladder)
    if require_resident:
        slow = [g.model.name for g in ladder.groups if g.model.linears == "rows"]
        if slow and current_route().plain_linears == "resident-fp32":
            raise UsageError(
                f"{', '.join(slow)}: the fp32 copy does not fit half of the memory free at load, so "
                "it would decode from its quantized planes (about 2× slower here); free memory, or "
                "leave out --require-resident to run anyway"
            )
    return ladder


def open_chat(
    profile: str | Profile | None = None,
    settings: GenerationSettings | None = None,
    system: str | None = None,
    progress: Progress | None = None,
    force_memory: bool = False,
    prompt_caches: PromptCaches | None = None,
    require_resident: bool = False,
    measure_signals: bool = False,
) -> ChatSession:
    """Load a profile (by name, or the default) and open a chat session on it; `measure_signals`:
    every token's entropy even where no router reads it (else a single model's is None)."""
    chosen = profile if isinstance(profile, Profile) else resolve_profile(profile)
    if settings is not None:
        check_cache_bound(settings, chosen.tier_names())  # before loading: a flag error
    cloud = None
    if chosen.cloud is not None:
        from .decoding.cloud_span import CloudTier

        cloud = CloudTier(chosen.cloud)  # no key: CloudError here, before any model loads
    ladder = build_ladder(
        chosen, progress=progress, force_memory=force_memory, require_resident=require_resident
    )
    ladder.description = f"{chosen.name}: {ladder.description}"
    ladder.note = chosen.description
    if chosen.cloud is not None:
        ladder.description += f" → cloud {chosen.cloud.model} ({chosen.cloud.mode})"
    return ChatSession(
        ladder,
        chosen.router,
        settings,
        decoding=chosen.decoding,
        system=system,
        cloud=cloud,
        prompt_caches=prompt_caches,
        measure_signals=measure_signals,
        keep_learned=save_draft_costs if len(ladder.tiers) > 1 else None,
    )


def build_gears(
    source: str,
    out: Path,
    planes: str | None = None,
    group_size: int = DEFAULT_GROUP_SIZE,
    force: bool = False,
) -> list[str]:
    """Load `source`, nest it and save it to `out` atomically; return the lines to show the user."""
    plane_bits = parse_int_list(planes, "--planes") if planes else None
    if plane_bits is not None:
        plane_bits_for(tuple(sum(plane_bits[: i + 1]) for i in range(len(plane_bits))))
    if group_size not in GROUP_SIZES:
        raise UsageError(f"--group-size must be one of {', '.join(map(str, GROUP_SIZES))} (got {group_size})")
    check_writable_dir(Path(out), force)  # before loading: a bad --out wins over a slow load
    return build_geared(
        load_model(source), Path(out), plane_bits=plane_bits, group_size=group_size, force=force
    )
