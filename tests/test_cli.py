"""The `mlxswitch` command through Typer's CliRunner: outputs, JSON Lines, exit codes, error lines."""

from __future__ import annotations

import json
import math
import os

import pytest
from cli_helpers import invoke

from mlxswitch.routing.router import RouterConfig
from mlxswitch.routing.walk import derive_rungs


def _threshold(value):
    return float(value)  # "inf"/"-inf" strings and numbers alike


def _rederive(record):
    # Either policy, on whichever signal it routed on: each token's routed values re-derive its tier.
    router = record["router"]
    config = RouterConfig(
        up=tuple(map(_threshold, router["up"])),
        down=tuple(map(_threshold, router["down"])),
        window=router["window"],
        min_run=router["min_run"],
        normalize=router["normalized"],
        vocab_size=router["vocab_size"],
        policy=router.get("policy", "ead"),
        signal=router.get("signal", "entropy"),
    )
    routed = [
        [float(h) for _, h in t["tried"]]
        if "tried" in t
        else [None if t.get("signal", t["entropy"]) is None else float(t.get("signal", t["entropy"]))]
        for t in record["tokens"]
    ]
    initial = router.get("initial_signal", router["initial_entropy"])  # None: not measured (one tier)
    initial = None if initial is None else float(initial)
    tiers = derive_rungs(config, len(router["tiers"]), initial, routed)
    return [router["tiers"][r] for r in tiers]


def test_piped_lines_give_one_json_object_each_in_order(pair_args):
    prompts = ["Hello there", "What is the capital of France?", "Count to three"]
    result = invoke(
        [
            "chat",
            *pair_args,
            "--json",
            "--max-tokens",
            "12",
            "--tau",
            "1.5",
            "--tau-down",
            "1.0",
            "--window",
            "3",
            "--min-run",
            "2",
        ],
        "\n".join(prompts) + "\n",
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    for record in records:
        assert set(record) == {
            "prompt",
            "text",
            "finish_reason",
            "tokens",
            "stats",
            "router",
            "decoding",
            "route",
        }
        # The route, said once per answer: this CPU's, and each model's linears.
        assert record["route"]["backend"] == "cpu" and record["route"]["compute_dtype"] == "float32"
        assert set(record["route"]["models"].values()) <= {"resident-fp32", "rows", "none"}
        assert record["route"]["blas_threads"] >= 1
        assert set(record["stats"]) >= {
            "generated",
            "prompt_tokens",
            "tiers",
            "switches",
            "tok_per_s",
            "elapsed_s",
            "peak_memory_gb",
        }
        assert record["router"]["tiers"] == ["small", "large"]
        assert record["text"] == "".join(t["text"] for t in record["tokens"])
        assert record["stats"]["generated"] == len(record["tokens"])
        assert [t["tier"] for t in record["tokens"]] == _rederive(record)
    assert any(r["stats"]["switches"] > 0 for r in records)  # the check above is not vacuous


def test_whole_makes_stdin_one_prompt(pair_args):
    result = invoke(["chat", *pair_args, "--json", "--whole", "--max-tokens", "4"], "line one\nline two\n")
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == 1 and records[0]["prompt"] == "line one\nline two"


def test_plain_piped_output_is_just_the_answers(pair_args):
    result = invoke(["chat", *pair_args, "--max-tokens", "6", "--tau", "inf"], "a\nb\n")
    assert result.exit_code == 0
    json_result = invoke(["chat", *pair_args, "--json", "--max-tokens", "6", "--tau", "inf"], "a\nb\n")
    texts = [json.loads(line)["text"] for line in json_result.stdout.splitlines()]
    # Each answer ends with a newline; answers are separated by one blank line.
    assert result.stdout == "\n".join(text + "\n" for text in texts)
    assert "\x1b[" not in result.stdout  # no colour codes when piped
    assert "tok/s" in result.stderr and "tok/s" not in result.stdout


def test_infinite_thresholds_in_json_round_trip(pair_args):
    result = invoke(["chat", *pair_args, "--json", "--max-tokens", "3", "--tau", "-inf"], "hi\n")
    record = json.loads(result.stdout)
    assert record["router"]["up"] == ["-inf"] and math.isinf(_threshold(record["router"]["up"][0]))
    assert {t["tier"] for t in record["tokens"]} == {"large"}


def test_empty_stdin_exits_zero_with_nothing_on_stdout(pair_args):
    result = invoke(["chat", *pair_args], "\n  \n")
    assert result.exit_code == 0
    assert result.stdout == ""


def test_telemetry_file_has_a_record_per_token(pair_args, tmp_path):
    path = tmp_path / "t.jsonl"
    result = invoke(["chat", *pair_args, "--json", "--max-tokens", "5", "--telemetry", str(path)], "x\ny\n")
    assert result.exit_code == 0
    records = [json.loads(line) for line in path.read_text().splitlines()]
    records = [r for r in records if "index" in r]  # token records (each answer also ends with a summary)
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(records) == sum(len(a["tokens"]) for a in answers)
    assert [r["answer"] for r in records] == [i for i, a in enumerate(answers) for _ in a["tokens"]]
    assert {k: records[0][k] for k in answers[0]["tokens"][0]} == answers[0]["tokens"][0]


def test_telemetry_record_of_every_token_equals_its_json_record(pair_args, tmp_path):
    # An event is final when handed out: the last token's telemetry line carries the text the
    # detokenizer released at the very end, exactly as --json has it.
    path = tmp_path / "t.jsonl"
    # Stop strings that never match but hold back any final letter or space until the end.
    stops = [arg for c in "abcdefghijklmnopqrstuvwxyz ,." for arg in ("--stop", c + "\x01")]
    result = invoke(
        ["chat", *pair_args, "--json", "--max-tokens", "7", "--telemetry", str(path), *stops],
        "Count to three\nHello there\n",
    )
    assert result.exit_code == 0
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    lines = [line for line in lines if "index" in line]
    records = [{k: v for k, v in line.items() if k not in ("answer", "index")} for line in lines]
    assert records == [t for a in answers for t in a["tokens"]]
    assert [line["index"] for line in lines] == [i for a in answers for i in range(len(a["tokens"]))]
    assert all(a["text"] and a["tokens"][-1]["text"] for a in answers)  # a tail was held back


@pytest.mark.parametrize(
    "args,code,message",
    [
        (["--small", "x"], 2, "error: --small and --large go together (an ad-hoc pair needs both)"),
        (
            ["--profile", "nope"],
            3,
            "error: unknown profile 'nope' (known: embedded, embedded-plain, qwen2.5-7b-gears, "
            "qwen2.5-coder-0.5b-1.5b, qwen2.5-0.5b-7b, qwen2.5-1.5b-14b, llama3.2-1b-3b, qwen3-0.6b-8b, "
            "qwen2.5-0.5b-7b-cloud)",
        ),
        (["--model", "./missing-dir"], 4, "error: model './missing-dir': no such file or directory"),
        (
            ["--model", "mlx-community/not-cached-here"],
            4,
            "error: model 'mlx-community/not-cached-here' is neither cached locally"
            " nor reachable on Hugging Face",
        ),
        (["--max-tokens", "0"], 2, "error: --max-tokens must be at least 1 (got 0)"),
    ],
)
def test_errors_are_one_line_with_exit_codes(args, code, message):
    result = invoke(["chat", *args], "hello\n")
    assert result.exit_code == code
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message)
    assert result.stdout == ""


def test_wrong_threshold_count_is_a_usage_error(pair_args):
    result = invoke(["chat", *pair_args, "--tau", "1,2"], "hello\n")
    assert result.exit_code == 2
    assert result.stderr.strip() == "error: 2 tiers need 1 up threshold(s), got 2"


def test_mismatched_tokenizers_are_refused_naming_both(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer

    dirs = []
    for name, size in (("a", 300), ("b", 340)):
        tok = train_tokenizer(size)
        config = llama_config(tok.get_vocab_size(), hidden=16, layers=1, heads=2, kv_heads=1, intermediate=32)
        dirs.append(str(save_model_dir(tmp_path / name, make_model(config, 0), config, tok)))
    result = invoke(["chat", "--small", dirs[0], "--large", dirs[1]], "hello\n")
    assert result.exit_code == 5
    assert result.stderr.strip() == (
        f"error: models '{dirs[0]}' and '{dirs[1]}' do not share a tokenizer: "
        "vocabularies differ (300 vs 340 tokens); a pair must use one tokenizer"
    )


def test_broken_models_toml_names_file_and_line(tmp_path, monkeypatch):
    path = tmp_path / "models.toml"
    path.write_text('[profiles.mine]\nmode = "pair"\nsmall = "a"\nlarge = \n')
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    result = invoke(["chat"], "hello\n")
    assert result.exit_code == 3
    assert result.stderr.strip().startswith(f"error: {path}:4:")


def test_prompt_too_long_fails_that_prompt_only(pair_args):
    long_prompt = "one two three " * 300
    result = invoke(["chat", *pair_args, "--json", "--max-tokens", "3"], f"hi\n{long_prompt}\nbye\n")
    assert result.exit_code == 7
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records if "error" not in r] == ["hi", "bye"]
    # The failed prompt has a record of its own, in order, with the code it failed with.
    assert [("error" in r, r.get("exit_code")) for r in records] == [(False, None), (True, 7), (False, None)]
    assert "context holds 512" in records[1]["error"]
    assert "context holds 512" in result.stderr


def test_memory_check_refuses_and_force_overrides(pair_args, monkeypatch):
    monkeypatch.setattr("mlxswitch.models.memory.available_memory_bytes", lambda: 1000)
    result = invoke(["chat", *pair_args, "--max-tokens", "2"], "hi\n")
    assert result.exit_code == 6
    assert "use --force-memory to try anyway" in result.stderr
    forced = invoke(["chat", *pair_args, "--max-tokens", "2", "--force-memory"], "hi\n")
    assert forced.exit_code == 0


def test_models_lists_profiles_and_offline_availability():
    result = invoke(["models"])
    assert result.exit_code == 0
    assert "embedded-plain (default)" in result.stdout and "qwen2.5-0.5b-7b" in result.stdout


def test_models_says_how_each_profile_decodes():
    """The decoding mode beside the ladder's shape: verified or routed (policy, signal, lookup where
    it runs: not on gears sharing a cache), or one tier."""
    from mlxswitch.checks import profile_rows

    rows = {row["name"]: row["decoding"] for row in profile_rows()}
    assert rows["qwen2.5-coder-0.5b-1.5b"] == "verified (adaptive drafts, lookup)"
    assert rows["embedded"] == "routed (peek on margin)"  # gears: one cache, no lookup
    assert rows["qwen2.5-0.5b-7b"] == "routed (ead on entropy, lookup)"
    assert rows["embedded-plain"] == "one tier"
    assert "verified (adaptive" in invoke(["models"]).stdout


def test_doctor_reports_without_revealing_the_key(monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-secret-value")
    result = invoke(["doctor"])
    assert result.exit_code == 0
    assert "sk-ant-secret-value" not in result.stdout
    assert "set (ANTHROPIC_API_KEY)" in result.stdout
    assert "checksum verified" in result.stdout
    assert "default profile" in result.stdout and "embedded-plain" in result.stdout


def test_doctor_says_how_to_train_a_probe_for_a_switching_default(isolated_home):
    (isolated_home / "models.toml").write_text('default = "embedded"\n')
    result = invoke(["doctor"])
    assert result.exit_code == 0
    # A fresh user directory holds no probe: doctor says how to train one.
    assert "probe" in result.stdout and "mlxswitch calibrate --profile embedded" in result.stdout


def test_embedded_default_answers_paris_offline():
    result = invoke(
        ["chat", "--json", "--temp", "0", "--max-tokens", "48"], "What is the capital of France?\n"
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert "Paris" in record["text"]
    assert [t["tier"] for t in record["tokens"]] == _rederive(record)


def test_gears_build_then_chat_on_the_saved_model(tiny_pair, tmp_path):
    _, large = tiny_pair
    out = tmp_path / "geared"
    built = invoke(["gears", "build", str(large), "--out", str(out)])
    assert built.exit_code == 0, built.output
    assert "gears 4/8/16 (planes 4+4+8 bits, group 64)" in built.stdout
    assert "built from a float source: every gear is real precision" in built.stdout
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not the temporary directory's 0700
    assert not list(tmp_path.glob(".geared.partial-*"))  # no staging directory left
    result = invoke(
        [
            "chat",
            "--model",
            str(out),
            "--gears",
            "4,8,16",
            "--tau",
            "1.0,2.0",
            "--min-run",
            "2",
            "--window",
            "2",
            "--json",
            "--max-tokens",
            "16",
        ],
        "hello\n",
    )
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["router"]["tiers"] == ["g4", "g8", "g16"]
    assert [t["tier"] for t in record["tokens"]] == _rederive(record)
    bytes_per_token = record["stats"]["bytes_per_token"]
    assert bytes_per_token["g4"] < bytes_per_token["g8"] < bytes_per_token["g16"]


def test_gears_that_were_not_built_are_refused(tiny_pair, tmp_path):
    _, large = tiny_pair
    out = tmp_path / "geared48"
    assert invoke(["gears", "build", str(large), "--out", str(out), "--planes", "4,4"]).exit_code == 0
    result = invoke(["chat", "--model", str(out), "--gears", "4,8,16"], "hello\n")
    assert result.exit_code == 2
    assert "gear(s) 16 are not among them" in result.stderr
