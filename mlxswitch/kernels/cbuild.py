"""Compiling a kernel's C source once per machine: cached by source, compiler and flags.

A later process loads the cached library (milliseconds) instead of compiling again (a second or
more). The cache lives under the user's cache directory; a library is written under a temporary
name and renamed when whole, so two processes compiling at once never load half a file.

A library's check (its float64 reference) passes or fails the same way on the same bytes, CPU
and checking code, so a pass is kept beside the library (`Compiled.checked_before`): a later
process on this machine loads a checked library without running the check again (~0.23 s of the
quantized kernel's, at every start). Another library, CPU, checking code, MLX or NumPy is checked
again; a failure is never kept.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

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
) -> tuple[ctypes.CDLL, Path, tuple[str, ...], bool] | str:
    """(library, its file, flags, whether it came from the cache) for the first flag set that
    compiles, or why none did. A cached library of the same key is loaded instead of compiling."""
    last_error = "no message"
    folder = kernels_cache()
    for flags in flag_sets:
        target = folder / f"{source.stem}-{library_key(source, compiler, flags)}.so"
        if target.exists():
            try:
                return ctypes.CDLL(str(target)), target, flags, True
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
            return ctypes.CDLL(str(target)), target, flags, False
        except OSError as error:
            return f"the compiled kernel did not load ({error})"
    return f"{compiler} failed ({last_error})"


@dataclass(frozen=True)
class Compiled:
    """A kernel library compiled (or loaded from the cache) on this machine."""

    library: ctypes.CDLL
    path: Path
    compiler: str
    flags: tuple[str, ...]
    cached: bool
    checked_earlier: bool = False  # its check's pass was kept by an earlier process (checked_before)

    def check_mark(self, checked_by: tuple[Path, ...]) -> Path:
        """Where a pass of this library's check is kept: keyed by the library's bytes, the code that
        checks it (`checked_by`), this CPU and the versions of the libraries that compute the
        references."""
        from importlib import metadata

        digest = hashlib.sha256(self.path.read_bytes())
        for source in checked_by:
            digest.update(source.read_bytes())
        versions = [metadata.version(name) for name in ("mlx", "numpy")]
        digest.update("\0".join((cpu_identity(), platform.python_version(), *versions)).encode())
        return self.path.with_name(f"{self.path.stem}.checked-{digest.hexdigest()[:20]}")

    def checked_before(self, checked_by: tuple[Path, ...]) -> bool:
        """Whether this library passed its check (by the code in `checked_by`) in an earlier process
        on this machine (remember_checked)."""
        try:
            return self.check_mark(checked_by).exists()
        except OSError:  # the library's file went away: check it here
            return False

    def remember_checked(self, checked_by: tuple[Path, ...]) -> None:
        """Keep that this library passed its check, for later processes (an empty file; skipped
        where the cache cannot be written: they check again)."""
        with contextlib.suppress(OSError):
            self.check_mark(checked_by).touch()

    def detail(self, threaded: bool, checked_against: str, pool: str = "OpenMP threads") -> str:
        """How it was built, for `mlxswitch doctor` (pool: what runs its threads)."""
        threads = pool if threaded else "one thread (no OpenMP)"
        where = "cached build" if self.cached else "compiled now"
        when = " (a pass kept from an earlier process)" if self.checked_earlier else ""
        return (
            f"{Path(self.compiler).name} {' '.join(self.flags)} ({where}), {threads}, "
            f"checked against {checked_against}{when}"
        )


def compile_source(source: Path, flag_sets: tuple[tuple[str, ...], ...]) -> Compiled | str:
    """The machine's C compiler (cc, else gcc or clang) on `source` through the cache, or why not."""
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        return "no C compiler (cc, gcc or clang) on PATH"
    built = compile_cached(source, compiler, flag_sets)
    if isinstance(built, str):
        return built
    library, path, flags, cached = built
    return Compiled(library, path, compiler, flags, cached)


def cpu_identity() -> str:
    """This CPU's model and instruction set, as the kernel's build and check depend on them."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return f"{platform.machine()} {platform.processor()}"
    wanted = ("model name", "flags", "Features", "CPU part")  # x86, then Arm's names
    first: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    return "|".join([platform.machine(), *(first.get(key, "") for key in wanted)])


Face = TypeVar("Face")


def build_checked(
    source: Path,
    flag_sets: tuple[tuple[str, ...], ...],
    face: Callable[[Compiled], Face],
    check: Callable[[Face], str | None],
    checked_by: tuple[Path, ...],
) -> tuple[Face, Compiled] | str:
    """A kernel's life cycle once compiled: `source` compiled (or loaded from the cache), its Python
    face made (`face(built)`), and checked (`check(made)`: None, or what differed) unless an earlier
    process kept a pass for this library and `checked_by` (Compiled.checked_before); or why not."""
    built = compile_source(source, flag_sets)
    if isinstance(built, str):
        return built
    try:
        made = face(built)
    except AttributeError as error:  # a source without the functions the face calls
        return f"the compiled kernel lacks a function ({error})"
    if built.checked_before(checked_by):
        return made, replace(built, checked_earlier=True)
    mismatch = check(made)
    if mismatch is not None:
        return f"check failed: {mismatch}"
    built.remember_checked(checked_by)
    return made, built
