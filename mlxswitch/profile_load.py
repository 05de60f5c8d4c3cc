"""Named profiles read from models.toml: the bundled file, overridden by the user's.

A profile names its mode and models, the router's thresholds and timing, and an optional
cloud tier. Errors name the file, the line and what is wrong.

    default = "embedded"                 # the profile `mlxswitch chat` uses; or a list, the
                                         # first whose models are on this machine (profiles.choose_default)
    [defaults]                           # window / min_run / normalize for every profile
    window = 5
    [profiles.NAME]
    mode = "pair"                        # pair | single | gears | cascade
    small = "org/small-repo"             # pair (or cascade on a pair): small + large
    large = "org/large-repo"             # single / gears (or cascade on them): model (+ gears)
    up = [0.6]                           # bits, one per rung boundary (cascade: + the cloud one)
    down = [0.36]                        # optional, each <= its up
    [profiles.NAME.cloud]                # cascade only; the keys of cloud.budget.CloudSettings
    mode = "span"                        # span: the top rung (one more `up`); answer: hand-off
    model = "claude-haiku-4-5"
"""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from .cloud.budget import CloudSettings, cloud_settings
from .decoding.mode import MODE_SETTINGS, DecodingMode
from .errors import CloudError, ConfigError, SettingError, UsageError
from .models.nesting import plane_bits_for
from .models.sources import model_available_offline
from .profiles import Profile, ProfileSet, choose_default
from .resources import bundled_models_toml, user_dir
from .routing.router import SETTINGS_BY_NAME, RouterConfig
from .toml_text import TomlFile, read_toml

MODES = ("pair", "gears", "single", "cascade")
_PROFILE_KEYS = (
    "mode",
    "description",
    "small",
    "large",
    "model",
    "gears",
    "up",
    "down",
    *SETTINGS_BY_NAME,
    *MODE_SETTINGS,
    "cloud",
)
_DEFAULT_KEYS = ("window", "min_run", "normalize")
_TOP_KEYS = ("default", "defaults", "profiles")
# Which model keys each local ladder takes; a cascade takes those of the ladder under its cloud.
_LADDER_KEYS = {"pair": ("small", "large"), "single": ("model",), "gears": ("model", "gears")}


def user_models_toml() -> Path:
    """Where the user's models.toml lives: $MLXSWITCH_MODELS, else models.toml in the user directory."""
    if os.environ.get("MLXSWITCH_MODELS"):
        return Path(os.environ["MLXSWITCH_MODELS"]).expanduser()
    return user_dir() / "models.toml"


def load_profiles() -> ProfileSet:
    """The bundled profiles with the user's file applied on top."""
    files = [_read_models_toml(bundled_models_toml())]
    user = user_models_toml()
    if user.exists():
        files.append(_read_models_toml(user))
    elif os.environ.get("MLXSWITCH_MODELS"):
        raise ConfigError(f"{user}: no such file (named by MLXSWITCH_MODELS)")

    # Merge before building, so the user's [defaults] reach bundled profiles too.
    defaults: dict = {}
    tables: dict[str, tuple[dict, TomlFile]] = {}
    default: tuple[str, TomlFile] | None = None
    for toml in files:
        defaults.update(_defaults(toml))
        for name, table in toml.data.get("profiles", {}).items():
            tables[name] = (table, toml)
        if "default" in toml.data:
            default = (toml.data["default"], toml)

    result = ProfileSet(files=[toml.path for toml in files], defaults=dict(defaults))
    for name, (table, toml) in tables.items():
        result.profiles[name] = _profile(name, table, defaults, toml)
    if default is None:
        raise ConfigError(f"{files[0].path}: no 'default' profile named")
    given, toml = default
    names = _as_list(given)
    for name in names:
        if name not in result.profiles:
            known = ", ".join(result.profiles)
            raise ConfigError(
                f"{toml.where('default')}: default profile '{name}' is not defined (known: {known})"
            )
    result.default, result.default_note = choose_default([result.profiles[name] for name in names])
    result.preferred = names[0]
    return result


# -- reading a file -----------------------------------------------------------------------------


def _read_models_toml(path: Path) -> TomlFile:
    """A models.toml parsed, its top level checked (the profiles are checked one by one later)."""
    toml = read_toml(path)
    data = toml.data
    for key in data:
        if key not in _TOP_KEYS:
            raise ConfigError(
                f"{toml.where(key)}: unknown top-level key '{key}' (allowed: {', '.join(_TOP_KEYS)})"
            )
    if "default" in data and not (
        isinstance(data["default"], str)
        or (
            isinstance(data["default"], list)
            and data["default"]
            and all(isinstance(n, str) for n in data["default"])
        )
    ):
        raise ConfigError(
            f"{toml.where('default')}: 'default' must be a profile name (a string), "
            "or a list of them (the first whose models are on this machine)"
        )
    for key in ("defaults", "profiles"):
        if key in data and not isinstance(data[key], dict):
            raise ConfigError(f"{toml.where(key)}: '{key}' must be a table ([{key}])")
    for name, table in data.get("profiles", {}).items():
        if not isinstance(table, dict):
            raise ConfigError(
                f"{toml.where(name, ('profiles',))}: profile '{name}' must be a table ([profiles.{name}])"
            )
    return toml


def _defaults(toml: TomlFile) -> dict:
    table = toml.data.get("defaults", {})
    for key, value in table.items():
        where = toml.where(key, ("defaults",))
        if key not in _DEFAULT_KEYS:
            raise ConfigError(
                f"{where}: unknown key '{key}' in [defaults] (allowed: {', '.join(_DEFAULT_KEYS)})"
            )
        problem = _type_problem(key, value)
        if problem:
            raise ConfigError(f"{where}: [defaults]: {problem}")
    try:  # the router's own rules, with its own words
        RouterConfig(up=(), **table)
    except SettingError as exc:
        raise ConfigError(f"{toml.where(exc.key, ('defaults',))}: [defaults]: {exc}") from None
    return dict(table)


def _type_problem(key: str, value) -> str | None:
    # TOML types only: what the values mean is RouterConfig's to judge.
    if key in ("normalize", "verify", "lookup"):
        return None if isinstance(value, bool) else f"'{key}' must be true or false"
    if not isinstance(value, int) or isinstance(value, bool):
        return f"'{key}' must be a whole number (got {value!r})"
    return None


# -- building a profile -------------------------------------------------------------------------


def _profile(name: str, table: dict, defaults: dict, toml: TomlFile) -> Profile:
    section = ("profiles", name)

    def fail(key: str | None, what: str, sub: tuple[str, ...] = ()) -> ConfigError:
        return ConfigError(f"{toml.where(key, section + sub)}: profile '{name}': {what}")

    for key in table:
        if key not in _PROFILE_KEYS:
            raise fail(key, f"unknown key '{key}' (allowed: {', '.join(_PROFILE_KEYS)})")
    mode = table.get("mode")
    if mode not in MODES:
        raise fail("mode", f"mode must be one of {', '.join(MODES)} (got {mode!r})")

    if mode == "cascade" and "cloud" not in table:
        raise fail(None, "a cascade profile needs a [profiles.NAME.cloud] table")
    if mode != "cascade" and "cloud" in table:
        raise fail("cloud", f"only a cascade profile has a cloud tier (this one is {mode})")
    cloud = _cloud(table["cloud"], fail) if "cloud" in table else None

    ladder = _ladder_kind(mode, table)
    expected = _LADDER_KEYS[ladder]
    what = f"a {mode} profile" if mode == ladder else f"a cascade on a {ladder} ladder"
    for key in ("small", "large", "model", "gears"):
        if key in table and key not in expected:
            raise fail(key, f"'{key}' does not belong in {what} (it takes {' and '.join(expected)})")
    missing = [key for key in expected if key not in table]
    if missing:
        both = "both " if len(expected) == 2 else ""
        raise fail(
            None, f"{what} needs {both}{' and '.join(repr(k) for k in expected)} ('{missing[0]}' is missing)"
        )
    for key in ("small", "large", "model"):
        if key in table and not _sources_given(table[key]):
            raise fail(
                key,
                f"'{key}' must be a model source (a Hugging Face repo id, a path, "
                "'embedded' or 'package:NAME'), or a list of them",
            )
    models = tuple(
        _first_available([_resolve_source(v, toml.path) for v in _as_list(table[key])])
        for key in expected
        if key != "gears"
    )
    gears = _gears(table["gears"], fail) if "gears" in table else ()
    if "description" in table and not isinstance(table["description"], str):
        raise fail("description", "'description' must be a string")

    settings = {
        key: table[key] if key in table else defaults[key]
        for key in _DEFAULT_KEYS
        if key in table or key in defaults
    }
    for key, value in settings.items():
        problem = _type_problem(key, value)
        if problem:
            raise fail(key, problem)
    up = _thresholds(table.get("up", []), "up", fail)
    down = _thresholds(table["down"], "down", fail) if "down" in table else None
    profile = Profile(
        name=name,
        mode=mode,
        models=models,
        gears=gears,
        cloud=cloud,
        description=table.get("description", ""),
        origin=str(toml.path),
    )
    for key in ("policy", "signal", "draft"):
        if key in table:
            if not isinstance(table[key], str):
                raise fail(key, f"'{key}' must be a name (got {table[key]!r})")
            settings[key] = table[key]
    for key in ("verify", "lookup"):
        if key in table:
            problem = _type_problem(key, table[key])
            if problem:
                raise fail(key, problem)
            settings[key] = table[key]
    decoding_settings = {key: settings.pop(key) for key in MODE_SETTINGS if key in settings}
    try:
        router = RouterConfig(up=up, down=down, **settings)
        router.validate(len(profile.tier_names()))
        decoding = DecodingMode(**decoding_settings)
        decoding.validate(router, len(profile.tier_names()))
    except SettingError as exc:
        origin = (
            " (normalize = true comes from [defaults])"
            if settings.get("normalize") and "normalize" not in table
            else ""
        )
        raise fail(exc.key, f"{exc}{origin}") from None
    return dataclasses.replace(profile, router=router, decoding=decoding)


def _ladder_kind(mode: str, table: dict) -> str:
    """The local ladder under a cascade's cloud tier: a pair, gears, or a single model."""
    if mode != "cascade":
        return mode
    if "small" in table or "large" in table:
        return "pair"
    return "gears" if "gears" in table else "single"


def _as_list(value) -> list:
    return value if isinstance(value, list) else [value]


def _sources_given(value) -> bool:
    values = _as_list(value)
    return bool(values) and all(isinstance(v, str) and v.strip() for v in values)


def _first_available(sources: list[str]) -> str:
    # A list names the same model in several forms (the packaged GGUF here, the mlx-community
    # repo on a Mac): the first one on this machine, else the first (its error says how to get it).
    if len(sources) > 1:
        for source in sources:
            if model_available_offline(source):
                return source
    return sources[0]


def _resolve_source(source: str, toml_path: Path) -> str:
    # `~` means home; ./ and ../ are relative to the models.toml that names them, not the cwd.
    source = source.strip()
    if source.startswith("~"):
        return str(Path(source).expanduser())
    if source.startswith(("./", "../")):
        return str((toml_path.parent / source).resolve())
    return source


def _gears(values, fail) -> tuple[int, ...]:
    if (
        not isinstance(values, list)
        or not values
        or any(not isinstance(b, int) or isinstance(b, bool) for b in values)
        or values != sorted(set(values))
    ):
        raise fail("gears", f"'gears' must be increasing whole bit counts, e.g. [4, 8, 16] (got {values!r})")
    try:
        plane_bits_for(tuple(values))
    except UsageError as exc:
        raise fail("gears", str(exc)) from None
    return tuple(values)


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


def _cloud(table, fail) -> CloudSettings:
    if not isinstance(table, dict):
        raise fail("cloud", "'cloud' must be a table ([profiles.NAME.cloud])")
    try:  # the cloud tier's own rules, with its own words: flags go through the same function
        return cloud_settings(**table)
    except SettingError as exc:
        raise fail(exc.key if exc.key in table else None, f"cloud: {exc}", ("cloud",)) from None
    except CloudError as exc:  # a model the price table lacks, with no prices given
        raise fail("model" if "model" in table else None, f"cloud: {exc}", ("cloud",)) from None
