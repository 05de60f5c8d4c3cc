"""Pair validation: shared tokenizers, and the memory estimate that refuses what will not fit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten
from tinymodels import CHAT_TEMPLATE, CORPUS, make_model, train_tokenizer

from mlxswitch.errors import InsufficientMemoryError, TokenizerMismatchError
from mlxswitch.models import memory, sources
from mlxswitch.models.memory import (
    check_memory,
    estimate_memory,
    estimate_model_bytes,
    guess_model_bytes,
    kv_cache_bytes,
)
from mlxswitch.models.tokenizers import check_shared_tokenizer
from mlxswitch.models.weights import compute_dtype
from mlxswitch.profiles import Profile
from mlxswitch.routing.router import RouterConfig

# Floats sit in memory as fp32 on a CPU (the loader casts them), as stored (half) on a GPU.
FLOAT = 4 if compute_dtype() is not None else 2

OTHER_CORPUS = [
    "Rivers flow to the sea; mountains rise above the clouds and snow.",
    "Seven hundred and twenty-nine apples were sold at the market on Sunday.",
    "import numpy as np\nx = np.zeros((3, 4))\nprint(x.shape)",
    "Bonjour, comment allez-vous? Très bien, merci beaucoup!",
] * 8


def tokenizer(root: Path, name: str, tok=None, eos: str = "<|im_end|>"):
    """An mlx-lm TokenizerWrapper loaded from tokenizer files written under root/name."""
    from mlx_lm.utils import load_tokenizer

    folder = root / name
    folder.mkdir()
    (tok or train_tokenizer(320)).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(
            {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "chat_template": CHAT_TEMPLATE}
        )
    )
    return load_tokenizer(folder)


def mismatch(tok_a, tok_b) -> str:
    with pytest.raises(TokenizerMismatchError) as error:
        check_shared_tokenizer("org/small", tok_a, "org/large", tok_b)
    message = str(error.value)
    assert message.startswith("models 'org/small' and 'org/large' do not share a tokenizer: ")
    assert message.endswith("; a pair must use one tokenizer") and "\n" not in message
    return message


# -- tokenizers ---------------------------------------------------------------------------------


def test_a_pair_sharing_a_tokenizer_passes(tiny_pair):
    from mlx_lm.utils import load

    small, large = (load(str(path))[1] for path in tiny_pair)
    check_shared_tokenizer(str(tiny_pair[0]), small, str(tiny_pair[1]), large)


def test_vocabularies_of_different_sizes_are_refused(tmp_path):
    message = mismatch(
        tokenizer(tmp_path, "a", train_tokenizer(320)), tokenizer(tmp_path, "b", train_tokenizer(400))
    )
    assert "vocabularies differ (320 vs 400 tokens)" in message


def test_same_size_but_different_vocabularies_are_refused(tmp_path):
    message = mismatch(
        tokenizer(tmp_path, "a", train_tokenizer(320, CORPUS)),
        tokenizer(tmp_path, "b", train_tokenizer(320, OTHER_CORPUS)),
    )
    assert "vocabularies differ (" in message and "of 320 tokens map to other ids)" in message


def test_same_vocabulary_but_different_encoding_is_refused(tmp_path):
    from tokenizers import pre_tokenizers

    other = train_tokenizer(320)
    other.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    message = mismatch(tokenizer(tmp_path, "a"), tokenizer(tmp_path, "b", other))
    assert "they encode the same text differently" in message


def test_special_tokens_that_encode_differently_are_refused(tmp_path):
    from tokenizers import Tokenizer

    # Same vocabulary, but b no longer treats <|im_start|> as one token: only chat text shows it.
    spec = json.loads(train_tokenizer(320).to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] != "<|im_start|>"]
    message = mismatch(
        tokenizer(tmp_path, "a"), tokenizer(tmp_path, "b", Tokenizer.from_str(json.dumps(spec)))
    )
    assert "chat text rendered by org/small's template differently" in message


def test_different_end_of_sequence_ids_are_refused(tmp_path):
    message = mismatch(tokenizer(tmp_path, "a"), tokenizer(tmp_path, "b", eos="<|endoftext|>"))
    assert "end-of-sequence ids differ ([2] vs [0])" in message


# -- memory -------------------------------------------------------------------------------------


from mlxswitch.models.sources import model_source  # noqa: E402


def resident(path: Path) -> int:
    """Bytes a loaded model holds: its parameters, and the fp32 copies a CPU keeps (rows.py)."""
    from mlxswitch.models.sources import load_model

    model = load_model(str(path)).model
    dense = sum(m.dense.nbytes for _, m in model.named_modules() if getattr(m, "dense", None) is not None)
    return sum(v.nbytes for _, v in tree_flatten(model.parameters())) + dense


def test_directory_estimate_matches_what_loading_holds(tiny_pair):
    assert estimate_model_bytes(str(tiny_pair[0])) == resident(tiny_pair[0])


def test_quantized_directory_estimate_matches_what_loading_holds(tiny_pair, tmp_path):
    # A 4-bit model saved with bf16 scales: on a CPU the loader holds those scales in fp32.
    config = json.loads((tiny_pair[1] / "config.json").read_text())
    model = make_model(config, seed=3)
    nn.quantize(model, group_size=64, bits=4)
    weights = {
        k: v.astype(mx.bfloat16) if mx.issubdtype(v.dtype, mx.floating) else v
        for k, v in tree_flatten(model.parameters())
    }
    out = tmp_path / "q4"
    shutil.copytree(tiny_pair[1], out)
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps({**config, "quantization": {"group_size": 64, "bits": 4}}))
    assert estimate_model_bytes(str(out)) == resident(out)
    # The planes are smaller than the fp32 model; on a CPU the resident fp32 copy comes on top.
    planes = model_source(str(out)).footprint()
    assert planes.bytes < estimate_model_bytes(str(tiny_pair[1])) and planes.linear_params > 0


def test_embedded_gguf_estimate_matches_what_loading_holds():
    from mlxswitch.resources import EMBEDDED_SOURCE

    # The embedded model is a dependency: its absence is a failure, not a skip.
    assert estimate_model_bytes(EMBEDDED_SOURCE) == resident(Path("embedded"))


def hub_cache(tmp_path, monkeypatch) -> Path:
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def cache_repo(cache: Path, repo_id: str, source: Path, files: list[str]) -> Path:
    """Lay out files of `source` the way the Hugging Face cache keeps a downloaded snapshot."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    for name in files:
        shutil.copy(source / name, snapshot / name)
    return snapshot


def test_cached_hub_repo_is_estimated_offline_and_others_are_guessed(tiny_pair, tmp_path, monkeypatch):
    cache = hub_cache(tmp_path, monkeypatch)
    cache_repo(cache, "org/tiny-large", tiny_pair[1], ["config.json", "model.safetensors"])
    assert estimate_model_bytes("org/tiny-large") == estimate_model_bytes(str(tiny_pair[1]))
    assert sources.model_available_offline("org/tiny-large")

    snapshot = cache_repo(cache, "org/half-7B-4bit", tiny_pair[1], ["config.json", "model.safetensors"])
    (snapshot / "model.safetensors.index.json").write_text(
        json.dumps(
            {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
        )
    )
    assert estimate_model_bytes("org/half-7B-4bit") is None  # a download that stopped half-way

    assert estimate_model_bytes("mlx-community/Qwen2.5-7B-Instruct-4bit") is None
    # 4-bit weights plus a scale and a bias per 64 (0.625 bytes a parameter on a CPU).
    per_param = 0.5 + 2 * FLOAT / 64
    assert guess_model_bytes("mlx-community/Qwen2.5-7B-Instruct-4bit") == int(7e9 * per_param)
    assert guess_model_bytes("mlx-community/Qwen3-0.6B-4bit") == int(0.6e9 * per_param)
    assert guess_model_bytes("HuggingFaceTB/SmolLM2-135M-Instruct") == int(135e6 * FLOAT)
    assert guess_model_bytes("org/mystery") is None


def test_kv_cache_allowance_follows_the_config():
    config = {
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "hidden_size": 256,
        "max_position_embeddings": 8192,
    }
    assert kv_cache_bytes(config) == 2 * 4 * 2 * 32 * FLOAT * 4096  # keys + values, 4k tokens
    assert kv_cache_bytes({**config, "max_position_embeddings": 512}) == 2 * 4 * 2 * 32 * FLOAT * 512
    assert kv_cache_bytes({}) > 0


def test_memory_check_refuses_a_huge_requirement_and_force_overrides(tiny_pair, monkeypatch):
    profile = Profile(
        name="tiny", mode="pair", models=tuple(map(str, tiny_pair)), router=RouterConfig(up=(1.0,))
    )
    assert check_memory(profile).fits  # tiny models fit anywhere
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 1000)
    with pytest.raises(InsufficientMemoryError) as error:
        check_memory(profile)
    message = str(error.value)
    assert message.startswith("profile 'tiny' needs about 0.0 GB (small 0.0 GB + large 0.0 GB + KV ")
    assert message.endswith("but this machine has 0.0 GB available; use --force-memory to try anyway")
    forced = check_memory(profile, force=True)
    assert not forced.fits and forced.available == 1000
    assert forced.needed == sum(
        estimate_model_bytes(str(p)) + kv_cache_bytes(json.loads((p / "config.json").read_text()))
        for p in tiny_pair
    )


def test_memory_check_guesses_models_not_downloaded(tmp_path, monkeypatch):
    hub_cache(tmp_path, monkeypatch)
    monkeypatch.setattr(memory, "available_memory_bytes", lambda: 4 * 10**9)
    sources = ["mlx-community/Qwen2.5-0.5B-Instruct-4bit", "mlx-community/Qwen2.5-7B-Instruct-4bit"]
    with pytest.raises(
        InsufficientMemoryError,
        match=r"^these models needs about \d+\.\d GB \(small "
        r"0\.\d GB \+ large 4\.\d GB \+ KV \d\.\d GB; sizes of models not downloaded "
        r"yet are guessed from their names\) but this machine has 4\.0 GB available",
    ):
        check_memory(sources)
    unknown = estimate_memory(["org/mystery"])
    assert unknown.unknown == ("org/mystery",) and unknown.needed == 0 and unknown.fits


def test_nesting_gears_in_memory_counts_the_planes_beside_the_source(tiny_pair):
    plain = Profile(name="plain", mode="single", models=(str(tiny_pair[1]),))
    geared = Profile(
        name="geared", mode="gears", models=(str(tiny_pair[1]),), gears=(4, 8), router=RouterConfig(up=(1.0,))
    )
    weights = estimate_memory(plain).models[0].weights
    config = json.loads((tiny_pair[1] / "config.json").read_text())
    params = sum(v.size for _, v in tree_flatten(make_model(config, 0).parameters()))
    # Two 4-bit planes (1 byte a parameter) plus a scale and a bias per 64 for each.
    assert estimate_memory(geared).models[0].weights == weights + int(params * (1 + 2 * 2 * FLOAT / 64))


def test_available_memory_is_positive():
    assert memory.available_memory_bytes() > 0


def test_a_bf16_gguf_is_estimated_at_its_loaded_width(tmp_path):
    # One GGUF type table serves the loader and the estimate: BF16 is read as a 2-byte float
    # (held as float32 on a CPU), not counted as an unknown type at 1 byte per element.
    from test_gguf import _raw_gguf

    path = tmp_path / "bf16.gguf"
    count = 4096
    _raw_gguf(
        path, [("output_norm.weight", 30, [count], b"\0" * (2 * count))], {"general.architecture": "llama"}
    )
    assert estimate_model_bytes(str(path)) == count * (4 if compute_dtype() is not None else 2)
