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
