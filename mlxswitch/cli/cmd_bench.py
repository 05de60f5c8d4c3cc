"""`mlxswitch bench` and `mlxswitch calibrate`: measure the arms, choose the routing setting."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import options as o
from . import ui, ui_tables

# The suites that take each flag beside the profile's and --max-tokens/--json: given to another,
# a flag is refused in one line before anything loads. The one place that says so.
SUITE_FLAGS = {
    "--quick": ("prompts", "humaneval"),
    "--speed-prompts": ("prompts",),
    "--plot": ("prompts", "humaneval"),
    "--prompts": ("prompts", "everyday"),
    "--repeats": ("prompts", "everyday", "peer"),
    "--force-memory": ("prompts", "humaneval", "everyday"),
    "--records": ("humaneval", "everyday"),
    "--restart": ("humaneval", "everyday"),
    "--problems": ("humaneval",),
    "--split": ("humaneval",),
    "--limit": ("humaneval",),
    "--arms": ("humaneval", "everyday", "peer"),
    "--timeout": ("humaneval",),
    "--report": ("humaneval", "everyday"),
    "--shard": ("humaneval",),
    "--with-records": ("humaneval",),
    "--llama-bin": ("peer",),
    "--workloads": ("peer",),
    "--clients": ("peer",),
}
# Why a suite refuses a flag, where a few words help.
_WHY = {
    ("humaneval", f): " (every arm answers every problem once)"
    for f in ("--prompts", "--repeats", "--speed-prompts")
}


def refuse_other_suites_flags(suite: str, given: list[str]) -> None:
    """A UsageError for the first flag in `given` that `suite` does not take (SUITE_FLAGS): on the
    default suite, which suites take it; on a named one, that it does not apply there."""
    from ..errors import UsageError

    for flag in given:
        takes = SUITE_FLAGS[flag]
        if suite in takes:
            continue
        if suite == "prompts":
            named = ", ".join(takes[:-1]) + " or " + takes[-1] if len(takes) > 1 else takes[0]
            raise UsageError(f"{flag} applies to --suite {named} only")
        raise UsageError(f"{flag} does not apply to --suite {suite}{_WHY.get((suite, flag), '')}")


def bench(
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    gears: o.GearsOpt = None,
    prompts: o.PromptsOpt = None,
    quick: Annotated[
        bool,
        typer.Option(help="One prompt per category, one speed prompt, 3 sweep points: about 2 minutes."),
    ] = False,
    repeats: Annotated[
        int,
        typer.Option(help="Repeats of every speed arm (figures: median, min–max); everyday: rounds, pooled."),
    ] = 1,
    max_tokens: o.OptionalMaxTokensOpt = None,
    speed_prompts: Annotated[
        int | None, typer.Option(help="Prompts every speed arm runs (default 4; --quick 1).")
    ] = None,
    json_path: o.JsonFileOpt = None,
    plot: Annotated[
        Path | None, typer.Option(help="Write a two-panel PNG (retained fidelity vs share and vs bytes).")
    ] = None,
    force_memory: o.ForceMemoryOpt = False,
    suite: Annotated[
        str,
        typer.Option(
            help="prompts (the prompt suite), humaneval (pass@1 by execution; needs the humaneval extra),"
            " everyday (everyday requests: seconds per answer against the top tier alone, resumable)"
            " or peer (beside llama.cpp's llama-server on the same GGUF files, through one client)."
        ),
    ] = "prompts",
    records: Annotated[
        Path | None,
        typer.Option(
            help="humaneval: the resumable records file (default: one per profile in the user directory)."
        ),
    ] = None,
    restart: Annotated[
        bool, typer.Option(help="humaneval: start the records file over instead of resuming it.")
    ] = False,
    problems: Annotated[
        str | None, typer.Option(help="humaneval: only these problems (ids or numbers, comma-separated).")
    ] = None,
    split: Annotated[
        str, typer.Option(help="humaneval: calibration (even ids), heldout (odd ids) or all.")
    ] = "all",
    limit: Annotated[
        int | None, typer.Option(help="humaneval: the first N problems (after --problems and --split).")
    ] = None,
    arms: Annotated[
        str | None,
        typer.Option(
            help="humaneval: arm groups among profile, calibrated, verify, ead, peek, random, oracle,"
            " mlx-lm, mlx-lm-fp32, speculative, speculative-ours, speculative-fp32"
            " (bottom and top always run; none: only they); everyday: among top, bottom, profile,"
            " fixed; peer: configs among llama-top, llama-ngram, llama-draft, ours-top, ours-profile."
        ),
    ] = None,
    timeout: Annotated[
        float | None, typer.Option(help="humaneval: seconds each program may run (default 10).")
    ] = None,
    shard: Annotated[
        str | None,
        typer.Option(
            help="humaneval: as I/N, answer only problems I, I+N, I+2N, … of the run: N processes"
            " share one --records file (shard 1 starts it)."
        ),
    ] = None,
    with_records: Annotated[
        list[Path] | None,
        typer.Option(
            help="humaneval: another run's records file of the same models and token budget (for"
            " example the other split, tiers alone; repeatable): the tiers' pass@1 and the"
            " teacher-forced figures also over every problem they answered."
        ),
    ] = None,
    report: Annotated[
        bool,
        typer.Option(
            help="humaneval: the figures from the records file as it stands; loads no model, decodes nothing."
        ),
    ] = False,
    llama_bin: Annotated[
        Path | None,
        typer.Option(
            help="peer: the folder holding llama.cpp's llama-server (default: PATH's; none: skipped)."
        ),
    ] = None,
    workloads: Annotated[
        str | None,
        typer.Option(help="peer: among everyday, humaneval, edit, cold-start (default: the first three)."),
    ] = None,
    clients: Annotated[
        str | None,
        typer.Option(help="peer: concurrent streaming clients per config afterwards, e.g. 1,4,8."),
    ] = None,
) -> None:
    """Does switching pay on this machine? Speed, quality and cost of every arm, side by side."""
    from ..api import build_ladder, resolve_profile
    from ..bench.command import QUICK, check_output_path, choose_prompts, one_tier_note, write_json
    from ..bench.command import bench as run
    from ..bench.runner import BenchOptions
    from ..errors import UsageError

    chosen = resolve_profile(profile, small=small, large=large, model=model, gears=gears)
    if suite not in ("prompts", "humaneval", "everyday", "peer"):
        raise UsageError(f"--suite must be prompts, humaneval, everyday or peer (got '{suite}')")
    for value, flag in (
        (repeats, "--repeats"),
        (max_tokens, "--max-tokens"),
        (speed_prompts, "--speed-prompts"),
    ):
        if value is not None and value < 1:
            raise UsageError(f"{flag} must be at least 1 (got {value})")
    given = {
        "--quick": quick,
        "--speed-prompts": speed_prompts is not None,
        "--plot": plot is not None,
        "--prompts": prompts is not None,
        "--repeats": repeats != 1,
        "--force-memory": force_memory,
        "--records": records is not None,
        "--restart": restart,
        "--problems": problems is not None,
        "--split": split != "all",
        "--limit": limit is not None,
        "--arms": arms is not None,
        "--timeout": timeout is not None,
        "--report": report,
        "--shard": shard is not None,
        "--with-records": bool(with_records),
        "--llama-bin": llama_bin is not None,
        "--workloads": workloads is not None,
        "--clients": clients is not None,
    }
    refuse_other_suites_flags(suite, [flag for flag, was_given in given.items() if was_given])
    if suite == "peer":
        from .peer import bench_peer

        named = (("--profile", profile), ("--small", small), ("--large", large), ("--model", model))
        flags = [part for flag, value in named if value is not None for part in (flag, value)]
        bench_peer(
            chosen,
            flags + (["--gears", gears] if gears is not None else []),
            llama_bin=llama_bin,
            arms=arms,
            workloads=workloads,
            clients=clients,
            rounds=repeats,
            max_tokens=max_tokens,
            json_path=json_path,
        )
        return
    if suite == "everyday":
        from .everyday import bench_everyday

        bench_everyday(
            chosen,
            prompts=prompts,
            records=records,
            restart=restart,
            arms=arms,
            max_tokens=max_tokens,
            json_path=json_path,
            force_memory=force_memory,
            report_only=report,
            rounds=repeats,
        )
        return
    if suite == "humaneval":
        from .humaneval import bench_humaneval

        bench_humaneval(
            chosen,
            quick=quick,
            max_tokens=max_tokens,
            json_path=json_path,
            plot=plot,
            force_memory=force_memory,
            records=records,
            restart=restart,
            problems=problems,
            split=split,
            limit=limit,
            arms=arms,
            timeout=timeout,
            report_only=report,
            shard=shard,
            with_records=with_records,
        )
        return
    check_output_path(json_path, "--json")
    check_output_path(plot, "--plot")
    if plot is not None:
        from ..bench.plot import _pyplot

        _pyplot()  # a missing matplotlib is said now, not after the run
    items = choose_prompts(prompts, quick)
    options = BenchOptions(
        quick=quick,
        repeats=repeats,
        max_tokens=max_tokens or (QUICK["max_tokens"] if quick else 32),
        sweep_points=QUICK["sweep_points"] if quick else 5,
        speed_prompts=speed_prompts or (QUICK["speed_prompts"] if quick else 4),
    )
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        ladder = build_ladder(chosen, progress=progress, force_memory=force_memory)
    with ui.bench_progress() as progress:
        record = run(chosen, ladder, items, options, progress)
    if json_path is not None:
        write_json(record, json_path)
    if plot is not None:
        from ..bench.plot import save_plot

        save_plot(
            record,
            f"mlxswitch bench · {chosen.name} ({' → '.join(ladder.tier_names)}) · "
            f"{record['machine']['backend']} · {ui_tables.bench_counts(record)}",
            plot,
        )
    console = ui.make_console()
    if len(ladder.tiers) < 2:
        console.print(one_tier_note(chosen.name), markup=False, highlight=False, soft_wrap=True)
    console.print(ui_tables.bench_table(record))
    seconds = ui_tables.seconds_table(record, "each arm's answers to the speed prompts, every repeat")
    if seconds is not None:
        console.print(seconds)


def calibrate(
    profile: o.ProfileOpt = None,
    small: o.SmallOpt = None,
    large: o.LargeOpt = None,
    model: o.ModelOpt = None,
    gears: o.GearsOpt = None,
    target_share: Annotated[float | None, typer.Option(help="Wanted share of top-tier tokens (0–1).")] = None,
    target_retained: Annotated[
        float | None,
        typer.Option(help="Wanted retained fidelity (0–1): the cheapest setting reaching it."),
    ] = None,
    write: Annotated[
        bool, typer.Option(help="Store the chosen setting as this profile in your models.toml.")
    ] = False,
    prompts: o.PromptsOpt = None,
    quick: Annotated[bool, typer.Option(help="Two prompts per category and split.")] = False,
    max_tokens: o.MaxTokensOpt = 32,
    json_path: o.JsonFileOpt = None,
    force_memory: o.ForceMemoryOpt = False,
) -> None:
    """Choose policy and threshold for a target share or fidelity; report them on held-out prompts."""
    import dataclasses

    from ..api import build_ladder, resolve_profile
    from ..bench.calibrate import calibrate as run
    from ..bench.command import check_output_path, finite, write_json
    from ..bench.prompts import default_suite_path, load_prompts, select
    from ..decoding.mode import DecodingMode
    from ..errors import UsageError
    from ..profile_edit import write_profile
    from ..routing.router import RouterConfig

    if (target_share is None) == (target_retained is None):
        raise UsageError("give exactly one of --target-share and --target-retained")
    for value, flag in ((target_share, "--target-share"), (target_retained, "--target-retained")):
        if value is not None and not 0 <= value <= 1:
            raise UsageError(f"{flag} must be between 0 and 1 (got {value:g})")
    if max_tokens < 1:
        raise UsageError(f"--max-tokens must be at least 1 (got {max_tokens})")
    chosen = resolve_profile(profile, small=small, large=large, model=model, gears=gears)
    if len(chosen.tier_names()) < 2:
        raise UsageError(f"profile '{chosen.name}' has a single tier: there is nothing to calibrate")
    if write and chosen.name.startswith("ad-hoc"):
        raise UsageError("--write stores the setting in a named profile: give --profile NAME")
    if write and chosen.cloud is not None:
        raise UsageError(
            "--write keeps local profiles only; calibrate the cascade's local ladder as its own profile"
        )
    check_output_path(json_path, "--json")
    items = load_prompts(prompts or default_suite_path())
    calibration = select(items, quick=quick, split="calibration", per_category=2)
    heldout = select(items, quick=quick, split="heldout", per_category=2)
    with ui.loading_status(ui.stderr_is_terminal()) as progress:
        ladder = build_ladder(chosen, progress=progress, force_memory=force_memory, with_probe=False)
    with ui.bench_progress() as progress:
        result = run(
            chosen, ladder, calibration, heldout, target_share, target_retained, max_tokens, progress
        )
    if json_path is not None:
        write_json(finite(result), json_path)
    ui.make_console().print(ui_tables.calibration_report(chosen.name, result))
    if write:
        pick = result["chosen"]
        tiers = len(chosen.tier_names())
        router = RouterConfig(
            up=(pick["tau"],) * (tiers - 1),
            down=(pick["down"],) * (tiers - 1),
            window=pick["window"],
            min_run=pick["min_run"],
            policy=pick["policy"],
            signal=pick["signal"],
        )
        held = result["heldout"]
        note = (
            f"mlxswitch calibrate --target-{'share' if target_share is not None else 'retained'} "
            f"{target_share if target_share is not None else target_retained}: held-out share "
            f"{held['top_share']:.2f}, retained {held['retained']:.2f} (random {held['random_retained']:.2f})"
        )
        # A calibrated profile routes (its thresholds are for the policy, not a verify's drafts).
        routed = dataclasses.replace(chosen, router=router, decoding=DecodingMode())
        path = write_profile(routed, note)
        ui.print_dim(ui.make_console(), f"wrote profile '{chosen.name}' to {path}")
