"""`mlxswitch bench --suite humaneval`: the command's flow, kept out of cmd_bench.py (Rich in ui*.py)."""

from __future__ import annotations

from pathlib import Path

from ..profiles import Profile
from . import ui, ui_humaneval, ui_tables


def bench_humaneval(
    profile: Profile,
    *,
    quick: bool,
    max_tokens: int | None,
    json_path: Path | None,
    plot: Path | None,
    force_memory: bool,
    records: Path | None,
    restart: bool,
    problems: str | None,
    split: str,
    limit: int | None,
    arms: str | None,
    timeout: float | None,
    report_only: bool = False,
    shard: str | None = None,
    with_records: list[Path] | None = None,
) -> None:
    """Check every flag, open (or resume) the records, load the ladder, run, write and print."""
    from ..api import build_ladder
    from ..bench.command import check_output_path, write_json
    from ..bench.humaneval.command import bench_humaneval as run
    from ..bench.humaneval.command import plan, report

    check_output_path(json_path, "--json")
    check_output_path(plot, "--plot")
    if plot is not None:
        from ..bench.plot import _pyplot

        _pyplot()  # a missing matplotlib is said now, not after the run
    chosen = plan(
        profile,
        problems=problems,
        split=split,
        limit=limit,
        arms=arms,
        quick=quick,
        max_tokens=max_tokens or 512,
        timeout_s=timeout,
        records_path=records,
        restart=restart,
        read_only=report_only,
        shard=shard,
        with_records=with_records,
    )
    done = len(chosen.records.results())
    err = ui.make_console(stderr=True)
    held = f" ({'reading' if report_only else 'resuming'}: {done} answers kept)" if done else ""
    ui.print_dim(err, f"records: {chosen.records.path}{held}")
    if report_only:
        record = report(chosen)
    else:
        with ui.loading_status(ui.stderr_is_terminal()) as progress:
            ladder = build_ladder(profile, progress=progress, force_memory=force_memory)
        with ui.bench_progress() as progress:
            record = run(chosen, ladder, progress)
    if json_path is not None:
        write_json(record, json_path)
    if plot is not None:
        from ..bench.humaneval.plot import save_humaneval_plot

        tiers = " → ".join(record["profile"]["tiers"])
        title = (
            f"mlxswitch bench --suite humaneval · {profile.name} ({tiers}) · "
            f"{record['machine']['backend']} · {len(record['complete'])} problems answered by every arm"
        )
        save_humaneval_plot(record, title, plot)
    console = ui.make_console()
    console.print(ui_humaneval.humaneval_table(record))
    over = (
        f"the {len(record['complete'])} problem(s) every arm answered"
        if record["where_seconds"]["problems"] == "complete"
        else "each arm's answers (no problem is answered by every arm yet)"
    )
    seconds = ui_tables.seconds_table(record, over)
    if seconds is not None:
        console.print(seconds)
    if record.get("teacher_forced_curve"):
        console.print(ui_humaneval.humaneval_curve_table(record))
    if record.get("pooled"):
        console.print(ui_humaneval.humaneval_pooled_table(record))
        if record["pooled"]["teacher_forced_curve"]:
            console.print(ui_humaneval.humaneval_curve_table(record, pooled=True))
