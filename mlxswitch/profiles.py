"""Named profiles from models.toml: the bundled file, overridden by the user's.

A profile names its mode and models, the router's thresholds and timing, and an optional
cloud tier. Errors name the file, the line and what is wrong.
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .errors import ConfigError
from .resources import bundled_models_toml

MODES = ("pair", "gears", "single", "cascade")
_PROFILE_KEYS = {"mode", "description", "small", "large", "model", "gears", "up", "down",
                 "window", "min_run", "normalize", "cloud"}
_CLOUD_KEYS = {"model", "span_tokens", "budget_usd", "timeout_s", "handoff"}
_DEFAULT_KEYS = {"window", "min_run", "normalize"}


@dataclass(frozen=True)
class CloudConfig:
    """The cloud tier of a cascade: which Anthropic model, and its limits."""

    model: str = "claude-haiku-4-5"
    span_tokens: int = 48
    budget_usd: float = 0.05
    timeout_s: float = 20.0
    handoff: bool = False


@dataclass(frozen=True)
class Profile:
    """A ladder of tiers and the router settings that drive it."""

    name: str
    mode: str
    models: tuple[str, ...]
    gears: tuple[int, ...] = ()
    up: tuple[float, ...] = ()
    down: tuple[float, ...] | None = None
    window: int = 5
    min_run: int = 10
    normalize: bool = False
    cloud: CloudConfig | None = None
    description: str = ""
    origin: str = ""

    def tier_names(self) -> tuple[str, ...]:
        """Tier names, bottom first: small/large, g<bits>, model; cloud on top of a cascade."""
        if self.gears:
            local = tuple(f"g{bits}" for bits in self.gears)
        elif len(self.models) == 2:
            local = ("small", "large")
        else:
            local = ("model",)
        return local + (("cloud",) if self.cloud is not None else ())


@dataclass
class ProfileSet:
    """All profiles in file order (bundled first, user additions after) and the default's name."""

    profiles: dict[str, Profile] = field(default_factory=dict)
    default: str = ""
    files: list[Path] = field(default_factory=list)

    def __iter__(self) -> Iterator[Profile]:
        return iter(self.profiles.values())

    def get(self, name: str | None) -> Profile:
        """The named profile (or the default); ConfigError listing the known names otherwise."""
        name = name or self.default
        if name not in self.profiles:
            known = ", ".join(self.profiles) or "none"
            raise ConfigError(f"unknown profile '{name}' (known: {known})")
        return self.profiles[name]


def user_models_toml() -> Path:
    """Where the user's models.toml lives: $MLXSWITCH_MODELS, $MLXSWITCH_HOME, or ~/.config/mlxswitch."""
    if os.environ.get("MLXSWITCH_MODELS"):
        return Path(os.environ["MLXSWITCH_MODELS"]).expanduser()
    home = os.environ.get("MLXSWITCH_HOME")
    root = Path(home).expanduser() if home else Path.home() / ".config" / "mlxswitch"
    return root / "models.toml"


def load_profiles() -> ProfileSet:
    """The bundled profiles with the user's file applied on top."""
    result = ProfileSet()
    defaults: dict = {}
    user = user_models_toml()
    explicit = bool(os.environ.get("MLXSWITCH_MODELS"))
    for path in (bundled_models_toml(), user):
        if not path.exists():
            if path == user and explicit:
                raise ConfigError(f"{path}: no such file (named by MLXSWITCH_MODELS)")
            continue
        _apply_file(path, result, defaults)
    if not result.default:
        raise ConfigError(f"{bundled_models_toml()}: no 'default' profile named")
    result.get(result.default)  # the default must exist
    return result


def get_profile(name: str | None = None) -> Profile:
    """One profile by name (None: the default)."""
    return load_profiles().get(name)


def _apply_file(path: Path, result: ProfileSet, defaults: dict) -> None:
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        where = re.search(r"\(at line (\d+), column (\d+)\)", message)
        what = re.sub(r"\s*\(at line \d+, column \d+\)", "", message)
        location = f"{where.group(1)}:{where.group(2)}" if where else "?"
        raise ConfigError(f"{path}:{location}: {what}") from None
    locate = _Locator(path, text)
    unknown = set(data) - {"default", "defaults", "profiles"}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{locate.key(key)}: unknown top-level key '{key}'")
    if "defaults" in data:
        extra = set(data["defaults"]) - _DEFAULT_KEYS
        if extra:
            key = sorted(extra)[0]
            raise ConfigError(f"{locate.key(key)}: unknown key '{key}' in [defaults]")
        defaults.update(data["defaults"])
    for name, table in data.get("profiles", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(f"{locate.key(name)}: profile '{name}' must be a table")
        result.profiles[name] = _profile(name, table, defaults, locate)
    if "default" in data:
        if not isinstance(data["default"], str):
            raise ConfigError(f"{locate.key('default')}: 'default' must be a profile name")
        result.default = data["default"]
        if result.default not in result.profiles:
            raise ConfigError(f"{locate.key('default')}: default profile '{result.default}' is not defined")
    result.files.append(path)


class _Locator:
    """Finds the line of a profile header or key, for error messages."""

    def __init__(self, path: Path, text: str):
        self.path, self.lines = path, text.splitlines()

    def _line(self, pattern: str, start: int = 0) -> int | None:
        regex = re.compile(pattern)
        for number, line in enumerate(self.lines[start:], start + 1):
            if regex.search(line):
                return number
        return None

    def profile(self, name: str) -> int:
        return self._line(rf"^\s*\[\s*profiles\.\"?{re.escape(name)}\"?\s*[\].]") or 1

    def key(self, key: str, profile: str | None = None) -> str:
        start = self.profile(profile) - 1 if profile else 0
        number = self._line(rf"^\s*\"?{re.escape(key)}\"?\s*=", start) or (start + 1)
        return f"{self.path}:{number}"


def _profile(name: str, table: dict, defaults: dict, locate: _Locator) -> Profile:
    def fail(key: str, what: str) -> ConfigError:
        where = locate.key(key, name) if key else f"{locate.path}:{locate.profile(name)}"
        return ConfigError(f"{where}: profile '{name}': {what}")

    extra = set(table) - _PROFILE_KEYS
    if extra:
        key = sorted(extra)[0]
        raise fail(key, f"unknown key '{key}' (allowed: {', '.join(sorted(_PROFILE_KEYS))})")
    mode = table.get("mode")
    if mode not in MODES:
        raise fail("mode", f"mode must be one of {', '.join(MODES)} (got {mode!r})")
    small, large, model = table.get("small"), table.get("large"), table.get("model")
    for key, value in (("small", small), ("large", large), ("model", model)):
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise fail(key, f"'{key}' must be a model source string")
    gears = tuple(table.get("gears", ()))
    if mode == "pair" or (mode == "cascade" and small):
        if not (small and large):
            raise fail("", f"a {mode} profile needs both 'small' and 'large'")
        models = (small, large)
    else:
        if not model:
            raise fail("", f"a {mode} profile needs 'model'")
        models = (model,)
    if mode == "gears" and not gears:
        raise fail("gears", "a gears profile needs 'gears', e.g. [4, 8, 16]")
    if gears and (any(not isinstance(b, int) for b in gears) or list(gears) != sorted(set(gears))):
        raise fail("gears", "'gears' must be increasing whole bit counts, e.g. [4, 8, 16]")
    cloud = _cloud(table.get("cloud"), fail) if "cloud" in table else None
    if mode == "cascade" and cloud is None:
        raise fail("", "a cascade profile needs a [profiles.NAME.cloud] table")
    if mode != "cascade" and cloud is not None:
        raise fail("cloud", "only a cascade profile has a cloud tier")
    profile = Profile(name=name, mode=mode, models=models, gears=gears, cloud=cloud,
                      description=str(table.get("description", "")), origin=str(locate.path))
    tiers = len(profile.tier_names())
    up = _thresholds(table.get("up", []), "up", fail)
    down = _thresholds(table["down"], "down", fail) if "down" in table else None
    if len(up) != tiers - 1:
        raise fail("up", f"{tiers} tiers ({', '.join(profile.tier_names())}) need {tiers - 1} "
                         f"'up' threshold(s), got {len(up)}")
    if down is not None:
        if len(down) != len(up):
            raise fail("down", f"'down' needs {len(up)} threshold(s), got {len(down)}")
        if any(d > u for d, u in zip(down, up)):
            raise fail("down", "each 'down' threshold must be ≤ its 'up' threshold (hysteresis)")
    settings = {key: table.get(key, defaults.get(key)) for key in ("window", "min_run", "normalize")}
    for key in ("window", "min_run"):
        value = settings[key]
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise fail(key, f"'{key}' must be a whole number ≥ 1")
    if settings["normalize"] is not None and not isinstance(settings["normalize"], bool):
        raise fail("normalize", "'normalize' must be true or false")
    return Profile(name=name, mode=mode, models=models, gears=gears, up=up, down=down,
                   window=settings["window"] or 5, min_run=settings["min_run"] or 10,
                   normalize=bool(settings["normalize"]), cloud=cloud,
                   description=profile.description, origin=profile.origin)


def _thresholds(values, key: str, fail) -> tuple[float, ...]:
    if not isinstance(values, list):
        values = [values]
    out = []
    for value in values:
        if isinstance(value, str) and value.strip().lower() in ("inf", "+inf", "-inf"):
            value = float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise fail(key, f"'{key}' thresholds must be numbers (bits), inf or -inf; got {value!r}")
        out.append(float(value))
    return tuple(out)


def _cloud(table, fail) -> CloudConfig:
    if not isinstance(table, dict):
        raise fail("cloud", "'cloud' must be a table")
    extra = set(table) - _CLOUD_KEYS
    if extra:
        key = sorted(extra)[0]
        raise fail(key, f"unknown cloud key '{key}' (allowed: {', '.join(sorted(_CLOUD_KEYS))})")
    try:
        return CloudConfig(**table)
    except TypeError as exc:
        raise fail("cloud", str(exc)) from None
