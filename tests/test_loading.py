"""Loading an mlx-lm directory (models/loading.py): a pair whose tokenizer files agree parses them
once, and one whose files differ gets its own."""

from __future__ import annotations

import json
import shutil

from mlxswitch.models.loading import tokenizer_key
from mlxswitch.models.sources import load_model


def test_a_pair_with_the_same_tokenizer_files_shares_one_tokenizer(tiny_pair, tmp_path):
    small_dir, large_dir = tiny_pair
    small, large = load_model(str(small_dir)), load_model(str(large_dir))
    assert small.tokenizer is large.tokenizer
    # Another end-of-sequence id in the config, or another tokenizer file: another tokenizer.
    other = tmp_path / "other"
    shutil.copytree(large_dir, other)
    config = json.loads((other / "config.json").read_text())
    config["eos_token_id"] = 7
    (other / "config.json").write_text(json.dumps(config))
    assert tokenizer_key(other, config) != tokenizer_key(
        large_dir, json.loads((large_dir / "config.json").read_text())
    )
    apart = load_model(str(other))
    assert apart.tokenizer is not large.tokenizer and 7 in apart.tokenizer.eos_token_ids
    assert small.tokenizer.encode("Count: one two") == apart.tokenizer.encode("Count: one two")
