"""Compiling a kernel's C source once per machine: cached by source, compiler and flags.

A later process loads the cached library (milliseconds) instead of compiling again (a second or
more). The cache lives under the user's cache directory; a library is written under a temporary
name and renamed when whole, so two processes compiling at once never load half a file.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..resources import cache_dir


def _compiler_identity(compiler: str) -> str:
    # The version line keys the cache too: an upgraded compiler compiles again.
    try:
        done = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30)
        return done.stdout.splitlines()[0] if done.stdout else ""
    except (OSError, subprocess.SubprocessError, IndexError):
        return ""


def library_key(source: Path, compiler: str, flags: tuple[str, ...]) -> str:
    """The cache key of one build: the source's bytes, the compiler (path and version), the flags."""
    digest = hashlib.sha256(source.read_bytes())
    digest.update("\0".join((compiler, _compiler_identity(compiler), *flags)).encode())
    return digest.hexdigest()[:20]


def kernels_cache() -> Path:
    """Where compiled kernels are kept on this machine."""
    return cache_dir() / "kernels"


def compile_cached(
    source: Path, compiler: str, flag_sets: tuple[tuple[str, ...], ...]
) -> tuple[ctypes.CDLL, tuple[str, ...], bool] | str:
    """(library, flags, whether it came from the cache) for the first flag set that compiles, or
    why none did. A cached library of the same key is loaded instead of compiling."""
    last_error = "no message"
    folder = kernels_cache()
    for flags in flag_sets:
        target = folder / f"{source.stem}-{library_key(source, compiler, flags)}.so"
        if target.exists():
            try:
                return ctypes.CDLL(str(target)), flags, True
            except OSError:
                pass  # a damaged cache entry: compile it again below
        try:
            folder.mkdir(parents=True, exist_ok=True)
            handle, partial = tempfile.mkstemp(prefix=f".{source.stem}-", suffix=".so", dir=folder)
            os.close(handle)
        except OSError:
            # No writable cache: compile into a temporary directory and load from there.
            partial = tempfile.mkstemp(prefix=f"mlxswitch-{source.stem}-", suffix=".so")[1]
            target = Path(partial)
        command = [compiler, *flags, "-shared", "-fPIC", "-o", partial, str(source)]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.SubprocessError) as error:
            Path(partial).unlink(missing_ok=True)
            return f"{compiler} did not run ({error})"
        if done.returncode != 0:
            Path(partial).unlink(missing_ok=True)
            last_error = (done.stderr.strip().splitlines() or ["no message"])[-1]
            continue
        if Path(partial) != target:
            os.replace(partial, target)
        try:
            return ctypes.CDLL(str(target)), flags, False
        except OSError as error:
            return f"the compiled kernel did not load ({error})"
    return f"{compiler} failed ({last_error})"


@dataclass(frozen=True)
class Compiled:
    """A kernel library compiled (or loaded from the cache) on this machine."""

    library: ctypes.CDLL
    compiler: str
    flags: tuple[str, ...]
    cached: bool

    def detail(self, threaded: bool, checked_against: str, pool: str = "OpenMP threads") -> str:
        """How it was built, for `mlxswitch doctor` (pool: what runs its threads)."""
        threads = pool if threaded else "one thread (no OpenMP)"
        where = "cached build" if self.cached else "compiled now"
        return (
            f"{Path(self.compiler).name} {' '.join(self.flags)} ({where}), {threads}, "
            f"checked against {checked_against}"
        )


def compile_source(source: Path, flag_sets: tuple[tuple[str, ...], ...]) -> Compiled | str:
    """The machine's C compiler (cc, else gcc or clang) on `source` through the cache, or why not."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    built = compile_cached(source, compiler, flag_sets)
    if isinstance(built, str):
        return built
    library, flags, cached = built
    return Compiled(library, compiler, flags, cached)
