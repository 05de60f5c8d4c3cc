"""The library API: resolve a profile, build its ladder, open a chat session — no CLI needed.

    from mlxswitch.api import open_chat
    session = open_chat("embedded")
    for event in session.stream("What is the capital of France?"):
        ...
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

from .engine import ChatSession, GenerationSettings
from .errors import CloudError, UsageError
from .ladder import Ladder, gear_ladder, load_pair, single_model_ladder
from .loading import load_model
from .profiles import Profile, get_profile, load_profiles
from .router import RouterConfig, parse_thresholds

Progress = Callable[[str], None]


def resolve_profile(name: str | Profile | None = None, *, small: str | None = None,
                    large: str | None = None, model: str | None = None, gears: str | None = None,
                    tau: str | None = None, tau_down: str | None = None, window: int | None = None,
                    min_run: int | None = None, normalize: bool | None = None) -> Profile:
    """A profile from models.toml with command-line overrides applied (flags win)."""
    base = name if isinstance(name, Profile) else get_profile(name)
    changes: dict = {}
    if small or large:
        if not (small and large):
            raise UsageError("--small and --large go together (an ad-hoc pair needs both)")
        if model or gears:
            raise UsageError("use either --small/--large or --model, not both")
        changes.update(name="ad-hoc pair", mode="pair", models=(small, large), gears=(), cloud=None)
    elif model:
        gear_bits = _parse_gears(gears) if gears else ()
        changes.update(name="ad-hoc", mode="gears" if gear_bits else "single", models=(model,),
                       gears=gear_bits, cloud=None)
    elif gears:
        if base.mode != "gears":
            raise UsageError(f"--gears needs --model or a gears profile ('{base.name}' is {base.mode})")
        changes.update(gears=_parse_gears(gears))
    profile = dataclasses.replace(base, **changes) if changes else base
    tiers = len(profile.tier_names())
    if tau is not None:
        profile = dataclasses.replace(profile, up=parse_thresholds(tau), down=None)
    elif len(profile.up) != tiers - 1:
        # The ladder changed shape: repeat the profile's first threshold at every boundary.
        fallback = profile.up[0] if profile.up else 1.0
        profile = dataclasses.replace(profile, up=(fallback,) * (tiers - 1), down=None)
    if tau_down is not None:
        profile = dataclasses.replace(profile, down=parse_thresholds(tau_down))
    for key, value in (("window", window), ("min_run", min_run), ("normalize", normalize)):
        if value is not None:
            profile = dataclasses.replace(profile, **{key: value})
    return profile


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


def router_config(profile: Profile, ladder: Ladder) -> RouterConfig:
    """The router settings of a profile, with the ladder's vocabulary for normalisation and the guard."""
    config = RouterConfig(up=tuple(profile.up), down=tuple(profile.down) if profile.down else None,
                          window=profile.window, min_run=profile.min_run,
                          normalize=profile.normalize, vocab_size=ladder.vocab_size)
    config.validate(len(ladder.tiers))
    return config


def build_ladder(profile: Profile, progress: Progress | None = None,
                 force_memory: bool = False) -> Ladder:
    """Check memory, load the profile's models and assemble its tiers."""
    from .validation import check_memory

    check_memory(profile, force=force_memory)
    say = progress or (lambda message: None)
    if profile.cloud is not None:
        raise CloudError(f"profile '{profile.name}' has a cloud tier, which this version cannot run "
                         "yet; use a local profile")
    if profile.mode == "pair" or (profile.mode == "cascade" and len(profile.models) == 2):
        return load_pair(profile.models[0], profile.models[1], progress=say)
    if profile.gears:
        from .gears import prepare_geared

        say(f"loading {profile.models[0]}")
        loaded = prepare_geared(load_model(profile.models[0]), profile.gears, progress=say)
        return gear_ladder(loaded, list(profile.gears))
    say(f"loading {profile.models[0]}")
    return single_model_ladder(load_model(profile.models[0]), name=profile.tier_names()[0])


def open_chat(profile: str | Profile | None = None, settings: GenerationSettings | None = None,
              system: str | None = None, progress: Progress | None = None,
              force_memory: bool = False) -> ChatSession:
    """Load a profile (by name, or the default) and open a chat session on it."""
    chosen = profile if isinstance(profile, Profile) else resolve_profile(profile)
    ladder = build_ladder(chosen, progress=progress, force_memory=force_memory)
    ladder.description = f"{chosen.name}: {ladder.description}"
    return ChatSession(ladder, router_config(chosen, ladder), settings, system=system)


def profile_rows() -> list[dict]:
    """One row per profile for `mlxswitch models`: mode, tiers, models and offline availability."""
    from .validation import model_available_offline

    profiles = load_profiles()
    rows = []
    for profile in profiles:
        rows.append({
            "name": profile.name, "default": profile.name == profiles.default,
            "mode": profile.mode, "tiers": list(profile.tier_names()),
            "models": list(profile.models), "notes": profile.description,
            "offline": [model_available_offline(source) for source in profile.models],
        })
    return rows


def doctor_report() -> list[tuple[str, list[tuple[str, str]]]]:
    """Sections of facts for `mlxswitch doctor`."""
    import platform

    import mlx.core as mx

    from . import __version__
    from .resources import bundled_models_toml, embedded_gguf_path, metal_dir
    from .errors import MlxSwitchError

    backend = "gpu" if mx.default_device() == mx.gpu else "cpu"
    cuda = getattr(mx, "cuda", None)
    system = [
        ("mlxswitch", __version__),
        ("python", platform.python_version()),
        ("platform", f"{platform.system()} {platform.machine()}"),
        ("mlx", mx.__version__),
        ("default device", backend),
        ("metal", "available" if mx.metal.is_available() else "not available"),
        ("cuda", "available" if cuda is not None and cuda.is_available() else "not available"),
        ("metal sources", str(metal_dir())),
        ("models.toml", str(bundled_models_toml())),
    ]
    try:
        embedded = f"ok, checksum verified ({embedded_gguf_path()})"
    except MlxSwitchError as exc:
        embedded = f"missing: {exc}"
    models = [("embedded model", embedded)]
    key = os.environ.get("ANTHROPIC_API_KEY")
    models.append(("anthropic key", "set (ANTHROPIC_API_KEY)" if key else "not set"))
    from .kernels import kernel_self_check

    profiles = load_profiles()
    default = profiles.get(None)
    ladder_rows = [("default profile", f"{default.name} ({default.mode}: {', '.join(default.models)})")]
    try:
        ladder = build_ladder(default)
        for tier in ladder.tiers:
            ladder_rows.append((f"tier {tier.name}", f"{tier.bytes_per_token / 1e6:.1f} MB read per token"))
        for group in ladder.groups:
            from .gears import resident_bytes

            ladder_rows.append((f"resident {group.model.name}",
                                f"{resident_bytes(group.model.model) / 1e6:.1f} MB; {group.model.precision}"))
    except MlxSwitchError as exc:
        ladder_rows.append(("load", f"failed: {exc}"))

    kernels = [(f"{check.name} [{check.backend}]", check.status) for check in kernel_self_check()]
    return [("system", system), ("models", models), ("default ladder", ladder_rows), ("kernels", kernels)]


def build_gears(source: str, out: Path, plane_bits: tuple[int, ...] | None = None,
                group_size: int = 64) -> list[str]:
    """Build and save a nested-gear model; return the lines to show the user."""
    from .gears import build_and_save

    return build_and_save(source, out, plane_bits=plane_bits, group_size=group_size)
