"""mlx-lm's tokenizer of a model directory, kept per machine once loaded: a later load unpickles it
(~0.7 s for the Qwen pair's 151,936-token tokenizer) instead of parsing its files again (~2.5 s:
mlx-lm and transformers read `tokenizer.json` three times, then convert every id), most of a
cold start's wait beside the weights.

Kept in the user's cache directory (resources.cache_dir, as converted models are), keyed by the
digest of the files that define the tokenizer and its end-of-sequence ids (loading.tokenizer_key)
and by the versions of the libraries whose objects the file holds: another version loads the
files again and keeps its own. A file that cannot be read (damaged, another Python) is loaded
again and replaced; one that cannot be written is skipped, never half-written.
"""

from __future__ import annotations

import contextlib
import hashlib
import pickle
import platform
from importlib import metadata
from pathlib import Path

from ..errors import OutputError
from ..files import atomic_file
from ..resources import cache_dir

# What a kept file is made of: its objects are these libraries' classes (a new version re-keys).
_LIBRARIES = ("mlx-lm", "transformers", "tokenizers")
FORMAT = 1  # bump when what is kept changes


def kept_file(key: str) -> Path:
    """Where the tokenizer of `key` (loading.tokenizer_key) is kept for this Python and libraries."""
    versions = [platform.python_version(), FORMAT, *(metadata.version(name) for name in _LIBRARIES)]
    digest = hashlib.sha256(f"{key}:{versions}".encode()).hexdigest()[:32]
    return cache_dir() / "tokenizers" / f"{digest}.pickle"


def kept_tokenizer(path: Path, config: dict, key: str):
    """mlx-lm's tokenizer of the directory `path` (eos ids from `config`), from the file an earlier
    load kept, else loaded (mlx_lm.utils.load_tokenizer) and kept."""
    from mlx_lm.utils import load_tokenizer

    file = kept_file(key)
    try:
        with file.open("rb") as handle:
            return pickle.load(handle)
    except OSError:
        pass  # none kept yet, or a cache directory that cannot be read (a home that is a file)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        with contextlib.suppress(OSError):
            file.unlink()  # damaged, or written by other code: loaded again below
    tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(file, "tokenizer cache", binary=True) as handle:
            pickle.dump(tokenizer, handle, protocol=pickle.HIGHEST_PROTOCOL)
    except (OSError, OutputError, pickle.PicklingError, TypeError, AttributeError):
        pass  # a read-only or full cache: the next load parses the files again
    return tokenizer
