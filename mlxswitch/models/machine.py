"""What this machine can hold: memory available to models."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


def available_memory_bytes() -> int:
    """Memory the models may use: MemAvailable on Linux; Metal's working-set limit on macOS."""
    if platform.system() == "Darwin":
        # Unified memory: the GPU may wire about 75% of RAM (Metal's recommended working set).
        try:
            import mlx.core as mx

            from ..kernels.route import current_route

            if current_route().metal:  # asked of MLX once, by the route
                limit = mx.device_info().get("max_recommended_working_set_size")
                if limit:
                    return int(limit)
        except Exception:  # an older MLX without device_info: fall back to the usual 75%
            pass
        try:
            total = int(
                subprocess.run(
                    ["sysctl", "-n", "hw.memsize"], capture_output=True, text=True, timeout=5
                ).stdout.strip()
            )
        except (OSError, ValueError, subprocess.SubprocessError):
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(total * 0.75)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def peak_memory_gb() -> float:
    """An answer's reported peak: MLX's own count misses NumPy copies (the CPU route's fp32
    weights), the process's resident peak misses Metal buffers that are not mapped: the larger."""
    import mlx.core as mx

    return max(mx.get_peak_memory(), process_peak_bytes()) / 1e9


def process_peak_bytes() -> int:
    """The process's peak resident memory so far (NumPy copies, Python and MLX's buffers alike)."""
    import resource
    import sys

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS counts bytes, Linux KiB


def release_thread_state() -> None:
    """Run last on a thread that ran MLX, before it ends: drop its streams and compiled functions.

    MLX keeps each thread's compiled functions in that thread's C++ storage, holding Python
    objects; left to the thread's exit, their release needs the interpreter, and a thread
    ending while the interpreter shuts down aborts the process (SIGABRT, "terminate called
    without an active exception"). Cleared here, under the GIL, the exit has nothing to release.
    """
    import mlx.core as mx

    try:
        mx.synchronize()  # nothing may still run on the streams dropped below
    finally:
        mx.clear_streams()


def release_freed_memory() -> None:
    """Hand memory a load freed back to the system: MLX's buffer cache (the fp32 scales narrowed
    to fp16, rows.py) and the C heap's free lists (glibc's malloc_trim; it had kept ~200 MB of the
    Qwen pair's load resident). Where the C library has no malloc_trim (macOS), the cache only."""
    import ctypes

    import mlx.core as mx

    mx.clear_cache()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
