"""`mlxswitch bench` end to end on a tiny pair: every figure present, the controls in order, the
picture written, and the figures re-derived from the raw records in the JSON."""

from __future__ import annotations

import json
import math

import mlx.core as mx
import numpy as np
import pytest
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
