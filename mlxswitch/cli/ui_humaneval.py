"""The result tables of `bench --suite humaneval`: pass@1 per arm, the teacher-forced share →
retained curve and the pooled runs. Rich code, like ui.py."""

from __future__ import annotations

from rich.table import Table

from ..routing.registry import POLICY_BY_NAME
from .ui_tables import cell, literal


def humaneval_table(record: dict) -> Table:
    """HumanEval pass@1 per arm, with its interval, share, speed and the teacher-forced fidelity."""
    table = Table(
        title=literal(
            f"mlxswitch bench --suite humaneval · {record['profile']['name']} · "
            f"{record['machine']['backend']}"
        ),
        show_edge=False,
        title_justify="left",
    )
    for column in (
        "arm",
        "pass@1",
        "95% CI",
        "n",
        "retained",
        "top share",
        "tg tok/s",
        "s/problem",
        "1st tok s",
        "MB/tok",
        "M3 Max bound*",
        "TF retained",
        "TF random",
        "TF oracle",
    ):
        table.add_column(column, justify="left" if column == "arm" else "right")

    for arm in record["arms"]:
        low, high = arm["pass@1_95"]
        tf = arm.get("teacher_forced") or {}
        bound = (arm.get("projection") or {}).get("tok_per_s_bound", {}).get("M3 Max")
        table.add_row(
            arm["name"] + (" · verified" if arm.get("verified") and arm["kind"] != "verify" else ""),
            cell(arm["pass@1"], 3),
            "–" if low is None else f"{low:.2f}–{high:.2f}",
            str(arm["problems"]),
            cell(arm["retained"]),
            cell(arm["top_share"]),
            cell((arm.get("side_by_side") or {}).get("decode_tok_per_s"), 1),
            cell((arm.get("side_by_side") or {}).get("seconds_per_problem"), 1),
            cell((arm.get("side_by_side") or {}).get("median_first_token_s"), 1),
            cell(arm.get("bytes_per_token"), 1, 1e-6),
            cell(bound, 0),
            cell(tf.get("retained")),
            cell(tf.get("random_control")),
            cell(tf.get("oracle")),
        )
    same = [f"{a['name']} {a['reproduces_top']}/{a['problems']}" for a in record["arms"] if a.get("verified")]
    lossless = (
        "verified arms: top share = tokens the top tier made, every token checked by it; "
        f"answers identical to the top tier's: {', '.join(same)}; "
        if same
        else ""
    )
    ours = [
        f"{a['name']} {a['reproduces_tier']}/{a['problems']}"
        for a in record["arms"]
        if "reproduces_tier" in a
    ]
    agreement = f"mlx-lm's answers identical to ours on the same model: {', '.join(ours)}; " if ours else ""
    complete = len(record["complete"])
    calibrated = record.get("calibrated")
    promise = (
        f"calibrated τ {calibrated['tau']:g}: share promised {cell(calibrated['promised_share'])} "
        f"(teacher-forced, {calibrated['problems']} calibration problems), live "
        f"{cell(calibrated['live_share'])}; "
        if calibrated
        else ""
    )
    table.caption = (
        f"{promise}{lossless}{agreement}"
        f"{complete} problem{'' if complete == 1 else 's'} answered by every arm "
        f"({len(record['answered'])} begun; "
        "tg tok/s, s/problem and the median 1st tok s over those), greedy, one sample each; records in "
        f"{literal(str(record['records']))}; retained = (pass − pass_bottom) / (pass_top − pass_bottom) "
        "on the problems all three answered; "
        "TF: teacher-forced along the top tier's answers (NLL), random and oracle at the "
        "arm's share; * projection, not a measurement: M3 Max peak bandwidth ÷ bytes per token"
    )
    return table


def humaneval_curve_table(record: dict, pooled: bool = False) -> Table:
    """Share of top-tier tokens → retained fidelity, teacher-forced, with the controls (EAD's table);
    `pooled`: over every problem this run and its --with-records answered."""
    source = record["pooled"] if pooled else record
    table = Table(
        title="teacher-forced along the top tier's answers: share → retained (NLL gap closed)"
        + (", all runs pooled" if pooled else ""),
        show_edge=False,
        title_justify="left",
    )
    for column in (
        "target share",
        "τ",
        "top share",
        "peek retained",
        "random",
        "oracle",
        "ead τ",
        "ead share",
        "ead retained",
    ):
        table.add_column(column, justify="right")

    for row in source["teacher_forced_curve"]:
        table.add_row(
            cell(row["target_share"]),
            cell(row["tau"], 4),
            cell(row["top_share"]),
            cell(row["retained"]),
            cell(row["random_control"]),
            cell(row["oracle"]),
            cell(row["ead_tau"], 4),
            cell(row["ead_top_share"]),
            cell(row["ead_retained"]),
        )
    window, min_run = POLICY_BY_NAME["ead"].sweep_timing
    table.caption = (
        f"{source['teacher_forced_problems']} problems; "
        "peek decides each position alone (window 1, min run 1), random and oracle at its share; "
        f"ead as published (entropy, window {window}, min run {min_run}) at its threshold nearest the target"
    )
    return table


def humaneval_pooled_table(record: dict) -> Table:
    """The tiers' pass@1 and every arm's teacher-forced figures over all runs' problems pooled."""
    pooled = record["pooled"]
    table = Table(
        title=f"pooled with {literal(', '.join(record['with_records']))}: the tiers over "
        f"{pooled['problems']} problems, teacher-forced over {pooled['teacher_forced_problems']}",
        show_edge=False,
        title_justify="left",
    )
    for column in ("arm", "pass@1", "95% CI", "n", "TF top share", "TF retained", "TF random", "TF oracle"):
        table.add_column(column, justify="left" if column == "arm" else "right")

    for arm in record["arms"]:
        tier = pooled["tiers"].get(arm["name"])
        tf = pooled["teacher_forced"].get(arm["name"]) or {}
        low, high = tier["pass@1_95"] if tier else (None, None)
        table.add_row(
            arm["name"],
            cell(tier["pass@1"], 3) if tier else "",
            "" if low is None else f"{low:.2f}–{high:.2f}",
            str(tier["problems"]) if tier else "",
            cell(tf.get("top_share")),
            cell(tf.get("retained")),
            cell(tf.get("random_control")),
            cell(tf.get("oracle")),
        )
    separating = ", ".join(pooled["separating"]) or "none"
    halves = "".join(
        f"{figures['problems']} {split} problems {cell(figures.get('top_share'))}, "
        for split, figures in pooled["calibrated_by_split"].items()
    )
    shares = f"the calibrated threshold's TF share on {halves.rstrip(', ')}; " if halves else ""
    table.caption = (
        f"the tiers alone differ on: {separating}; {shares}TF: every arm's routing replayed along the top "
        "tier's answers (in-sample on the problems its threshold was calibrated on), random and "
        "oracle at the arm's live share"
    )
    return table
