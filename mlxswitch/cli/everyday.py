"""`mlxswitch bench --suite everyday`: the command's flow, kept out of cmd_bench.py (Rich in ui*.py)."""

from __future__ import annotations

from pathlib import Path

from ..errors import UsageError
from ..profiles import Profile
from . import ui, ui_tables


def bench_everyday(
    profile: Profile,
    *,
    prompts: Path | None,
    records: Path | None,
    restart: bool,
    arms: str | None,
    max_tokens: int | None,
    json_path: Path | None,
    force_memory: bool,
    report_only: bool = False,
    rounds: int = 1,
) -> None:
    """Check every flag, open (or resume) the records, load the ladder, answer, write and print."""
    from ..api import build_ladder
    from ..bench import everyday
    from ..bench.command import check_output_path, write_json
    from ..bench.humaneval.records import default_records_path
    from ..bench.prompts import load_prompts

    if report_only and restart:
        raise UsageError("--report reads the records as they stand; --restart would start them over")
    check_output_path(json_path, "--json")
    chosen_arms = everyday.parse_arms(arms, profile)
    items = load_prompts(prompts or everyday.default_prompts_path())
    if not items:
        raise UsageError(f"{prompts}: no prompts in the file")
    path = records or default_records_path("everyday", profile)
    if report_only and not Path(path).is_file():
        raise UsageError(f"--records {path}: no such file: nothing to report yet")
    run = everyday.open_run(
        profile,
        items,
        chosen_arms,
        max_tokens or everyday.DEFAULT_MAX_TOKENS,
        path,
        restart=restart,
        read_only=report_only,
        rounds=rounds,
    )
    done = len(everyday.answers(run.records))
    held = f" ({'reading' if report_only else 'resuming'}: {done} answers kept)" if done else ""
    ui.print_dim(ui.make_console(stderr=True), f"records: {run.records.path}{held}")
    if report_only:
        record = everyday.report(run)
    else:
        with ui.loading_status(ui.stderr_is_terminal()) as progress:
            ladder = build_ladder(profile, progress=progress, force_memory=force_memory)
        with ui.bench_progress() as progress:
            record = everyday.run(run, ladder, progress)
    if json_path is not None:
        write_json(record, json_path)
    console = ui.make_console()
    for table in ui_tables.everyday_tables(record):
        console.print(table)
