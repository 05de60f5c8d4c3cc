"""The result tables of bench (the prompts and everyday suites, and where the seconds went) and
calibrate, and the cell helpers (`literal`, `cell`) the other UI modules share. Rich code, like ui.py."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table


def literal(value):
    """`value` (a string, or lists and tuples of them) escaped so Rich prints it as written: a
    table cell or title is markup, and `pip install 'mlxswitch[qwen-coder]'` would lose `[qwen-coder]`."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, (list, tuple)):
        return type(value)(literal(item) for item in value)
    return value


def cell(value, digits: int = 2, scale: float = 1.0) -> str:
    """A figure for a table: "–" for a missing one (None, or NaN)."""
    return "–" if value is None or value != value else f"{value * scale:.{digits}f}"


def _median(figures: dict, key: str, scale: float = 1.0, digits: int = 1) -> str:
    return cell((figures.get(key) or {}).get("median"), digits, scale)


def bench_counts(record: dict) -> str:
    """What the bench's figures rest on, said the same way in the table's caption and the plot's
    title: the speed prompts and repeats, and (with two tiers or more) the teacher-forced prompts."""
    speed = len(record["speed_prompts"])
    out = f"speed: {record['options']['repeats']} repeat(s) of {speed} prompt(s)"
    if len(record["profile"]["tiers"]) > 1:
        out += (
            f"; retained: teacher-forced along the top tier's answers to {len(record['positions'])} prompt(s)"
        )
    return out


def _checked(record: dict) -> bool:
    """Whether any arm scored an answer (the speed prompts include a checkable one)."""
    return any(_figure(arm["speed"], "accuracy") is not None for arm in record["arms"])


def _figure(figures: dict, key: str):
    value = (figures.get(key) or {}).get("median")
    return None if value is None or value != value else value


def bench_table(record: dict) -> Table:
    """The bench's table: one row per arm, speed and quality side by side. One tier has nothing to
    route: no share, fidelity, controls, switches or overhead; no `acc` where no answer is checkable."""
    switching = len(record["profile"]["tiers"]) > 1
    checked = _checked(record)
    table = Table(
        title=literal(f"mlxswitch bench · {record['profile']['name']} · {record['machine']['backend']}"),
        show_edge=False,
        title_justify="left",
    )
    columns = {
        "arm": lambda arm, q, s, bound: arm["name"],
        "top share": lambda arm, q, s, bound: cell(q["top_share"]),
        "retained": lambda arm, q, s, bound: cell(q["retained"]),
        "random@share": lambda arm, q, s, bound: cell((arm.get("random_control") or {}).get("mean")),
        "oracle@share": lambda arm, q, s, bound: cell(arm.get("oracle")),
        "agree": lambda arm, q, s, bound: _median(s, "agreement", digits=2),
        "acc": lambda arm, q, s, bound: _median(s, "accuracy", digits=2),
        "pp tok/s": lambda arm, q, s, bound: _median(s, "prompt_tok_per_s"),
        "tg tok/s": lambda arm, q, s, bound: _median(s, "decode_tok_per_s"),
        "TTFT s": lambda arm, q, s, bound: _median(s, "first_token_s", digits=2),
        "peak GB": lambda arm, q, s, bound: _median(s, "peak_memory_gb", digits=2),
        "sw/100": lambda arm, q, s, bound: _median(s, "switches_per_100"),
        "MB/tok": lambda arm, q, s, bound: _median(s, "bytes_per_token", 1e-6),
        "overhead": lambda arm, q, s, bound: _median(s, "overhead", digits=2),
        "M3 Max bound*": lambda arm, q, s, bound: cell(bound, 0),
    }
    routing = ("top share", "retained", "random@share", "oracle@share", "sw/100", "overhead")
    shown = [name for name in columns if (switching or name not in routing) and (checked or name != "acc")]
    for column in shown:
        table.add_column(column, justify="left" if column == "arm" else "right")

    for arm in record["arms"]:
        q, s = arm["quality"], arm["speed"]
        bound = (arm.get("projection") or {}).get("tok_per_s_bound", {}).get("M3 Max")
        table.add_row(*(columns[name](arm, q, s, bound) for name in shown))
    auroc = record.get("auroc") or {}
    checkable = (
        f"acc: share right of the answers to the {record.get('checkable_speed_prompts', 0)} checkable "
        "speed prompt(s); "
        if checked
        else ""
    )
    routed = (
        f"AUROC of bottom entropy for '{auroc.get('label', '')}': {cell(auroc.get('entropy'))}; "
        if switching
        else ""
    )
    table.caption = (
        f"{bench_counts(record)}; speed figures: median over repeats; {checkable}{routed}"
        "* projection, not a measurement: M3 Max peak bandwidth ÷ weight bytes per token"
    )
    return table


def seconds_table(record: dict, over: str) -> Table | None:
    """Where the seconds went: per arm, summed over its answers (`over` says which), the bottom
    model's passes, the top model's by rows, prefill, the rest, the total and the floor; None
    where no arm has a figure."""
    arms = [a for a in record["arms"] if a.get("seconds") and a["seconds"]["answers"]]
    if not arms:
        return None
    from ..bench.seconds import BUCKETS

    models = record["where_seconds"]["models"]
    bottom, top = models["bottom"], models["top"]
    two = bottom != top
    buckets = ["1"] + [b for b in BUCKETS[1:] if any((a["seconds"]["top_s"] or {}).get(b) for a in arms)]
    lookup = any(a["seconds"]["sources"] for a in arms)
    table = Table(title="where the seconds went", show_edge=False, title_justify="left")
    header = ["arm", *([f"{bottom} s"] if two else [])]
    header += [f"{top} {'1-row' if b == '1' else b + ' rows'} s" for b in buckets]
    header += [
        "prefill s",
        "rest s",
        "total s",
        "floor s",
        "×floor",
        *(["drafted"] if lookup else []),
        "M3 Max s*",
    ]
    for column in header:
        table.add_column(literal(column), justify="left" if column == "arm" else "right")
    for arm in arms:
        w = arm["seconds"]
        top_s = w["top_s"] or {}
        projected = (w.get("projection") or {}).get("seconds", {}).get("M3 Max")
        row = [arm["name"], *([cell(w["bottom_s"])] if two else [])]
        row += [cell(top_s.get(b)) if w["top_s"] is not None else "–" for b in buckets]
        row += [
            cell(w["prefill_s"]),
            cell(w["rest_s"]),
            cell(w["total_s"]),
            cell(w["floor_s"]),
            cell(w["over_floor"]),
        ]
        if lookup:
            row.append(", ".join(f"{n} {k}" for k, n in sorted(w["sources"].items())) or "–")
        row.append("–" if projected is None else f"{projected:.3g}")
        table.add_row(*map(literal, row))
    floor = (
        f"floor: every token at {record['profile']['tiers'][0]} alone's seconds per token, with its "
        f"prompt pass{f' and the {top} prefill (it must read the prompt)' if two else ''}; "
        "×floor = total ÷ floor; "
    )
    table.caption = (
        f"summed over {over}; passes timed to the moment their result was read, rest = sampling, "
        f"signals, Python (what no pass claimed); – = no pass ledger (mlx-lm, or an older record); {floor}"
        "* projection, not a measurement: passes × the model's weight bytes ÷ M3 Max peak bandwidth "
        "(each pass reads the weights once)"
    )
    return table


def calibration_report(name: str, result: dict) -> Table:
    """What calibrate chose, and how it does on text it never saw."""
    pick, held = result["chosen"], result["heldout"]
    table = Table(
        title=literal(f"mlxswitch calibrate · {name} · {' → '.join(result['tiers'])}"),
        show_header=False,
        show_edge=False,
        title_justify="left",
    )
    table.add_column(style="bold")
    table.add_column()

    def num(value, digits: int = 3) -> str:
        return "–" if value is None or value != value else f"{value:.{digits}f}"

    table.add_row(
        "chosen",
        f"--policy {pick['policy']} --tau {pick['tau']:g} --tau-down {pick['down']:g} "
        f"--window {pick['window']} --min-run {pick['min_run']} (signal: {pick['signal']})",
    )
    cal = pick["calibration"]
    table.add_row(
        "calibration",
        f"share {num(cal['top_share'], 2)} · retained {num(cal['retained'])} "
        f"({len(result['prompts']['calibration'])} prompts, {cal['positions']} positions)",
    )
    table.add_row(
        "held-out",
        f"share {num(held['top_share'], 2)} · retained {num(held['retained'])} · "
        f"random at that share {num(held['random_retained'])} "
        f"(×{num(held['vs_random'], 2)}) · oracle {num(held['oracle_retained'])} · "
        f"{held['bytes_per_token'] / 1e6:.1f} MB/token "
        f"({len(result['prompts']['heldout'])} prompts, {held['positions']} positions)",
    )
    for signal, best in result.get("per_signal_heldout", {}).items():
        if "top_share" in best:
            table.add_row(
                f"best on {signal}",
                f"--policy {best['policy']} --tau {best['tau']:g}: held-out share "
                f"{num(best['top_share'], 2)} · retained {num(best['retained'])} "
                f"(random {num(best['random_retained'])})",
            )
        else:
            table.add_row(f"best on {signal}", literal(best.get("status", "")))
    for split in ("heldout", "calibration"):
        aurocs = result[f"auroc_{split}"]
        table.add_row(f"AUROC {split}", " · ".join(f"{signal} {num(v)}" for signal, v in aurocs.items()))
    learned = result.get("probe") or {}
    if learned.get("status") == "trained":
        table.add_row(
            "probe",
            f"{learned['features']} features, hidden state on {learned['components']} "
            f"principal components, L2 {learned['l2']:g} (by CV over prompts) · "
            f"AUROC held-out {num(learned['auroc_heldout'])}, calibration out-of-fold "
            f"{num(learned['auroc_calibration_out_of_fold'])} · "
            f"{learned['cost_s_per_token'] * 1e6:.0f} µs a token "
            f"({100 * learned['cost_share_of_cheap_step']:.2f}% of a cheap step) · "
            f"saved {literal(str(learned['path']))} (--signal probe --policy peek)",
        )
    elif learned:
        table.add_row("probe", literal(learned.get("status", "")))
    return table


def everyday_tables(record: dict) -> tuple[Table, Table, Table]:
    """The everyday suite: per category, each arm's seconds per answer (× the top tier alone's);
    then per arm, its answers, tokens, answers identical to the top tier's, first token and who
    proposed the tokens; then per arm where its seconds went (passes by model and rows)."""
    arms = record["arms"]
    timed = Table(
        title=literal(f"mlxswitch bench --suite everyday · {record['profile']['name']}"),
        show_edge=False,
        title_justify="left",
    )
    for column in ("category", "answers", *(f"{a} s/answer" for a in arms)):
        timed.add_column(literal(column), justify="left" if column == "category" else "right")
    for row in record["categories"]:
        cells = [row["category"], str(row["answers"])]
        for a in arms:
            ratio = row["vs_top"][a]
            shown = f" ({ratio:.2f}×)" if ratio is not None and a != "top" else ""
            cells.append(cell(row["seconds_per_answer"][a], 1) + shown)
        timed.add_row(*map(literal, cells))
    rounds = record["rounds"]
    over = f"{record['prompts']} prompt(s) every arm answered" + (
        f", in {rounds} rounds (each prompt's arms in another order each round), pooled" if rounds > 1 else ""
    )
    by_round = [
        f"{a} "
        + ", ".join(f"{r['vs_top'][a]:.2f}×" for r in record["by_round"] if r["vs_top"][a] is not None)
        for a in arms
        if a != "top" and rounds > 1
    ]
    timed.caption = (
        f"greedy, {record['max_tokens']} tokens at most; wall seconds per answer, prompt included, over the "
        f"{over}; arms rotated prompt by prompt; (×) against the top tier alone"
        + (f"; round by round: {'; '.join(by_round)}" if by_round else "")
    )
    per_arm = Table(show_edge=False)
    for column in ("arm", "answers", "tokens", "same as top", "first token s", "proposed by"):
        per_arm.add_column(column, justify="left" if column in ("arm", "proposed by") else "right")
    for a in arms:
        figures = record["per_arm"][a]
        tokens = figures["tokens"] or 1
        shares = [f"{name} {100 * n / tokens:.0f}%" for name, n in figures["proposers"].items() if n]
        same = figures["same_as_top"]
        per_arm.add_row(
            *map(
                literal,
                [
                    a,
                    str(figures["answers"]),
                    str(figures["tokens"]),
                    "–" if same is None else f"{same}/{figures['answers']}",
                    cell(figures["median_first_token_s"], 2),
                    ", ".join(shares) or "–",
                ],
            )
        )
    return timed, per_arm, _everyday_seconds(record)


def _everyday_seconds(record: dict) -> Table:
    """Per arm, its passes by model and rows (a step is 1 row, a check or a draft's catch-up
    more, a prompt's prefill) and what no pass claimed, summed over the answers."""
    table = Table(show_edge=False)
    for column in ("arm", "pass", "passes", "rows", "seconds", "share"):
        table.add_column(column, justify="left" if column in ("arm", "pass") else "right")
    for a in record["arms"]:
        passes = record["per_arm"][a]["passes"]
        total = sum(e["seconds"] for k, e in passes.items() if k != "rest_s") + passes["rest_s"]
        entries = [(k, e) for k, e in passes.items() if k != "rest_s"]
        for i, (key, entry) in enumerate(entries):
            share = f"{100 * entry['seconds'] / total:.0f}%" if total else "–"
            table.add_row(
                *map(
                    literal,
                    [
                        a if i == 0 else "",
                        key,
                        str(entry["passes"]),
                        str(entry["rows"]),
                        cell(entry["seconds"], 1),
                        share,
                    ],
                )
            )
        rest = f"{100 * passes['rest_s'] / total:.0f}%" if total else "–"
        table.add_row(*map(literal, ["" if entries else a, "rest", "", "", cell(passes["rest_s"], 1), rest]))
    nets = [
        f"{a}: checks gave {d['check_tokens']} tokens for {d['check_s']:.1f} s of checks and "
        f"{d['draft_s']:.1f} s of drafts, a step being {1e3 * d['step_s']:.0f} ms: {d['saved_s']:+.1f} s, "
        f"{d['vs_one_a_step']:.2f}× its time a step a token"
        for a in record["arms"]
        if (d := record["per_arm"][a].get("drafting"))
    ]
    table.caption = (
        "where the seconds went, summed over the answers: each model pass by its rows (decoding/ledger.py)"
        + (
            f". Drafting's net by the arm's own passes (a projection, not a measurement): {'; '.join(nets)}"
            if nets
            else ""
        )
    )
    return table


def peer_tables(record: dict, max_tokens: int) -> list[Table]:
    """The peer suite: per workload each config's seconds, tokens/s, first token and answers equal
    to its program's top model alone; the concurrent clients' tokens/s; each config's load."""
    tables = []
    for name, rows in record["workloads"].items():
        cold = name == "cold-start"
        table = Table(
            title=literal(f"mlxswitch bench --suite peer · {name}"), show_edge=False, title_justify="left"
        )
        columns = (
            ("config", "runs", "first token s", "exit s")
            if cold
            else (
                "config",
                "answers",
                "seconds",
                "tokens",
                "tokens/s",
                "first token s",
                "same as its top alone",
            )
        )
        for column in columns:
            table.add_column(literal(column), justify="left" if column == "config" else "right")
        for row in rows:
            same = f"{row['same_as_top']}/{row['answers']}" if "same_as_top" in row else "–"
            if cold:
                cells = [row["config"], str(row["answers"]), cell(row["first_s"]), cell(row.get("exit_s"))]
            else:
                cells = [
                    row["config"],
                    str(row["answers"]),
                    cell(row["seconds"], 1),
                    str(row["tokens"]),
                    cell(row["tokens_per_s"]),
                    cell(row["first_s"]),
                    same,
                ]
            table.add_row(*map(literal, cells))
        table.caption = (
            "a cold process to its first token (median); ours: `mlxswitch chat -p`, start to the first "
            "byte and to exit"
            if cold
            else f"greedy, one streaming client, {max_tokens} tokens at most (edit: 3×); seconds summed "
            "over the requests"
        )
        tables.append(table)
    levels = sorted({int(level) for figures in record["clients"].values() for level in figures})
    if levels:
        table = Table(show_edge=False)
        for column in ("config", *(f"{n} clients tok/s" for n in levels)):
            table.add_column(literal(column), justify="left" if column == "config" else "right")
        for config, figures in record["clients"].items():
            table.add_row(*map(literal, [config, *(cell(figures.get(str(n))) for n in levels)]))
        table.caption = "streaming clients at once, 64 tokens each: the tokens all got over the wall time"
        tables.append(table)
    if record["loads"]:
        table = Table(show_edge=False)
        for column in ("config", "load s", "peak RSS GB"):
            table.add_column(column, justify="left" if column == "config" else "right")
        for config, figures in record["loads"].items():
            table.add_row(literal(config), cell(figures["load_s"], 1), cell(figures["peak_rss_gb"]))
        table.caption = "start until /health says 200 (median); the server's peak resident memory (VmHWM)"
        tables.append(table)
    return tables
