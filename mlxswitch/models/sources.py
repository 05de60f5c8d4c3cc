"""Where a model source's files are: the embedded default, a local path, or a Hugging Face repo."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelNotFoundError
from ..resources import EMBEDDED_SOURCE, embedded_gguf_path, embedded_gguf_present

EMBEDDED_ALIASES = {"embedded", EMBEDDED_SOURCE}
# What mlx-lm itself fetches for a model; we ask the hub for exactly these.
HUB_PATTERNS = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken",
                "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]


def is_embedded(source: str) -> bool:
    """Whether `source` names the embedded default model."""
    return source.strip().lower() in EMBEDDED_ALIASES


def looks_like_path(source: str) -> bool:
    """Whether `source` is meant as a file system path rather than a hub repo id."""
    return (source.startswith(("/", ".", "~")) or source.lower().endswith(".gguf")
            or source.count("/") != 1 or Path(source).expanduser().exists())


def hub_snapshot(repo_id: str, download: bool = False) -> Path | None:
    """The local snapshot of a Hugging Face repo; None when not cached (download: fetch it then)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached, or cached incompletely
        if not download:
            return None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS))
    except Exception as exc:  # offline, DNS, 404, gated: all end the same way for the user
        raise ModelNotFoundError(
            f"model '{repo_id}' is neither cached locally nor reachable on Hugging Face "
            f"({_short_reason(exc)})") from exc


def _short_reason(exc: Exception) -> str:
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such repository, or it is private/gated"
    if name in ("OfflineModeIsEnabled",) or "offline" in str(exc).lower():
        return "offline mode"
    first_line = (str(exc).strip().splitlines() or [name])[0]
    return f"{name}: {first_line[:120]}"


def local_path(source: str) -> Path | None:
    """The file or directory holding a model's files on this machine; None if not here."""
    if is_embedded(source):
        return embedded_gguf_path() if embedded_gguf_present() else None
    if looks_like_path(source):
        path = Path(source).expanduser()
        return path if path.exists() else None
    return hub_snapshot(source)


def model_available_offline(source: str) -> bool:
    """Whether the model's files are on this machine (embedded, a path, or the HF cache)."""
    return local_path(source) is not None
