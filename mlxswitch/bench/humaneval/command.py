"""What `mlxswitch bench --suite humaneval` does below the CLI: choose, check, run, summarize."""

from __future__ import annotations

import dataclasses
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from ...errors import UsageError
from ...profiles import Profile
from ..command import machine, versions
from . import arms as arm_sets
from .problems import Problem, load_problems, select_problems
from .records import Records, default_records_path
from .report import summarize
from .run import HumanEvalOptions, Progress, run_humaneval, settings

QUICK = {"sweep_points": 3, "threshold_problems": 2}


@dataclass
class HumanEvalPlan:
    """A checked run, before any model loads: problems, options and the opened records file."""

    profile: Profile
    problems: list[Problem]
    calibration: list[Problem]
    options: HumanEvalOptions
    records: Records
    shard: tuple[int, int] = (1, 1)  # (I, N): this process answers problems I, I+N, … of the run
    pooled: list[Records] = dataclasses.field(default_factory=list)  # other runs of the same tiers


def parse_shard(text: str | None) -> tuple[int, int]:
    """`--shard I/N` as (I, N), 1 ≤ I ≤ N; none given is (1, 1), the whole run."""
    if text is None:
        return (1, 1)
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match or not 1 <= int(match[1]) <= int(match[2]):
        raise UsageError(f"--shard must be I/N with 1 ≤ I ≤ N, e.g. 2/2 (got '{text}')")
    return int(match[1]), int(match[2])


def plan(
    profile: Profile,
    problems: str | None = None,
    split: str = "all",
    limit: int | None = None,
    arms: str | None = None,
    quick: bool = False,
    max_tokens: int = 512,
    timeout_s: float | None = None,
    records_path: Path | None = None,
    restart: bool = False,
    read_only: bool = False,
    shard: str | None = None,
    with_records: list[Path] | None = None,
) -> HumanEvalPlan:
    """Check every choice and open the records (settings compared) — nothing is loaded yet."""
    index, count = parse_shard(shard)
    if shard is not None and read_only:
        raise UsageError("--shard does not apply to --report (it reads every shard's answers)")
    if index > 1 and restart:
        raise UsageError(f"--restart with --shard {index}/{count}: only shard 1/{count} starts records over")
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 (got {max_tokens})")
    if timeout_s is not None and not timeout_s > 0:
        raise UsageError(f"--timeout must be a positive number of seconds (got {timeout_s:g})")
    groups = arm_sets.parse_groups(arms, quick)
    if arms is not None:  # all, or --quick: the groups this ladder has arms for
        arm_sets.refuse_unrunnable(groups, profile)
    every = load_problems()
    chosen = select_problems(every, problems, split, limit)
    options = HumanEvalOptions(
        max_tokens=max_tokens,
        groups=groups,
        timeout_s=timeout_s or HumanEvalOptions.timeout_s,
        **(QUICK if quick else {}),
    )
    # Thresholds come from the calibration half: the problems run from it, else its first ones.
    calibration = (
        [p for p in chosen if p.split == "calibration"] or [p for p in every if p.split == "calibration"]
    )[: options.threshold_problems]
    path = records_path or default_records_path("humaneval", profile)
    if records_path is None:
        path.parent.mkdir(parents=True, exist_ok=True)
    wanted = settings(profile, chosen, options)
    records = Records.open(path, wanted, restart, read_only)
    if records.header is not None:
        arm_sets.refuse_unaddable(groups, records.header, path)
    if index > 1 and records.header is None:
        raise UsageError(
            f"--shard {index}/{count}: {path} is not started yet; start shard 1/{count} first, "
            "and this one once the records file has its first line"
        )
    if any(Path(other).expanduser().resolve() == path.expanduser().resolve() for other in with_records or []):
        raise UsageError(f"--with-records {path} is the --records file itself")
    pooled = [Records.pooled_with(other, wanted) for other in with_records or []]
    return HumanEvalPlan(profile, chosen, calibration, options, records, (index, count), pooled)


def bench_humaneval(run: HumanEvalPlan, ladder, progress: Progress | None = None) -> dict:
    """Run what is left, then the full record: settings, machine, figures (from the records)."""
    try:
        run_humaneval(
            run.profile, ladder, run.problems, run.calibration, run.options, run.records, progress, run.shard
        )
    finally:
        run.records.close()
    # The file as it stands now: other shards' answers too, not only those this process saw.
    assert run.records.header is not None  # the run wrote it, or found it
    run.records = Records.open(run.records.path, run.records.header["settings"], read_only=True)
    return report(run)


def report(run: HumanEvalPlan) -> dict:
    """The full record from the records file as it stands (no model needed): a run so far, or done."""
    header = run.records.header
    if header is None:
        raise UsageError(f"--report: {run.records.path} holds no answers yet (run without --report first)")
    derived = header["derived"]
    return {
        "command": ["mlxswitch", *sys.argv[1:]],
        "machine": machine(),
        "versions": versions(),
        "profile": {
            "name": run.profile.name,
            "mode": run.profile.mode,
            "models": list(run.profile.models),
            "tiers": derived["tier_names"],
            "bytes_per_token": dict(zip(derived["tier_names"], derived["bytes_per_token"], strict=True)),
        },
        "records": str(run.records.path),
        "with_records": [str(other.path) for other in run.pooled],
        "settings": header["settings"],
        "derived": derived,
        **summarize(header, run.records.lines, [other.lines for other in run.pooled]),
    }
