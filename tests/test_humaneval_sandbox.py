"""The HumanEval sandbox's known escapes, closed: the low-level aliases of what the guard turns off
(`posix`, `_io`, `io`, `_posixsubprocess`, a fresh import of them) fail like the front ends do, and
a `setsid()` child a program started dies with the run, in a PID namespace or, without one, by
the sweep after it."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path

import pytest
from sandbox_checks import untouched

from mlxswitch.bench.humaneval import execution
from mlxswitch.bench.humaneval.execution import run_program

ALIASES = {
    "posix.fork": "import posix\nposix.fork()\n",
    "posix.system": "import posix\nposix.system('touch ../x')\n",
    "posix.execv": "import posix\nposix.execv('/bin/touch', ['touch', '../x'])\n",
    "posix.posix_spawn": "import posix\nposix.posix_spawn('/bin/touch', ['touch', '../x'], {})\n",
    "posix.unlink": "import posix\nposix.unlink('../../sentinel.txt')\n",
    "posix.remove": "import posix\nposix.remove('../../sentinel.txt')\n",
    "posix.rename": "import posix\nposix.rename('../../sentinel.txt', '../x')\n",
    "posix.kill": "import posix\nposix.kill(posix.getppid() or 1, 9)\n",
    "posix.setsid": "import posix\nposix.setsid()\n",
    "posix.open": "import posix\nposix.open('../x', posix.O_CREAT | posix.O_WRONLY)\n",
    "os.open write flags": "import os\nos.open('../x', os.O_CREAT | os.O_RDWR)\n",
    "os.open dir_fd": (
        "import os\nos.open('x', os.O_CREAT | os.O_WRONLY, dir_fd=os.open('..', os.O_RDONLY))\n"
    ),
    "posix.mkdir": "import posix\nposix.mkdir('../x')\n",
    "_posixsubprocess.fork_exec": "import _posixsubprocess\n_posixsubprocess.fork_exec()\n",
    "_io.open": "import _io\n_io.open('../x', 'w')\n",
    "io.open": "import io\nio.open('../x', 'a')\n",
    "_io.FileIO": "import _io\n_io.FileIO('../x', 'w')\n",
    "io.FileIO": "import io\nio.FileIO('../x', mode='x')\n",
    "_signal.pthread_kill": "import _signal, threading\n_signal.pthread_kill(threading.get_ident(), 9)\n",
    "fresh import posix": "import sys\ndel sys.modules['posix']\nimport posix\nposix.fork()\n",
    "reload posix": "import importlib, posix\nimportlib.reload(posix)\nposix.unlink('../../sentinel.txt')\n",
    "fresh import _io": "import sys\ndel sys.modules['_io']\nimport _io\n_io.open('../x', 'w')\n",
    "fresh import _posixsubprocess": (
        "import sys\nsys.modules.pop('_posixsubprocess', None)\nimport _posixsubprocess\n"
        "_posixsubprocess.fork_exec()\n"
    ),
    "fresh import os": "import sys\ndel sys.modules['os']\nimport os\nos.fork()\n",
    "fresh import subprocess": (
        "import sys\ndel sys.modules['subprocess']\nimport subprocess\nsubprocess.run(['touch', '../x'])\n"
    ),
    "fresh import ctypes": "import sys\ndel sys.modules['ctypes']\nimport ctypes\n",
    "fresh import _ctypes": "import sys\ndel sys.modules['_ctypes']\nimport _ctypes\n",
}


@pytest.mark.parametrize("name", list(ALIASES))
def test_low_level_aliases_are_refused_too(name, sandbox_root):
    result = run_program(ALIASES[name], timeout_s=5, memory_mb=256, root=sandbox_root)
    assert not result.passed
    assert "PermissionError" in result.status or "ModuleNotFoundError" in result.status, result
    untouched(sandbox_root)
    os.kill(os.getpid(), 0)  # this process is still here


def test_import_posix_gives_the_patched_module_and_honest_io_still_works(sandbox_root):
    program = """import os, posix, io, _io, sys, pathlib, tempfile
assert os.open is posix.open and io.open is _io.open is open
del sys.modules['posix']
import posix as again
assert again is posix
os.makedirs('a/b')
with _io.FileIO('a/b/c', 'w') as f:
    f.write(b'x')
with io.open('a/d', 'w') as f:
    f.write('y')
os.close(os.open('e', os.O_CREAT | os.O_WRONLY))
pathlib.Path('f').write_text('z')
assert isinstance(open('f').buffer.raw, _io.FileIO.__mro__[1])
assert open('a/b/c').read() == 'x' and io.open('a/d').read() == 'y'
import __main__
assert not hasattr(__main__, 'token')  # the pass token is no global there
"""
    result = run_program(program, timeout_s=5, root=sandbox_root)
    assert result.passed, result.status
    untouched(sandbox_root)


# The guard alone stops every way to start a process; to show that what a program starts dies
# with it anyway, these runs go without the guard.
UNGUARDED_PRELUDE = r"""
import sys
token = sys.stdin.readline().strip()
exec(compile(open("program.py").read(), "program.py", "exec"), {"__name__": "__candidate__"})
print("\n" + token, flush=True)
"""

DOUBLE_FORK = """import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(FLAG, 'w').write('started')
        os.execv('/bin/sleep', ['sleep', MARK])
    os._exit(0)
os.wait()
"""

NEW_SESSION = """import subprocess
subprocess.Popen(['/bin/sh', '-c', 'echo started > "$0"; exec sleep "$1"', FLAG, MARK],
                 start_new_session=True, stdout=subprocess.DEVNULL)
"""

WAIT_FOR_FLAG = """import os, time
deadline = time.monotonic() + 5
while not os.path.exists(FLAG) and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def _alive_with(mark: str) -> list[int]:
    """Processes (not zombies) whose command line holds `mark`."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cmdline = Path(entry.path, "cmdline").read_bytes()
            state = Path(entry.path, "stat").read_bytes().rpartition(b")")[2].split()[0]
        except OSError:
            continue
        if mark.encode() in cmdline.split(b"\0") and state not in (b"Z", b"X"):
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="reads /proc")
@pytest.mark.parametrize("ending", ["returns", "times out"])
@pytest.mark.parametrize("spawn", ["double fork and setsid", "Popen start_new_session"])
@pytest.mark.parametrize("containment", ["pid namespace", "sweep"])
def test_a_setsid_child_dies_with_the_run(containment, spawn, ending, tmp_path, monkeypatch):
    monkeypatch.setattr(execution, "_PRELUDE", UNGUARDED_PRELUDE)
    if containment == "pid namespace":
        if not execution.pid_namespace_works():
            pytest.skip("unshare --pid is refused here")
        monkeypatch.setattr(execution, "_kill_leftovers", lambda *args, **kwargs: None)  # namespace only
    else:
        real = execution._unshare_works
        monkeypatch.setattr(execution, "_unshare_works", lambda *flags: "--pid" not in flags and real(*flags))
    flag = tmp_path / "started"
    mark = f"30.{secrets.randbelow(10**9):09d}"  # sleep's argument: 30 s, and a name to find it by
    body = DOUBLE_FORK if spawn.startswith("double") else NEW_SESSION
    program = f"FLAG, MARK = {str(flag)!r}, {mark!r}\n" + body + WAIT_FOR_FLAG
    if ending == "times out":
        program += "while True:\n    pass\n"
    try:
        result = run_program(program, timeout_s=2, root=tmp_path)
        assert result.passed == (ending == "returns"), result.status
        assert flag.read_text().strip() == "started"  # the child did start
        time.sleep(1)
        assert _alive_with(mark) == []
    finally:
        for pid in _alive_with(mark):  # a failed run leaves no sleeper behind
            os.kill(pid, 9)
