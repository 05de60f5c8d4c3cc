"""The headline of docs/benchmarks.md, written from a HumanEval report (`bench --suite humaneval --json`).

    uv run python docs/headline.py [--report bench/results/humaneval-pair.json] [--write]

Prints the section; `--write` puts it into docs/benchmarks.md between `<!-- headline: REPORT -->`
and `<!-- /headline -->` (tests/test_readme.py checks that the page holds what this renders, so
no figure there can drift from the records). Every number below comes from the report; the words
around them are fixed, and a sentence whose claim the figures do not support is not written.
"""

from __future__ import annotations

import argparse
import json
import posixpath
import re
from pathlib import Path

from mlxswitch.bench.humaneval.arms import random_control
from mlxswitch.decoding.verify import MAX_DRAFT
from mlxswitch.routing.registry import POLICY_BY_NAME

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "benchmarks.md"  # where the section lives; its links are relative to it
REPORT = "bench/results/humaneval-pair.json"
# Runs of their own beside the main report: humaneval-pair-bar.json, the bar (mlx-lm
# speculative on fp32 weights); humaneval-pair-sweep.json, `ead` and `peek` swept live (read only while
# the controls run is part-way; the sweep's own: git show 824b46b:bench/results/humaneval-pair-sweep.json);
# humaneval-pair-stock.json, mlx-lm on each model alone (fp32 weights);
# humaneval-pair-sweep-controls.json, the live sweep with its random controls and the oracle added.
BAR_SUFFIX, SWEEP_SUFFIX, STOCK_SUFFIX = "-bar", "-sweep", "-stock"
CONTROLS_SUFFIX = "-sweep-controls"
END = "<!-- /headline -->"
EAD_TIMING = POLICY_BY_NAME["ead"].sweep_timing  # (window, min run) of the curve's `ead` column


def _size(source: str, fallback: str) -> str:
    """A model's size from its name ("…-1.5b-…" → "1.5B"), else the tier's name."""
    found = re.search(r"(\d+(?:\.\d+)?)[bB](?![a-zA-Z])", source)
    return f"{found[1]}B" if found else fallback


def _f(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _seconds(value: float | None) -> str:
    """Seconds as a sentence gives them: a decimal under 20 s, where whole seconds hide a ratio."""
    return _f(value, 1 if value is not None and value < 20 else 0)


def _count(n: int, word: str) -> str:
    """ "1 problem", "2 problems"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def _span(values: list, digits: int | None = None) -> str:
    """ "9" where every value is 9, else "lowest–highest" ("0.12–0.31" with `digits`)."""
    low, high = (v if digits is None else f"{v:.{digits}f}" for v in (min(values), max(values)))
    return f"{low}" if low == high else f"{low}–{high}"


def _ids(tasks: list[str]) -> str:
    return ", ".join(t.split("/")[-1] for t in tasks)


class Headline:
    """The report's figures under the names the page uses."""

    def __init__(
        self,
        record: dict,
        bar: dict | None = None,
        bar_path: str = "",
        sweep: dict | None = None,
        sweep_path: str = "",
        stock: dict | None = None,
        stock_path: str = "",
    ):
        self.record = record
        self.bar = Headline(bar) if bar is not None else None  # the bar run's report (beside())
        self.bar_path = bar_path
        self.sweep = Headline(sweep) if sweep is not None else None  # the live sweep's report
        self.sweep_path = sweep_path
        self.stock = Headline(stock) if stock is not None else None  # mlx-lm on each model alone
        self.stock_path = stock_path
        tiers = record["profile"]["tiers"]
        self.small, self.large = (
            _size(model, tier) for model, tier in zip(record["profile"]["models"], tiers, strict=True)
        )
        by_kind: dict[str, list[dict]] = {}
        for arm in record["arms"]:
            by_kind.setdefault(arm["kind"], []).append(arm)
        self.bottom, self.top = (next(a for a in by_kind["tier"] if a["name"] == f"{t} alone") for t in tiers)
        self.profile = next(iter(by_kind.get("profile", [])), None)
        self.calibrated = next(iter(by_kind.get("calibrated", [])), None)
        self.random = next(iter(by_kind.get("random", [])), None)
        self.speculative = next(iter(by_kind.get("speculative-ours", [])), None)
        self.speculative_fp32 = next(iter(by_kind.get("speculative-fp32", [])), None)
        self.mlx_lm_fp32 = by_kind.get("mlx-lm-fp32", [])  # bottom first, as the run lists them
        self.complete = record["complete"]

    def label(self, arm: dict) -> str:
        kind = arm["kind"]
        if arm is self.bottom:
            return f"{self.small} alone"
        if arm is self.top:
            return f"{self.large} alone"
        if kind == "profile" and arm.get("verified"):
            return f"**verified drafting** (the profile; τ {self.tau(self.profile_router())})"
        if kind == "calibrated":
            return f"`{arm['policy']}` without the check (τ {arm['tau']:g}, calibrated)"
        if kind == "random":
            return "random routing at that arm's share (control)"
        if kind == "oracle":
            return "oracle (control)"
        if kind == "speculative-ours":
            return f"mlx-lm speculative, {self.small} draft, 2 drafted, on our kernels"
        return arm["name"]

    def first_token_note(self) -> str:
        """Where verified drafting's first token came later than the top tier's alone, its decode
        rate (counted from the first token) is flattered: say so, with both times."""
        first = self.profile["side_by_side"].get("median_first_token_s") if self.profile else None
        alone = self.top["side_by_side"].get("median_first_token_s")
        if first is None or alone is None or first <= alone:
            return ""
        return (
            f"Verified drafting's first token came after {_f(first, 1)} s (median), the {self.large} "
            f"alone's after {_f(alone, 1)} s, and its decode rate counts from there, which flatters it; "
            "seconds per problem has no such bias. "
        )

    def profile_router(self) -> dict:
        """The profile's router settings with its decoding mode (verify, draft, lookup): one table
        in records from before the mode was a setting of its own, two since."""
        settings = self.record["settings"]
        return {**settings["router"], **settings.get("decoding", {})}

    @staticmethod
    def tau(router: dict) -> str:
        return "/".join(f"{u:g}" for u in router["up"])

    @staticmethod
    def seconds(arm: dict | None) -> float | None:
        return None if arm is None else arm["side_by_side"].get("seconds_per_problem")

    def ratio(self, slow: dict | None, fast: dict | None) -> float | None:
        a, b = self.seconds(slow), self.seconds(fast)
        return a / b if a and b else None

    def table(self) -> str:
        rows = [
            f"| arm | pass@1 | 95% interval | retained | tokens the {self.large} made "
            f"| answers identical to the {self.large}'s | decode tok/s | s/problem | first token, median s |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for arm in self.record["arms"]:
            figures = arm["side_by_side"]
            low, high = figures["pass@1_95"]
            rows.append(
                f"| {self.label(arm)} | {figures['passed']}/{figures['problems']} | {_f(low)}–{_f(high)} "
                f"| {_f(figures['retained'])} | {_f(figures['top_share'])} | {self.same(arm)} "
                f"| {_f(figures.get('decode_tok_per_s'))} | {_seconds(figures.get('seconds_per_problem'))} "
                f"| {_f(figures.get('median_first_token_s'), 1)} |"
            )
        return "\n".join(rows)

    def curve(self) -> str:
        policy = self.calibrated["policy"] if self.calibrated else "peek"
        rows = [
            f"| {self.large} share | τ (bits) | `{policy}` retained | random | oracle "
            "| `ead` share | `ead` retained |",
            "|---|---|---|---|---|---|---|",
        ]
        for point in self.forced_source()["teacher_forced_curve"]:
            rows.append(
                f"| {_f(point['top_share'])} | {_f(point['tau'], 3)} | {_f(point['retained'])} "
                f"| {_f(point['random_control'])} | {_f(point['oracle'])} "
                f"| {_f(point['ead_top_share'])} | {_f(point['ead_retained'])} |"
            )
        return "\n".join(rows)

    def ead_bullet(self, target: float) -> list[str]:
        """Entropy Adaptive Decoding's own rule at the calibrated target share, from the curve."""
        point = next(
            (p for p in self.forced_source()["teacher_forced_curve"] if p["target_share"] == target), None
        )
        if not point or point.get("ead_retained") is None:
            return []
        window, min_run = EAD_TIMING
        problems = self.forced_source()["teacher_forced_problems"]
        return [
            f"  - Entropy Adaptive Decoding's own rule (`ead`: the mean entropy of the last {window} "
            f"tokens, {min_run} tokens before a move), replayed the same way over {problems} problems, "
            f"sends {_f(point['ead_top_share'])} of the tokens to the {self.large} and closes "
            f"{_f(point['ead_retained'])} of the gap, where `peek` at {_f(point['top_share'])} closes "
            f"{_f(point['retained'])}. `peek` decides on the position itself; `ead` decides the next "
            "token's tier from a rolling mean.",
        ]

    def forced_source(self) -> dict:
        """Where the teacher-forced table comes from: every run pooled (`--with-records`), else this one."""
        return self.record.get("pooled") or self.record

    def pooled_bullet(self) -> list[str]:
        pooled = self.record.get("pooled")
        if not pooled:
            return []
        bottom, top = (pooled["tiers"][a["name"]] for a in (self.bottom, self.top))
        out = [
            f"- **Over {pooled['problems']} problems** (this run with `--with-records`: the tiers alone "
            f"on the problems it did not run). The {self.small} passes "
            f"{bottom['passed']}/{bottom['problems']} and the {self.large} "
            f"{top['passed']}/{top['problems']}; they differ on "
            f"{len(pooled['separating'])}.",
        ]
        c = self.calibrated
        tf = pooled["teacher_forced"].get(c["name"]) if c else None
        if c and tf:
            out.append(
                f"  - Along the {self.large}'s answers to {pooled['teacher_forced_problems']} problems, "
                f"`{c['policy']}` at τ {c['tau']:g} sends {_f(tf.get('top_share'))} of the tokens to the "
                f"{self.large} and closes {_f(tf.get('retained'))} of the NLL gap; random routing at its "
                f"live share closes {_f(tf.get('random_control'))}. The problems it was calibrated on "
                "are among them."
            )
        halves = pooled.get("calibrated_by_split") or {}
        promised = self.record.get("calibrated")
        if c and promised and "calibration" in halves:
            cal = halves["calibration"]
            held = halves.get("heldout")
            out.append(
                f"  - The share it promised, {_f(promised['promised_share'])} on {promised['problems']} "
                f"calibration problems, is {_f(cal.get('top_share'))} teacher-forced on the "
                f"{cal['problems']} calibration problems whose answers are recorded"
                + (f" and {_f(held.get('top_share'))} on {held['problems']} held-out ones" if held else "")
                + f"; live on the held-out problems it sent {_f(c['side_by_side']['top_share'])}."
            )
        return out

    def bar_bullet(self) -> list[str]:
        """The issue's bar as it measured it (mlx-lm's speculative decoding on fp32 weights and MLX's
        kernels), from the bar run's report when there is one."""
        b = self.bar_measured()
        if b is None:
            return [
                "  - The issue measured its bar on fp32 weights and MLX's own kernels (`speculative-fp32`); "
                "that arm was not in this run: on MLX's bundled reference BLAS it takes minutes over one "
                'prompt ("HumanEval" below says why).'
            ]
        fp32, mine, top = b.speculative_fp32, b.profile, b.top
        return [
            "  - **The issue's own bar**: mlx-lm's speculative decoding on fp32 weights and MLX's kernels, "
            f"with {b.blas()}. It ran in a second run (`{self.bar_path}`) on "
            f"{_count(len(b.complete), b.half() + 'problem')} ({_ids(b.complete)}), every arm "
            "interleaved as above and no other run beside it, so its times are lower than the first "
            "run's, whose process shared the two cores with another run.",
            f"  - Per problem: verified drafting {_seconds(b.seconds(mine))} s, the {b.large} alone "
            f"{_seconds(b.seconds(top))} s, mlx-lm's speculative decoding on fp32 weights "
            f"{_seconds(b.seconds(fp32))} s ({_f(b.ratio(fp32, mine))}× verified drafting's time)"
            + (
                f" and on our kernels {_seconds(b.seconds(b.speculative))} s"
                if b.speculative is not None
                else ""
            )
            + f". Decode tok/s: {_f(mine['side_by_side'].get('decode_tok_per_s'))}, "
            f"{_f(top['side_by_side'].get('decode_tok_per_s'))} and "
            f"{_f(fp32['side_by_side'].get('decode_tok_per_s'))}. Answers identical to the {b.large}'s: "
            f"{self.same(mine)} by verified drafting, {self.same(fp32)} by speculative decoding.",
        ]

    def blas(self) -> str:
        """The BLAS this run's MLX did its fp32 products in."""
        blas = self.record["settings"].get("mlx_blas")
        if not blas:
            return "MLX's bundled reference BLAS"
        threads = blas.get("threads")
        return (
            f"OpenBLAS ({threads} thread{'s' if threads != 1 else ''}) preloaded into MLX in place of the "
            "reference BLAS its wheel bundles"
        )

    def stock_bullet(self) -> list[str]:
        """mlx-lm's stream_generate on each model alone, dequantized to fp32 (how the issue measured
        its orientation table), from the stock run's report when it holds both models and the profile."""
        s = self.stock
        if s is None or len(s.mlx_lm_fp32) != 2 or s.profile is None or not s.complete:
            return []
        (small, large), (ours_small, ours_large) = s.mlx_lm_fp32, (s.bottom, s.top)

        def rate(arm: dict) -> str:
            return _f(arm["side_by_side"].get("decode_tok_per_s"))

        def own(arm: dict) -> str:
            figures = arm["side_by_side"]
            return f"{figures.get('reproduces_tier', 0)}/{figures['problems']}"

        return [
            "- **mlx-lm on each model alone**, as the issue measured its orientation table: "
            f"`stream_generate` with the model dequantized to fp32 on MLX's kernels, with {s.blas()}. "
            f"A third run (`{self.stock_path}`) on {_count(len(s.complete), s.half() + 'problem')} "
            f"({_ids(s.complete)}), every arm interleaved and no other run beside it.",
            f"  - Per problem: the {s.small} {_seconds(s.seconds(small))} s by mlx-lm against "
            f"{_seconds(s.seconds(ours_small))} s by our engine on the same weights, the {s.large} "
            f"{_seconds(s.seconds(large))} s against {_seconds(s.seconds(ours_large))} s; verified drafting "
            f"{_seconds(s.seconds(s.profile))} s ({_f(s.ratio(large, s.profile))}× as fast as mlx-lm's "
            f"{s.large}). Decode tok/s: mlx-lm {rate(small)} and {rate(large)}, ours {rate(ours_small)} "
            f"and {rate(ours_large)}.",
            f"  - mlx-lm's answers were token for token our engine's on the same model on {own(small)} "
            f"({s.small}) and {own(large)} ({s.large}) problems.",
        ]

    @staticmethod
    def same(arm: dict) -> str:
        """How many of an arm's answers were the top tier's own, over the problems every arm answered."""
        figures = arm["side_by_side"]
        return f"{figures['reproduces_top']}/{figures['problems']}" if "reproduces_top" in figures else "–"

    def sweep_section(self) -> list[str]:
        """The live sweep (every swept point decoded, pass@1 read) as a table, when its report is there."""
        w = self.sweep
        points = [a for a in w.record["arms"] if a["kind"] == "sweep"] if w else []
        if w is None or not points or not w.complete:
            return []
        promised = {
            (policy, point["tau"]): point for policy, chosen in w.record["sweep"].items() for point in chosen
        }
        # The live controls, where the run has them: a random control per swept point, at that
        # point's own share on each problem, and the oracle.
        by_name = {a["name"]: a for a in w.record["arms"]}
        randoms = {a["name"]: by_name.get(random_control(a["name"])) for a in points}
        oracle = [a for a in w.record["arms"] if a["kind"] == "oracle"]
        controlled = any(randoms.values())
        rows = [
            f"| arm | target {w.large} share | τ (bits) | promised | live {w.large} share "
            "| pass@1 | retained |" + (" random at its share: pass@1 | retained |" if controlled else ""),
            "|---|---|---|---|---|---|---|" + ("---|---|" if controlled else ""),
        ]
        for arm in [w.bottom, w.top, *points, *oracle]:
            figures = arm["side_by_side"]
            point = promised.get((arm["policy"], arm["tau"]), {})
            name = w.label(arm) if arm["kind"] != "sweep" else f"`{arm['policy']}`"
            row = (
                f"| {name} | {_f(point.get('target_share'))} | {_f(arm['tau'], 3)} "
                f"| {_f(point.get('promised_share'))} | {_f(figures['top_share'])} "
                f"| {figures['passed']}/{figures['problems']} | {_f(figures['retained'])} |"
            )
            if controlled:
                random = randoms.get(arm["name"])
                control = random["side_by_side"] if random else None
                row += (
                    f" {control['passed']}/{control['problems']} | {_f(control['retained'])} |"
                    if control
                    else " – | – |"
                )
            rows.append(row)
        window, min_run = EAD_TIMING
        separating = [t for t in w.record["separating"] if t in w.complete]
        lead = (
            f"Live sweeps (`{self.sweep_path}`, a run of its own): `ead` as its paper runs it (window "
            f"{window}, min run {min_run}) and `peek` (each position on its own), each at the threshold "
            f"whose teacher-forced share of {w.large} tokens on calibration problems "
            f"{_ids(w.record['derived']['threshold_problems'])} is nearest the target, decoded on "
            f"{_count(len(w.complete), 'held-out problem')} ({_ids(w.complete)}) chosen after the first "
            "run because "
            f"the {w.small} and the {w.large} differed there, so pass@1 is over those problems, not over "
            f"the half; in this run the tiers differ on {len(separating)} of them."
        )
        planned = len(w.record["problems"])
        if len(w.complete) < planned:
            lead += f" {planned} are planned and the same command goes on."
        if not controlled:
            return [lead, "\n".join(rows)]
        found = [self.controls_sentence(points, randoms, oracle)]
        picture = Path(self.sweep_path).with_suffix(".png").as_posix()
        if (ROOT / picture).is_file():
            found.append(
                f"![The live sweep: pass@1 against the {w.large}'s share of tokens and against seconds "
                f"per problem, each policy's random controls as a dashed line]({link(picture)})"
            )
        return [lead, "\n".join(rows), *found]

    def controls_sentence(self, points: list[dict], randoms: dict, oracle: list[dict]) -> str:
        """Each swept policy's pass@1 over its points beside its random controls', and the oracle's."""
        assert self.sweep is not None
        large, said = self.sweep.large, []
        for policy in dict.fromkeys(a["policy"] for a in points):
            mine = [a for a in points if a["policy"] == policy]
            figures = [a["side_by_side"] for a in mine]
            controls = [randoms[a["name"]]["side_by_side"] for a in mine if randoms[a["name"]]]
            shares = _span([f["top_share"] for f in figures], 2)
            clause = (
                f"`{policy}` at its {_count(len(mine), 'threshold')} ({shares} of the tokens from the "
                f"{large}) passed {_span([f['passed'] for f in figures])} of {figures[0]['problems']}"
            )
            if controls:
                clause += f", and random routing at the same shares {_span([c['passed'] for c in controls])}"
            said.append(clause)
        sentence = "Live, " + "; ".join(said) + "."
        for arm in oracle:
            figures = arm["side_by_side"]
            sentence += (
                f" The oracle passed {figures['passed']} of {figures['problems']} with "
                f"{_f(figures['top_share'])} of the tokens from the {large}."
            )
        return sentence

    def lead(self) -> str:
        n = len(self.complete)
        begun = [t for t in self.record["answered"] if t not in self.complete]
        partly = (
            f" {'Problem' if len(begun) == 1 else 'Problems'} {_ids(begun)}"
            f" {'has' if len(begun) == 1 else 'have'} been begun but not answered by every arm;"
            " the same command goes on from there."
            if begun
            else ""
        )
        p = self.profile["side_by_side"] if self.profile else None
        same = (
            f"the {self.large}'s own tokens"
            if p and p.get("reproduces_top") == p["problems"]
            else f"the {self.large}'s tokens on {p['reproduces_top']}/{p['problems']} problems"
            if p
            else ""
        )
        vs_top, vs_spec = self.ratio(self.top, self.profile), self.ratio(self.speculative, self.profile)
        return (
            f"The profile `{self.record['profile']['name']}` answers with **{same}, "
            f"{_f(vs_top)}× as fast as the {self.large} alone"
            + (
                f" and {_f(vs_spec)}× as fast as mlx-lm's speculative decoding with the same draft on "
                "the same kernels**"
                if vs_spec
                else "**"
            )
            + self.bar_lead()
            + ". Those are seconds per answer, prompt included, over the problems every arm answered. "
            "Every arm ran in one run, interleaved problem by problem, greedy, on "
            f"{n} {self.half()}HumanEval problems (task numbers {_ids(self.complete)}).{partly}"
        )

    def bar_measured(self) -> Headline | None:
        """The bar run, when its report holds both the fp32 speculative arm and the profile."""
        b = self.bar
        return b if b is not None and b.speculative_fp32 is not None and b.profile is not None else None

    def bar_lead(self) -> str:
        """The issue's own bar in the lead, from the bar run, when there is one."""
        b = self.bar_measured()
        if b is None:
            return ""
        return (
            f" (in a run of its own, {_f(b.ratio(b.speculative_fp32, b.profile))}× as fast as mlx-lm's "
            "speculative decoding on fp32 weights and MLX's kernels: the issue's bar)"
        )

    def half(self) -> str:
        """ "held-out " or "calibration " when every problem of the run is from that half (odd or
        even task numbers), else nothing."""
        parities = {int(t.split("/")[-1]) % 2 for t in self.record["problems"]}
        return {frozenset({1}): "held-out ", frozenset({0}): "calibration "}.get(frozenset(parities), "")

    def drafting_bullets(self, p: dict) -> list[str]:
        """Where verified drafting's drafts came from: the small model's, and prompt lookup's where
        the run had it on, with how many of the answer's tokens each gave (every one checked)."""
        router = self.profile_router()
        if not router.get("lookup"):
            return [
                f"  - The {self.small} drafts while its {router['signal']} stays under "
                f"{self.tau(router)} bits, up to {MAX_DRAFT} tokens.",
                f"  - The {self.large} made {_f(p['side_by_side']['top_share'])} of the tokens itself and "
                "checked all the others.",
            ]
        seconds = p.get("seconds") or {}
        tokens = seconds.get("tokens")
        looked = (seconds.get("sources") or {}).get("lookup", 0)
        drafted = round(tokens * (1 - p["side_by_side"]["top_share"])) if tokens else None
        out = [
            f"  - Each round drafts up to {MAX_DRAFT} tokens where the planner expects a draft to pay "
            "(the pass costs it measured, the share of drafts kept): the tokens that followed an earlier "
            f"occurrence of the answer's last 4–8 (prompt lookup), or the {self.small}'s while it is sure; "
            f"elsewhere the {self.large} decodes alone.",
        ]
        if tokens:
            out.append(
                f"  - Of its {tokens:,} tokens, {looked:,} were prompt-lookup drafts and {drafted:,} the "
                f"{self.small}'s, every one checked by the {self.large}; the {self.large} sampled the "
                f"other {tokens - looked - drafted:,} itself."
            )
        return out

    def bullets(self) -> str:
        out = []
        p, spec, top = self.profile, self.speculative, self.top
        if p:
            mine = p["side_by_side"]
            out += [
                '- **How.** Verified drafting (`--verify`; see "Verified drafting" in '
                "[routing.md](routing.md#verified-drafting---verify-the-answer-is-the-large-tiers)).",
                *self.drafting_bullets(p),
                f"  - The {self.large} checks the whole draft in one batched pass and keeps it up to the "
                "first token it disagrees with.",
                f"  - On {mine['reproduces_top']}/{mine['problems']} problems the answers were token for "
                f"token the {self.large}'s own.",
            ]
        if spec:
            out += [
                f"- **The bar.** mlx-lm's speculative decoding, with the {self.small} as draft, in the "
                "same run.",
                f"  - It decodes {_f(spec['side_by_side']['decode_tok_per_s'])} tok/s on our CPU routes, "
                f"against {_f(top['side_by_side']['decode_tok_per_s'])} for the {self.large} alone: "
                "it drafts 2 tokens every round, kept or not, and checks them in a 3-row pass "
                f"(what a pass of k rows of the {self.large} costs on this CPU: "
                "`bench/results/model-rows-qwen.txt`).",
                f"  - Per problem: verified drafting {_seconds(self.seconds(p))} s, mlx-lm's speculative "
                f"decoding {_seconds(self.seconds(spec))} s, the {self.large} alone "
                f"{_seconds(self.seconds(top))} s.",
            ]
            out += self.bar_bullet()
        out += self.stock_bullet()
        c, r = self.calibrated, self.random
        promised = self.record.get("calibrated")
        if c and promised:
            tf = c.get("teacher_forced") or {}
            out += [
                f"- **Routing without the check.** `{c['policy']}` at τ {c['tau']:g} bits was chosen to "
                f"send {_f(promised['promised_share'])} of the tokens to the {self.large}, teacher-forced "
                f"on {promised['problems']} calibration problems.",
                f"  - Live, it sent {_f(c['side_by_side']['top_share'])} and retained "
                f"{_f(c['side_by_side']['retained'])} of the {self.large}'s pass@1 gain over the {self.small}"
                + (
                    f"; random routing at its share retained {_f(r['side_by_side']['retained'])}."
                    if r
                    else "."
                ),
                f"  - Teacher-forced along the {self.large}'s answers it closes {_f(tf.get('retained'))} "
                f"of the {self.small} → {self.large} NLL gap; random routing at that share closes "
                f"{_f(tf.get('random_control'))}.",
            ]
            out += self.ead_bullet(promised["target_share"])
        separating = [t for t in self.record["separating"] if t in self.complete]
        out += [
            f"- **What pass@1 rests on.** The {self.small} and the {self.large} differ on "
            f"{len(separating)} of the {len(self.complete)} problems"
            + (f" ({_ids(separating)})" if separating else "")
            + ', so every "retained" figure rests on '
            + ("those." if len(separating) != 1 else "that one.")
            + " The teacher-forced table below uses every position of the same answers.",
        ]
        out += self.pooled_bullet()
        per_problem = self.record["run_seconds_per_problem"]
        if per_problem:
            total = len(self.record["problems"])
            run_s = per_problem * total
            hours = f"{run_s / 3600:.0f} hours" if run_s >= 7200 else f"{run_s / 60:.0f} minutes"
            minutes = f"{per_problem:.0f} seconds" if per_problem < 120 else f"{per_problem / 60:.0f} minutes"
            measured = (
                f"{hours} of decoding for the run's {total} problems, {minutes} a problem (the sum "
                "over its records)"
                if len(self.complete) == total
                else f"{minutes} of decoding per problem here, the mean over the problems so far: "
                f"about {hours} for the run's {total} problems, a projection"
            )
            out += [
                f"- **How long a run takes.** All arms together took {measured}. The same command "
                "resumes a stopped run, and `--shard I/N` splits it over processes.",
            ]
        projected = [(arm.get("seconds") or {}).get("projection", {}).get("seconds", {}) for arm in (p, top)]
        if p and p.get("verified") and all("M3 Max" in x for x in projected):
            mine_s, top_s = (x["M3 Max"] for x in projected)
            out += [
                "- **Apple silicon** (a projection, not a measurement: the same passes, each reading its "
                "model's weights once, at M3 Max peak bandwidth). Verified drafting's passes over the "
                f"{len(self.complete)} problems would take {mine_s:.1f} s and the {self.large} alone's "
                f"{top_s:.1f} s ({top_s / mine_s:.2f}×): there a batched check costs about what one "
                "token does, so this CPU's cost of checking does not carry over.",
            ]
        elif p and p.get("verified") and p.get("projection"):
            bound = p["projection"]["tok_per_s_bound"]["M3 Max"]
            top_bound = top["projection"]["tok_per_s_bound"]["M3 Max"]
            out += [
                "- **Apple silicon** (a projection, not a measurement: M3 Max peak bandwidth divided by "
                f"the weights read per token). Verified drafting reads {p['bytes_per_token'] / 1e6:.0f} MB "
                f"a token and the {self.large} alone {top['bytes_per_token'] / 1e6:.0f} MB: bounds of "
                f"{bound:.0f} and {top_bound:.0f} tok/s. There a batched check costs about what one token "
                "does, so this CPU's cost of checking does not carry over.",
            ]
        return "\n".join(out)

    def section(self, report: str) -> str:
        return "\n\n".join(
            [
                f"<!-- headline: {report} -->\n## Headline: HumanEval on Qwen2.5-Coder "
                f"{self.small} → {self.large} (this CPU)",
                self.lead(),
                self.table(),
                f'"retained" = (pass − pass_{self.small}) / (pass_{self.large} − pass_{self.small}). '
                'Every column is over the problems every arm answered; "decode tok/s" counts from '
                "the first token. "
                f"{self.first_token_note()}"
                "The command and its records are in `bench/results/README.md`; `--report` "
                "re-derives every figure from the records, and `docs/headline.py` writes this section "
                "from that report.",
                self.bullets(),
                f"Teacher-forced along the {self.large}'s answers to "
                f"{self.forced_source()['teacher_forced_problems']} problems (the EAD paper's table: the "
                f"{self.large}'s share → the share of the {self.small} → {self.large} NLL gap closed, with "
                "random routing and the oracle at the same share, and `ead` as its paper runs it (window "
                f"{EAD_TIMING[0]}, min run {EAD_TIMING[1]}) at its threshold nearest that share):",
                self.curve(),
                f"![HumanEval pass@1 against the {self.large}'s share of tokens and against seconds per "
                f"problem]({link(Path(report).with_suffix('.png').as_posix())})",
                *self.sweep_section(),
                END,
            ]
        )


def link(path: str) -> str:
    """A repository path as a link from the page (docs/benchmarks.md)."""
    return posixpath.relpath(path, "docs")


def beside(report: str, suffix: str) -> tuple[dict | None, str]:
    """The report of a run of its own beside `report` (its name + suffix), if there, and its path."""
    path = Path(report)
    other = path.with_name(f"{path.stem}{suffix}{path.suffix}").as_posix()
    found = ROOT / other
    return (json.loads(found.read_text(encoding="utf-8")) if found.is_file() else None), other


def live_sweep(report: str) -> tuple[dict | None, str]:
    """The live sweep's report: the one with its controls added once every arm has answered every
    problem, else the sweep's own."""
    controls, path = beside(report, CONTROLS_SUFFIX)
    if controls is not None and set(controls["complete"]) == set(controls["problems"]):
        return controls, path
    return beside(report, SWEEP_SUFFIX)


def render(report: str = REPORT) -> str:
    """The headline section for the report at `report` (a path from the repository root), with the
    bar run's, the live sweep's and the stock run's figures when their reports are there too."""
    return Headline(
        json.loads((ROOT / report).read_text(encoding="utf-8")),
        *beside(report, BAR_SUFFIX),
        *live_sweep(report),
        *beside(report, STOCK_SUFFIX),
    ).section(report)


def written(readme: str) -> tuple[str, str] | None:
    """(the report path, the section) as the page holds them, or None without markers."""
    found = re.search(rf"<!-- headline: (\S+) -->.*?{re.escape(END)}", readme, re.DOTALL)
    return (found[1], found[0]) if found else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--report", default=REPORT, help="the report JSON, from the repository root")
    parser.add_argument("--write", action="store_true", help="put the section into docs/benchmarks.md")
    args = parser.parse_args()
    section = render(args.report)
    if not args.write:
        print(section)
        return
    text = PAGE.read_text(encoding="utf-8")
    old = written(text)
    if old is None:
        raise SystemExit("error: docs/benchmarks.md has no <!-- headline: … --> … <!-- /headline --> section")
    PAGE.write_text(text.replace(old[1], section), encoding="utf-8")


if __name__ == "__main__":
    main()
