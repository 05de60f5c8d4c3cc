"""`mlxswitch bench --suite everyday` on the tiny pair: every (prompt, arm) answered once, arms
rotated, records resumed by the same command and refused under other settings, a report that
loads no model, and one error line for each flag or arm the suite cannot take."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlxswitch.cli import app

runner = CliRunner()
PROMPTS = [
    {"id": "code-01", "category": "code", "prompt": "def add(a, b):"},
    {"id": "prose-01", "category": "prose", "prompt": "Write one sentence about the sea."},
]


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def everyday(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("everyday")
    prompts = out / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    small, large = tiny_pair
    args = ["bench", "--suite", "everyday", "--small", str(small), "--large", str(large)]
    args += ["--prompts", str(prompts), "--records", str(out / "r.jsonl"), "--max-tokens", "6"]
    args += ["--arms", "top,profile,fixed"]
    with pytest.MonkeyPatch.context() as patch:  # module-scoped: before the autouse home fixture
        patch.setenv("MLXSWITCH_HOME", str(out / "home"))
        result = runner.invoke(app, [*args, "--json", str(out / "r.json")])
    assert result.exit_code == 0, result.stderr
    return result, out, args


def test_every_prompt_is_answered_by_every_arm_in_rotation(everyday):
    result, out, _ = everyday
    lines = _lines(out / "r.jsonl")
    assert lines[0]["type"] == "header" and lines[0]["settings"]["suite"] == "everyday"
    answered = [(r["task_id"], r["arm"]) for r in lines[1:]]
    # The second prompt starts with the second arm: drift hits every arm alike.
    assert answered == [
        ("code-01", "top"),
        ("code-01", "profile"),
        ("code-01", "fixed"),
        ("prose-01", "profile"),
        ("prose-01", "fixed"),
        ("prose-01", "top"),
    ]
    assert all(len(r["ids"]) <= 6 and r["wall_s"] > 0 for r in lines[1:])
    record = json.loads((out / "r.json").read_text())
    assert record["arms"] == ["top", "profile", "fixed"] and record["prompts"] == 2
    assert [row["category"] for row in record["categories"]] == ["code", "prose", "all"]
    everything = record["categories"][-1]
    assert everything["vs_top"]["top"] == 1.0
    by = {(r["task_id"], r["arm"]): r for r in lines[1:]}
    total = sum(by[(p["id"], "fixed")]["wall_s"] for p in PROMPTS)
    assert everything["seconds_per_answer"]["fixed"] == pytest.approx(total / 2)
    # Verified drafting answers as the top tier alone does, token for token (greedy).
    assert record["per_arm"]["fixed"]["same_as_top"] == 2
    assert "everyday" in result.stdout and "top s/answer" in result.stdout and "same as top" in result.stdout
    # Where the seconds went: every answer's pass ledger summed, per arm.
    for arm in ("top", "fixed"):
        passes = record["per_arm"][arm]["passes"]
        ledgers = [r["stats"]["passes"] for r in lines[1:] if r["arm"] == arm]
        for key in {k for ledger in ledgers for k in ledger} - {"rest_s"}:
            summed = sum(ledger[key]["seconds"] for ledger in ledgers if key in ledger)
            assert passes[key]["seconds"] == pytest.approx(summed)
            assert passes[key]["passes"] == sum(ledger[key]["passes"] for ledger in ledgers if key in ledger)
        assert passes["rest_s"] == pytest.approx(sum(ledger["rest_s"] for ledger in ledgers))
        assert any(key.endswith("prefill") for key in passes)
    assert "where the seconds went" in result.stdout


def test_the_same_command_resumes_and_a_report_loads_no_model(everyday, monkeypatch):
    result, out, args = everyday
    before = (out / "r.jsonl").read_text()
    monkeypatch.setenv("MLXSWITCH_HOME", str(out / "home"))
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.stderr
    assert "resuming: 6 answers kept" in again.stderr
    assert (out / "r.jsonl").read_text() == before  # nothing answered twice
    import mlxswitch.api as api

    monkeypatch.setattr(api, "build_ladder", lambda *a, **k: pytest.fail("a report loaded a model"))
    report = runner.invoke(app, [*args, "--report"])
    assert report.exit_code == 0, report.stderr
    assert report.stdout == result.stdout


def test_other_settings_on_the_same_records_are_one_error_line(everyday, monkeypatch):
    _, out, args = everyday
    monkeypatch.setenv("MLXSWITCH_HOME", str(out / "home"))
    changed = [
        *args[: args.index("--max-tokens")],
        "--max-tokens",
        "7",
        *args[args.index("--max-tokens") + 2 :],
    ]
    result = runner.invoke(app, changed)
    assert result.exit_code == 2
    assert result.stderr.startswith(
        f"error: --records {out / 'r.jsonl'} was made with other settings (max_tokens 6 → 7)"
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--arms", "top,best"],
            "error: --arms for --suite everyday: choose among top, bottom, profile, fixed (got 'top,best')\n",
        ),
        (["--quick"], "error: --quick does not apply to --suite everyday\n"),
        (["--split", "heldout"], "error: --split does not apply to --suite everyday\n"),
        (
            ["--report", "--records", "missing.jsonl"],
            "error: --records missing.jsonl: no such file: nothing to report yet\n",
        ),
    ],
)
def test_flags_the_suite_cannot_take_are_one_error_line(tiny_pair, flags, message):
    small, large = tiny_pair
    result = runner.invoke(
        app, ["bench", "--suite", "everyday", "--small", str(small), "--large", str(large), *flags]
    )
    assert (result.exit_code, result.stderr) == (2, message)


def test_the_fixed_arm_needs_two_local_tiers(tiny_pair):
    result = runner.invoke(
        app, ["bench", "--suite", "everyday", "--model", str(tiny_pair[1]), "--arms", "fixed"]
    )
    assert result.exit_code == 2
    assert result.stderr == (
        "error: the fixed arm cannot run on 'ad-hoc': verify needs two local tiers, a drafter and a checker "
        "(this ladder has 1)\n"
    )


def test_rounds_go_on_from_the_records_each_prompt_in_another_order_and_pool(everyday, monkeypatch, tmp_path):
    _, out, args = everyday
    records = tmp_path / "r.jsonl"
    records.write_text((out / "r.jsonl").read_text())
    at = args.index("--records")
    asked = [
        *args[:at],
        "--records",
        str(records),
        *args[at + 2 :],
        "--repeats",
        "2",
        "--json",
        str(tmp_path / "r.json"),
    ]
    monkeypatch.setenv("MLXSWITCH_HOME", str(out / "home"))
    result = runner.invoke(app, asked)
    assert result.exit_code == 0, result.stderr
    assert "resuming: 6 answers kept" in result.stderr
    lines = _lines(records)[7:]  # round 1's six answers are kept as they were
    # Round 2 starts each prompt one arm further on: with two or more arms, another order.
    assert [(r["task_id"], r["arm"], r["round"]) for r in lines] == [
        ("code-01", "profile", 2),
        ("code-01", "fixed", 2),
        ("code-01", "top", 2),
        ("prose-01", "fixed", 2),
        ("prose-01", "top", 2),
        ("prose-01", "profile", 2),
    ]
    record = json.loads((tmp_path / "r.json").read_text())
    assert (record["prompts"], record["rounds"]) == (2, 2)
    everything = record["categories"][-1]
    walls = {(r["task_id"], r["arm"], r["round"]): r["wall_s"] for r in _lines(records)[1:]}
    assert everything["answers"] == 4
    fixed = sum(w for (_, arm, _), w in walls.items() if arm == "fixed")
    top = sum(w for (_, arm, _), w in walls.items() if arm == "top")
    assert everything["seconds_per_answer"]["fixed"] == pytest.approx(fixed / 4)
    assert everything["vs_top"]["fixed"] == pytest.approx(fixed / top)
    second = record["by_round"][1]
    assert second["round"] == 2 and second["answers"] == 2
    assert second["vs_top"]["fixed"] == pytest.approx(
        sum(w for (_, arm, n), w in walls.items() if arm == "fixed" and n == 2)
        / sum(w for (_, arm, n), w in walls.items() if arm == "top" and n == 2)
    )
    assert record["per_arm"]["fixed"]["same_as_top"] == 4
    assert "in 2 rounds" in result.stdout and "round by round: profile" in result.stdout


def test_drafting_net_prices_a_checks_tokens_at_the_arms_own_step():
    from mlxswitch.bench.seconds import drafting_net

    # Answer 1: 10 tokens = the prompt's + 5 steps + 4 from two checks; the drafter's prompt pass
    # and its steps are drafting's. Answer 2: steps only.
    first = {
        "large prefill": {"passes": 1, "rows": 30, "seconds": 0.5},
        "large 1": {"passes": 5, "rows": 5, "seconds": 0.5},
        "large 4-8": {"passes": 2, "rows": 10, "seconds": 0.3},
        "small prefill": {"passes": 1, "rows": 30, "seconds": 0.1},
        "small 1": {"passes": 3, "rows": 3, "seconds": 0.06},
        "rest_s": 0.01,
    }
    second = {
        "large prefill": {"passes": 1, "rows": 9, "seconds": 0.2},
        "large 1": {"passes": 3, "rows": 3, "seconds": 0.3},
    }
    net = drafting_net([(first, 10), (second, 4)], "large")
    assert net is not None
    assert net["step_s"] == pytest.approx(0.1) and net["check_tokens"] == 4
    assert net["check_s"] == pytest.approx(0.3) and net["draft_s"] == pytest.approx(0.16)
    assert net["saved_s"] == pytest.approx(4 * 0.1 - 0.3 - 0.16)  # a loss: -0.06 s
    assert drafting_net([(second, 4)], "large") is None  # no check: nothing to price


def test_the_report_prices_the_profiles_drafting_by_its_own_passes(everyday):
    result, out, _ = everyday
    record = json.loads((out / "r.json").read_text())
    assert record["per_arm"]["top"]["drafting"] is None  # the top tier alone never checks
    drafting = record["per_arm"]["fixed"]["drafting"]  # fixed-length model drafts: checked each round
    assert drafting is not None and drafting["check_tokens"] > 0
    assert drafting["vs_one_a_step"] == pytest.approx(
        drafting["wall_s"] / (drafting["wall_s"] + drafting["saved_s"])
    )
    words = " ".join(result.stdout.split())  # the caption wraps at the table's width
    assert "Drafting's net by the arm's own passes (a projection, not a measurement):" in words
    assert f"fixed: checks gave {drafting['check_tokens']} tokens" in words
