"""Files we write for the user, written whole or not at all: a temporary twin, renamed at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from .errors import OutputError


def _mode_for(path: Path) -> int:
    # mkstemp makes 0600 files; a replaced file keeps its mode, a new one follows the umask.
    if path.exists():
        return path.stat().st_mode & 0o777
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def open_temporary(path: Path, what: str, binary: bool = False) -> tuple[IO, Path]:
    """A new file beside `path`, open for writing; OutputError naming `what` when it cannot be made."""
    if path.is_dir():
        raise OutputError(f"{what} {path}: is a directory")
    try:
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
        os.chmod(temporary, _mode_for(path))
    except OSError as exc:
        raise OutputError(f"{what} {path}: cannot write there ({exc.strerror or exc})") from None
    handle = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8")
    return handle, Path(temporary)


def commit(temporary: Path, path: Path, what: str) -> None:
    """Put the finished temporary file in place of `path` (one rename: never half-written)."""
    try:
        os.replace(temporary, path)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None


@contextlib.contextmanager
def atomic_file(path: Path, what: str, binary: bool = False) -> Iterator[IO]:
    """Write `path` through its temporary twin: in place at the end, gone after any error."""
    path = Path(path).expanduser()
    handle, temporary = open_temporary(path, what, binary)
    try:
        with handle:
            yield handle
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise OutputError(f"{what} {path}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    commit(temporary, path, what)


@contextlib.contextmanager
def atomic_dir(path: Path, replace: bool = False) -> Iterator[Path]:
    """Fill a temporary directory beside `path`, renamed to it at the end, gone after any error.

    An existing `path` is replaced only with `replace`; otherwise the finished twin is dropped
    (another process got there first with the same content).
    """
    path = Path(path).expanduser()
    staging = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.partial-", dir=path.parent))
        yield staging
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp makes 0700; what we write is for everyone
        if path.exists() and replace:
            shutil.rmtree(path)
        if not path.exists():
            staging.rename(path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
