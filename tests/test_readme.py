"""The README and docs/ against the CLI: every option table against `--help`, every command line
shown against Click's parser, the README's shape, its results against the generated headline,
and every relative link; and docs/headline.py's section in docs/benchmarks.md."""

from __future__ import annotations

import copy
import json
import re
import shlex
from pathlib import Path

import pytest
import typer

from mlxswitch.cli.app import app

try:  # Typer vendors its own Click; its commands raise that Click's exceptions
    from typer._click.exceptions import ClickException
except ImportError:  # pragma: no cover - a Typer that uses Click itself
    from click.exceptions import ClickException

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_DOC = DOCS / "cli.md"
BENCHMARKS = DOCS / "benchmarks.md"  # where docs/headline.py writes the headline
PAGES = [README, *sorted(DOCS.glob("*.md"))]
# Commands whose options docs/cli.md documents in a table; a command with options but no table
# fails below, so a new command gets one.
DOCUMENTED = ("chat", "serve", "bench", "calibrate", "gears build")
_NAME = re.compile(r"(?<![\w-])--?[a-zA-Z][\w-]*")


def _commands(group=None, prefix: str = "") -> dict:
    """Every command by its full name under `mlxswitch`, subcommands included ("gears build")."""
    found = {}
    for name, command in (group or typer.main.get_command(app)).commands.items():
        if hasattr(command, "commands"):
            found |= _commands(command, f"{prefix}{name} ")
        else:
            found[f"{prefix}{name}"] = command
    return found


def _accepted(command) -> tuple[set[str], set[str]]:
    """(names that must be documented, every name the command accepts) of its options: both are
    every name, the `--no-…` forms included, except --help."""
    options = [p for p in command.params if p.param_type_name == "option"]
    names = {name for p in options for name in (*p.opts, *p.secondary_opts)}
    return names, names


def _table(name: str) -> list[str]:
    """The first cells of the rows of `## Options of `mlxswitch NAME`` in docs/cli.md."""
    text = CLI_DOC.read_text(encoding="utf-8")
    heading = re.search(rf"^#+ Options of `mlxswitch {name}`\n", text, re.MULTILINE)
    assert heading, f"docs/cli.md has no 'Options of `mlxswitch {name}`' table"
    cells = []
    for line in text[heading.end() :].splitlines():
        if line.startswith("#"):
            break
        if line.startswith("| `") or line.startswith("| -"):
            cells.append(line.split(" | ")[0])
    assert cells, f"the table of mlxswitch {name} has no option rows"
    return cells


def _documented(name: str) -> set[str]:
    return {option for cell in _table(name) for option in _NAME.findall(cell)}


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_option_is_in_the_cli_table(name):
    needed, _ = _accepted(_commands()[name])
    missing = sorted(needed - _documented(name))
    assert not missing, f"mlxswitch {name}: options missing from docs/cli.md's table: {missing}"


@pytest.mark.parametrize("name", DOCUMENTED)
def test_every_option_in_the_cli_table_exists(name):
    _, accepted = _accepted(_commands()[name])
    unknown = sorted(_documented(name) - accepted)
    assert not unknown, f"docs/cli.md's table of mlxswitch {name} names options it lacks: {unknown}"


def test_every_command_with_options_has_a_table():
    with_options = {
        name
        for name, command in _commands().items()
        if any(p.param_type_name == "option" for p in getattr(command, "params", []))
    }
    assert with_options <= set(DOCUMENTED), sorted(with_options - set(DOCUMENTED))


# -- every command line shown parses ------------------------------------------------------------

_BLOCK = re.compile(r"^```(?:bash|sh)\n(.*?)^```", re.MULTILINE | re.DOTALL)
_ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=")


def _mlxswitch_args(words: list[str]) -> list[str] | None:
    """The arguments after `mlxswitch` in one shell command (`mlxswitch …`, `uv run [--extra X]…
    mlxswitch …`, with leading VAR=value assignments), or None when it runs something else."""
    while words and _ENV.match(words[0]):
        words = words[1:]
    if words[:2] == ["uv", "run"]:
        words = words[2:]
        while words and words[0] == "--extra":
            words = words[2:]
    return words[1:] if words[:1] == ["mlxswitch"] else None


def _command_lines() -> list[tuple[str, list[str]]]:
    """(page:line, arguments) of every mlxswitch command in a ```bash or ```sh block of the pages."""
    found = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in _BLOCK.finditer(text):
            number = text[: block.start(1)].count("\n")
            pending, start = "", 0
            for line in block[1].splitlines():
                number += 1
                start = start if pending else number
                if line.endswith("\\"):  # a continuation line
                    pending += line[:-1] + " "
                    continue
                words, pending = shlex.split(pending + line, comments=True), ""
                # Each command of a pipeline or list (`echo … | mlxswitch chat`, `… &`).
                command: list[str] = []
                for word in [*words, "|"]:
                    if word in ("|", "&&", ";", "&", "||"):
                        args = _mlxswitch_args(command)
                        if args is not None:
                            found.append((f"{page.relative_to(ROOT)}:{start}", args))
                        command = []
                    else:
                        command.append(word)
    return found


def _parse(args: list[str]) -> None:
    """Parse `mlxswitch ARGS` with Click down to the last subcommand, running nothing."""
    command = typer.main.get_command(app)
    ctx = command.make_context("mlxswitch", list(args))
    while hasattr(command, "resolve_command"):  # a group: on to its subcommand
        rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
        if not rest:
            return
        name, command, rest = command.resolve_command(ctx, rest)
        assert command is not None, name
        ctx = command.make_context(name, rest, parent=ctx)


def test_the_pages_show_commands():
    lines = _command_lines()
    assert len(lines) > 30
    pages = {where.split(":")[0] for where, _ in lines}
    assert {"README.md", "docs/cli.md", "docs/serving.md", "docs/benchmarks.md"} <= pages


@pytest.mark.parametrize(("where", "args"), _command_lines(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_command_line_shown_parses(where, args):
    try:
        _parse(args)
    except typer.Exit:
        pass  # --help, --version
    except ClickException as exc:
        pytest.fail(f"{where}: mlxswitch {shlex.join(args)}: {exc.format_message()}")


# -- the README's shape -------------------------------------------------------------------------


def test_the_readme_is_a_landing_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 160


def test_the_readme_sets_up_in_exactly_two_commands():
    text = README.read_text(encoding="utf-8")
    section = re.search(r"^## Set up.*?(?=^## )", text, re.MULTILINE | re.DOTALL)
    assert section, "README.md has no '## Set up' section"
    blocks = _BLOCK.findall(section[0])
    assert len(blocks) == 1
    assert [line for line in blocks[0].splitlines() if line.strip()] == [
        "python3 -m pip install uv && uv run --extra qwen-coder mlxswitch chat",
        "python3 -m pip install uv && uv run pytest",
    ]


def test_the_readme_results_are_rows_of_the_generated_headline():
    """The README's five rows are the headline's own (docs/benchmarks.md), figures as they are."""
    readme = README.read_text(encoding="utf-8")
    section = re.search(r"^## Results.*?(?=^## )", readme, re.MULTILINE | re.DOTALL)
    headline = _headline().written(BENCHMARKS.read_text(encoding="utf-8"))
    assert headline and headline[0].startswith("bench/results/humaneval-pair")
    assert section and f"`{headline[0]}`" in section[0]  # the README names the report it shows
    rows = [line for line in section[0].splitlines() if line.startswith("|")]
    table = [line for line in headline[1].splitlines() if line.startswith("|")]
    assert len(rows) == 2 + 5 and rows[:2] == table[:2]
    assert all(row in table for row in rows)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_and_anchor_exists(page):
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        found = (page.parent / path).resolve() if path else page
        assert found.exists(), f"{page.name}: link to a missing file: {target}"
        if anchor and found.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", found.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {_slug(h) for h in headings}, f"{page.name}: no heading for {target}"


# -- the headline (docs/headline.py writes it into docs/benchmarks.md) -------------------------


def _headline():
    import importlib.util

    spec = importlib.util.spec_from_file_location("headline", ROOT / "docs" / "headline.py")
    assert spec is not None and spec.loader is not None
    headline = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(headline)
    return headline


def _written_report():
    """docs/headline.py, the report path the headline names, and that report."""
    headline = _headline()
    found = headline.written(BENCHMARKS.read_text(encoding="utf-8"))
    assert found
    return headline, found[0], json.loads((ROOT / found[0]).read_text(encoding="utf-8"))


def test_the_headline_is_what_bench_headline_writes_from_its_report():
    headline = _headline()
    found = headline.written(BENCHMARKS.read_text(encoding="utf-8"))
    assert found, "docs/benchmarks.md has no <!-- headline: REPORT --> … <!-- /headline --> section"
    report, section = found
    assert section == headline.render(report), "run: uv run python docs/headline.py --write"


def test_a_pooled_report_puts_its_figures_and_its_curve_in_the_headline():
    """With --with-records the headline says the tiers over every problem and the teacher-forced
    table is the pooled one."""

    headline, report, record = _written_report()
    tiers = [a for a in record["arms"] if a["kind"] == "tier"]
    calibrated = next(a for a in record["arms"] if a["kind"] == "calibrated")
    curve = [{**row, "retained": 0.5, "ead_retained": 0.4} for row in record["teacher_forced_curve"]]
    record["pooled"] = {
        "problems": 80,
        "teacher_forced_problems": 79,
        "tiers": {
            tiers[0]["name"]: {"passed": 50, "problems": 80},
            tiers[1]["name"]: {"passed": 60, "problems": 80},
        },
        "separating": ["HumanEval/2"] * 12,
        "teacher_forced": {calibrated["name"]: {"top_share": 0.21, "retained": 0.93, "random_control": 0.2}},
        "teacher_forced_curve": curve,
        "calibrated_by_split": {
            "calibration": {"problems": 41, "top_share": 0.23},
            "heldout": {"problems": 38, "top_share": 0.19},
        },
    }
    section = headline.Headline(record).section(report)
    assert (
        "- **Over 80 problems** (this run with `--with-records`: the tiers alone on the problems it did "
        "not run). The 0.5B passes 50/80 and the 1.5B 60/80; they differ on 12." in section
    )
    assert (
        f"`peek` at τ {calibrated['tau']:g} sends 0.21 of the tokens to the 1.5B and closes 0.93 of the "
        "NLL gap; random routing at its live share closes 0.20." in section
    )
    promised = record["calibrated"]
    assert (
        f"  - The share it promised, {promised['promised_share']:.2f} on {promised['problems']} calibration "
        "problems, is 0.23 teacher-forced on the 41 calibration problems whose answers are recorded "
        "and 0.19 on 38 held-out ones; live on the held-out problems it sent "
        f"{calibrated['side_by_side']['top_share']:.2f}." in section
    )
    assert "answers to 79 problems (the EAD" in section
    rows = [line for line in section.splitlines() if line.startswith("| 0.") and line.count("|") == 8]
    assert rows and all(line.split("|")[3].strip() == "0.50" for line in rows)
    assert all(line.split("|")[7].strip() == "0.40" for line in rows)
    assert "closes 0.40 of the gap, where `peek` at" in section  # `ead` at the calibrated target


@pytest.mark.parametrize(("verified_s", "said"), [(27.3, True), (18.4, False), (None, False)])
def test_the_headline_says_when_a_late_first_token_flatters_the_decode_rate(verified_s, said):
    """Decode tok/s counts from the first token: the note, with both medians, only where verified
    drafting's first token came later than the top tier's alone."""

    headline, report, record = _written_report()
    top = next(a for a in record["arms"] if a["kind"] == "tier" and a["name"] == "large alone")
    profile = next(a for a in record["arms"] if a["kind"] == "profile")
    top["side_by_side"]["median_first_token_s"] = 18.4
    profile["side_by_side"]["median_first_token_s"] = verified_s
    section = headline.Headline(record).section(report)
    note = (
        "Verified drafting's first token came after 27.3 s (median), the 1.5B alone's after 18.4 s, "
        "and its decode rate counts from there, which flatters it; seconds per problem has no such bias."
    )
    assert (note in section) == said
    assert "flatters" in section if said else "flatters" not in section


@pytest.mark.parametrize("done", [2, 1])
def test_how_long_a_run_takes_is_a_projection_only_until_every_problem_is_answered(done):
    """The run's decoding time: summed over the records once every problem is answered, projected
    from the mean per problem before."""

    headline, report, record = _written_report()
    record["problems"] = ["HumanEval/1", "HumanEval/3"]
    record["complete"] = record["problems"][:done]
    record["run_seconds_per_problem"] = 5400.0
    section = headline.Headline(record).section(report)
    said = (
        "took 3 hours of decoding for the run's 2 problems, 90 minutes a problem (the sum over its records)."
        if done == 2
        else "took 90 minutes of decoding per problem here, the mean over the problems so far: about 3 "
        "hours for the run's 2 problems, a projection."
    )
    assert f"- **How long a run takes.** All arms together {said} The same command resumes" in section


@pytest.mark.parametrize("blas", [{"path": "/usr/lib/libopenblas.so.0", "threads": 1}, None])
def test_the_bar_runs_figures_replace_the_no_figure_line(blas):
    """With the bar run's report (mlx-lm speculative on fp32 weights) the headline gives its seconds
    per problem beside verified drafting's, and names the BLAS MLX ran on; without it, says so."""

    headline, report, record = _written_report()
    assert "that arm was not in this run" in headline.Headline(record).section(report)
    bar = copy.deepcopy(record)
    bar["complete"] = ["HumanEval/1", "HumanEval/3"]
    bar["settings"].pop("mlx_blas", None)
    if blas:
        bar["settings"]["mlx_blas"] = blas
    fp32 = copy.deepcopy(next(a for a in bar["arms"] if a["kind"] == "speculative-ours"))
    fp32["kind"] = "speculative-fp32"
    bar["arms"].append(fp32)
    seconds = {"profile": 30.0, "speculative-fp32": 75.0, "speculative-ours": 70.0}
    for arm in bar["arms"]:
        if arm["kind"] in seconds:
            arm["side_by_side"]["seconds_per_problem"] = seconds[arm["kind"]]
    top = next(a for a in bar["arms"] if a["kind"] == "tier" and a["name"] == "large alone")
    top["side_by_side"]["seconds_per_problem"] = 45.0
    section = headline.Headline(record, bar, "bench/results/x-bar.json").section(report)
    assert "that arm was not in this run" not in section
    assert (
        "** (in a run of its own, 2.50× as fast as mlx-lm's speculative decoding on fp32 weights and "
        "MLX's kernels: the issue's bar). Those are seconds" in section
    )
    on = (
        "OpenBLAS (1 thread) preloaded into MLX in place of the reference BLAS its wheel bundles"
        if blas
        else "MLX's bundled reference BLAS"
    )
    assert f"fp32 weights and MLX's kernels, with {on}. It ran in a second run" in section
    assert "(`bench/results/x-bar.json`) on 2 held-out problems (1, 3)" in section
    assert (
        "  - Per problem: verified drafting 30 s, the 1.5B alone 45 s, mlx-lm's speculative decoding on "
        "fp32 weights 75 s (2.50× verified drafting's time) and on our kernels 70 s." in section
    )


def test_the_live_sweep_is_a_table_of_pass_at_1_per_swept_point(monkeypatch, tmp_path):
    """With the sweep run's report, the headline gives each swept point's target, threshold,
    promised and live share, pass@1 and retained, beside the tiers, over the problems it answered;
    with its controls, their picture where the report's PNG is there."""

    headline, report, record = _written_report()
    assert "Live sweeps" not in headline.Headline(record).section(report)
    sweep = copy.deepcopy(record)
    tiers = [a for a in sweep["arms"] if a["kind"] == "tier"]
    point = copy.deepcopy(tiers[0])
    point.update(kind="sweep", policy="ead", tau=0.25, name="ead τ=0.25")
    point["side_by_side"].update(top_share=0.12, passed=3, problems=4, retained=0.5)
    sweep["arms"] = [*tiers, point]
    sweep["sweep"] = {"ead": [{"target_share": 0.1, "tau": 0.25, "promised_share": 0.11}]}
    sweep["derived"]["threshold_problems"] = ["HumanEval/0", "HumanEval/2"]
    sweep["complete"] = ["HumanEval/9", "HumanEval/17", "HumanEval/59", "HumanEval/63"]
    sweep["problems"] = [*sweep["complete"], "HumanEval/67"]
    sweep["separating"] = ["HumanEval/9", "HumanEval/17", "HumanEval/67"]
    section = headline.Headline(record, sweep=sweep, sweep_path="s.json").section(report)
    assert (
        "Live sweeps (`s.json`, a run of its own): `ead` as its paper runs it (window 5, min run 10) and "
        "`peek` (each position on its own), each at the threshold whose teacher-forced share of 1.5B "
        "tokens on calibration problems 0, 2 is nearest the target, decoded on 4 held-out problems "
        "(9, 17, 59, 63) chosen after the first run because the 0.5B and the 1.5B differed there, so "
        "pass@1 is over those problems, not over the half; in this run the tiers differ on 2 of them. "
        "5 are planned and the same command goes on." in section
    )
    assert "| `ead` | 0.10 | 0.250 | 0.11 | 0.12 | 3/4 | 0.50 |" in section
    assert section.count("| 0.5B alone | – | – | – |") == 1
    sweep["problems"] = sweep["complete"]
    done = headline.Headline(record, sweep=sweep, sweep_path="s.json").section(report)
    assert "differ on 2 of them.\n" in done and "planned" not in done
    assert "random at its share" not in done  # a sweep without its controls: no such column
    # With the live controls: each point's random control beside it, and the oracle as a row.
    random = copy.deepcopy(point)
    random.update(kind="random", policy=None, tau=None, name="random@ead τ=0.25")
    random["side_by_side"].update(passed=1, retained=0.0)
    oracle = copy.deepcopy(random)
    oracle.update(kind="oracle", name="oracle")
    oracle["side_by_side"].update(top_share=0.02, passed=4, retained=1.0)
    sweep_without = copy.deepcopy(sweep)
    sweep["arms"] += [random, oracle]
    controlled = headline.Headline(record, sweep=sweep, sweep_path="s.json").section(report)
    assert "| pass@1 | retained | random at its share: pass@1 | retained |" in controlled
    assert "| `ead` | 0.10 | 0.250 | 0.11 | 0.12 | 3/4 | 0.50 | 1/4 | 0.00 |" in controlled
    assert "| oracle (control) | – | – | – | 0.02 | 4/4 | 1.00 | – | – |" in controlled
    assert "| 0.5B alone | – | – | – | 0.00 |" in controlled and "random@" not in controlled
    assert (
        "\n\nLive, `ead` at its 1 threshold (0.12 of the tokens from the 1.5B) passed 3 of 4, and random "
        "routing at the same shares 1. The oracle passed 4 of 4 with 0.02 of the tokens from the 1.5B.\n"
        in controlled
    )
    assert "Live, `" not in done  # no controls, no such sentence
    assert "s.png" not in done and "s.png" not in controlled  # no picture written: none named
    monkeypatch.setattr(headline, "ROOT", tmp_path)
    (tmp_path / "s.png").write_bytes(b"")
    pictured = headline.Headline(record, sweep=sweep, sweep_path="s.json").section(report)
    assert (
        "![The live sweep: pass@1 against the 1.5B's share of tokens and against seconds per problem, "
        "each policy's random controls as a dashed line](../s.png)\n" in pictured
    )
    assert "s.png" not in headline.Headline(record, sweep=sweep_without, sweep_path="s.json").section(report)


def test_the_sweep_with_its_controls_replaces_the_sweep_once_every_problem_is_answered(monkeypatch, tmp_path):
    headline = _headline()
    monkeypatch.setattr(headline, "ROOT", tmp_path)
    for name, complete in (("r-sweep.json", ["a", "b"]), ("r-sweep-controls.json", ["a"])):
        (tmp_path / name).write_text(json.dumps({"problems": ["a", "b"], "complete": complete}))
    assert headline.live_sweep("r.json")[1] == "r-sweep.json"  # the controls run is part-way
    (tmp_path / "r-sweep-controls.json").write_text(
        json.dumps({"problems": ["a", "b"], "complete": ["b", "a"]})
    )
    assert headline.live_sweep("r.json")[1] == "r-sweep-controls.json"


def test_the_stock_runs_figures_give_mlx_lm_on_each_model_beside_ours():
    """With the stock run's report (mlx-lm's stream_generate on each model, fp32 weights) the
    headline gives each model's seconds per problem by mlx-lm and by our engine, verified drafting's
    beside them, and how many of mlx-lm's answers were ours; without it, nothing."""

    headline, report, record = _written_report()
    assert "mlx-lm on each model alone" not in headline.Headline(record).section(report)
    stock = copy.deepcopy(record)
    stock["complete"] = ["HumanEval/1", "HumanEval/3"]
    stock["settings"]["mlx_blas"] = {"path": "/usr/lib/libopenblas.so.0", "threads": 1}
    figures = {"small": (20.0, 10.0, 2), "large": (80.0, 4.0, 1)}  # s/problem, tok/s, same as ours
    for tier, (seconds, rate, same) in figures.items():
        stock["arms"].append(
            {
                "name": f"mlx-lm {tier} (fp32 weights)",
                "kind": "mlx-lm-fp32",
                "side_by_side": {
                    "seconds_per_problem": seconds,
                    "decode_tok_per_s": rate,
                    "reproduces_tier": same,
                    "problems": 2,
                },
            }
        )
    for arm, seconds in (("small alone", 15.0), ("large alone", 40.0)):
        next(a for a in stock["arms"] if a["name"] == arm)["side_by_side"]["seconds_per_problem"] = seconds
    next(a for a in stock["arms"] if a["kind"] == "profile")["side_by_side"]["seconds_per_problem"] = 32.0
    section = headline.Headline(record, stock=stock, stock_path="s.json").section(report)
    assert (
        "- **mlx-lm on each model alone**, as the issue measured its orientation table: `stream_generate` "
        "with the model dequantized to fp32 on MLX's kernels, with OpenBLAS (1 thread) preloaded into "
        "MLX in place of the reference BLAS its wheel bundles. A third run (`s.json`) on 2 held-out "
        "problems (1, 3), every arm interleaved and no other run beside it." in section
    )
    assert (
        "  - Per problem: the 0.5B 20 s by mlx-lm against 15.0 s by our engine on the same weights, the "
        "1.5B 80 s against 40 s; verified drafting 32 s (2.50× as fast as mlx-lm's 1.5B). Decode tok/s: "
        "mlx-lm 10.00 and 4.00, ours" in section
    )
    assert (
        "  - mlx-lm's answers were token for token our engine's on the same model on 2/2 (0.5B) and "
        "1/2 (1.5B) problems." in section
    )


@pytest.mark.parametrize(
    "args", [["chat", "--no-such-flag"], ["chat", "--max-tokens", "many"], ["gears", "build"], ["nope"]]
)
def test_the_parse_check_can_fail(args):
    with pytest.raises(ClickException):
        _parse(args)


# The README's peer table: its row labels and the peer suite's configs they show.
PEER_ROWS = {
    "llama.cpp, 1.5B alone": "llama-top",
    "llama.cpp, 0.5B as draft": "llama-draft",
    "mlxswitch, 1.5B alone": "ours-top",
    "mlxswitch, the pair as shipped": "ours-profile",
}


def test_the_readme_peer_table_is_its_record():
    """Every figure of the README's table beside llama.cpp is the everyday workload of the record
    it names (bench/results/peer-llama.json, written by `mlxswitch bench --suite peer --json`)."""
    import statistics

    readme = README.read_text(encoding="utf-8")
    section = re.search(r"^## Beside llama\.cpp.*?(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert section and "`bench/results/peer-llama.txt`" in section[0]
    results = json.loads((ROOT / "bench/results/peer-llama.json").read_text(encoding="utf-8"))["results"]
    rows = [line for line in section[0].splitlines() if line.startswith("|")][2:]
    assert [row.split("|")[1].strip() for row in rows] == list(PEER_ROWS)
    for row in rows:
        label, seconds_cell, rate, same_cell, load, rss = (cell.strip() for cell in row.strip("|").split("|"))
        config = PEER_ROWS[label]
        runs = results[config]["runs"]["everyday"]
        seconds, tokens = sum(r["seconds"] for r in runs), sum(r["tokens"] for r in runs)
        base = "llama-top" if config.startswith("llama") else "ours-top"
        alone = results[base]["runs"]["everyday"]
        same = sum(a["text"] == b["text"] for a, b in zip(runs, alone, strict=True))
        assert (seconds_cell, rate) == (f"{seconds:.1f}", f"{tokens / seconds:.1f}"), label
        assert same_cell == ("–" if config == base else f"{same}/{len(runs)}"), label
        assert load == f"{statistics.median(results[config]['load_s']):.1f} s", label
        assert rss == f"{max(results[config]['rss_gb']):.2f} GB", label


def test_the_readme_everyday_table_is_its_suite_record():
    """The README's everyday table: per category, the seconds per answer of the top tier alone and
    of the profile, and their ratio, from the everyday suite's records it names, as `mlxswitch
    bench --suite everyday --report` computes them (mlxswitch/bench/everyday.py)."""
    readme = README.read_text(encoding="utf-8")
    section = re.search(r"^## Results: everyday.*?(?=^## )", readme, re.MULTILINE | re.DOTALL)
    assert section
    named = re.search(r"`(bench/results/everyday-\S+-suite)\.\*`", section[0])
    assert named
    text = (ROOT / f"{named[1]}.jsonl").read_text(encoding="utf-8")
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines[0]["type"] == "header" and lines[0]["settings"]["suite"] == "everyday"
    records = lines[1:]
    report = json.loads((ROOT / f"{named[1]}.json").read_text(encoding="utf-8"))
    rows = [line for line in section[0].splitlines() if line.startswith("|")][2:]
    names = {"sql": "SQL"}
    for row in report["categories"]:
        chosen = [r for r in records if row["category"] in ("all", r["category"])]
        top = [r["wall_s"] for r in chosen if r["arm"] == "top"]
        profile = [r["wall_s"] for r in chosen if r["arm"] == "profile"]
        assert len(top) == len(profile) == row["answers"]
        want = (
            f"| {names.get(row['category'], row['category'])} | {sum(top) / len(top):.1f} | "
            f"{sum(profile) / len(profile):.1f} ({sum(profile) / sum(top):.2f}×) |"
        )
        assert want in rows, want
    same = report["per_arm"]["profile"]["same_as_top"]
    assert f"own answer {same}/{report['per_arm']['profile']['answers']} times" in section[0]
