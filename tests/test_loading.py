"""Loading an mlx-lm directory (models/loading.py): a ladder's models whose tokenizer files agree
parse them once, one whose files differ gets its own, and loads outside a ladder never share."""

from __future__ import annotations

import json
import shutil

from mlxswitch.models.loading import shared_tokenizers, tokenizer_key
from mlxswitch.models.sources import load_model


def test_a_pair_with_the_same_tokenizer_files_shares_one_tokenizer(tiny_pair, tmp_path):
    small_dir, large_dir = tiny_pair
    with shared_tokenizers():
        small, large = load_model(str(small_dir)), load_model(str(large_dir))
    assert small.tokenizer is large.tokenizer
    # Outside a ladder's loads each model has its own: a caller's change to one stays there.
    alone = load_model(str(large_dir))
    assert alone.tokenizer is not large.tokenizer
    # Another end-of-sequence id in the config, or another tokenizer file: another tokenizer.
    other = tmp_path / "other"
    shutil.copytree(large_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["eos_token_id"] = 7
    (other / "config.json").write_text(json.dumps(config))
    assert tokenizer_key(other, config) != tokenizer_key(
        large_dir, json.loads((large_dir / "config.json").read_text())
    )
    with shared_tokenizers():
        load_model(str(large_dir))
        apart = load_model(str(other))
    assert apart.tokenizer is not large.tokenizer and 7 in apart.tokenizer.eos_token_ids
    assert small.tokenizer.encode("Count: one two") == apart.tokenizer.encode("Count: one two")


def test_a_tokenizer_is_kept_once_loaded_and_read_back_whole(tiny_pair, monkeypatch):
    import pickle

    import mlx_lm.utils

    from mlxswitch.models import tokenizer_cache
    from mlxswitch.models.loading import _tokenizer, tokenizer_key
    from mlxswitch.models.weights import read_json

    folder = tiny_pair[0]
    config = read_json(folder / "config.json")
    first = _tokenizer(folder, config)
    kept = tokenizer_cache.kept_file(tokenizer_key(folder, config))
    assert kept.is_file() and not list(kept.parent.glob(".*partial"))
    text = "Entropy 12345, naïve café\ndef f(x):\n    return x"
    chat = [{"role": "user", "content": text}]

    def parse(*args, **kwargs):
        raise AssertionError("parsed again")

    with monkeypatch.context() as patch:  # read back: the files are not parsed again
        patch.setattr(mlx_lm.utils, "load_tokenizer", parse)
        again = _tokenizer(folder, config)
    assert again is not first  # each load its own object (outside shared_tokenizers)
    assert again.encode(text) == first.encode(text) and again.eos_token_ids == first.eos_token_ids
    assert again.apply_chat_template(chat, add_generation_prompt=True) == first.apply_chat_template(
        chat, add_generation_prompt=True
    )
    kept.write_bytes(b"not a pickle")  # damaged: parsed again and replaced
    assert _tokenizer(folder, config).encode(text) == first.encode(text)
    assert pickle.loads(kept.read_bytes()).encode(text) == first.encode(text)
    kept.unlink()
    with monkeypatch.context() as patch:  # a cache that cannot be written: the load goes on
        patch.setattr(
            tokenizer_cache.pickle, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full"))
        )
        assert _tokenizer(folder, config).encode(text) == first.encode(text)
    assert not kept.exists() and not list(kept.parent.glob(".*partial"))
