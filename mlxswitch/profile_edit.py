"""Writing a profile into the user's models.toml in place: its other text and comments stay."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

from .errors import ConfigError, OutputError
from .files import atomic_file
from .profile_load import load_profiles, user_models_toml
from .profiles import Profile
from .toml_text import table_header


def _value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f'"{value}"' if not math.isfinite(value) else repr(round(value, 6))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def profile_table(profile: Profile, comment: str) -> str:
    """The [profiles.NAME] table that reproduces `profile` (a local ladder) exactly."""
    router = profile.router
    lines = [f"# {line}" for line in comment.splitlines()]
    lines.append(f'[profiles."{profile.name}"]')
    keys: dict = {"mode": profile.mode}
    if profile.mode == "pair":
        keys.update(small=profile.models[0], large=profile.models[1])
    else:
        keys["model"] = profile.models[0]
    if profile.gears:
        keys["gears"] = list(profile.gears)
    keys.update(router.settings())
    keys.update(profile.decoding.settings())
    if profile.description:
        keys["description"] = profile.description
    lines += [f"{key} = {_value(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def _without_profile(text: str, name: str) -> str:
    """The file's text with [profiles.NAME] and its sub-tables (and the comments just above) removed."""
    out: list[str] = []
    skipping = False
    lines = text.splitlines(keepends=True)
    for line in lines:
        table = table_header(line)
        if table is not None:
            skipping = table[:2] == ("profiles", name)
            if skipping:
                while out and out[-1].lstrip().startswith("#") and "mlxswitch calibrate" in out[-1]:
                    out.pop()  # our own comment above the table we replace
        if not skipping:
            out.append(line)
    return "".join(out)


def write_profile(profile: Profile, comment: str) -> Path:
    """Put `profile` into the user's models.toml (replacing a table of that name); its path."""
    path = user_models_toml()
    try:
        old = path.read_text(encoding="utf-8") if path.exists() else ""
    except OSError as exc:
        raise OutputError(f"{path}: cannot read ({exc.strerror or exc})") from None
    kept = _without_profile(old, profile.name).rstrip("\n")
    new = (kept + "\n\n" if kept else "") + profile_table(profile, comment)
    tomllib.loads(new)  # our own text must parse; a failure here is a bug, not the user's
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    with atomic_file(path, "models.toml") as handle:
        handle.write(new)
    try:
        load_profiles().get(profile.name)
    except ConfigError:
        if old:  # never leave the user's file broken
            path.write_text(old, encoding="utf-8")
        else:
            path.unlink()
        raise
    return path
