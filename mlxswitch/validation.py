"""Checks before and after loading: tiers share a tokenizer, and the profile fits in memory."""

from __future__ import annotations

import json
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .errors import InsufficientMemoryError, TokenizerMismatchError
from .loading import is_embedded, looks_like_path

PROBE_TEXT = "Entropy 12345, naïve café — 日本語 ✓\ndef f(x):\n    return x ** 2  # ok"
_GB = 1e9


def check_shared_tokenizer(name_a: str, tok_a, name_b: str, tok_b) -> None:
    """Refuse two tiers whose tokenizers differ in vocabulary, encoding or end-of-sequence ids."""
    def fail(what: str) -> TokenizerMismatchError:
        return TokenizerMismatchError(
            f"models '{name_a}' and '{name_b}' do not share a tokenizer: {what}; "
            "a pair must use one tokenizer")

    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if len(vocab_a) != len(vocab_b):
        raise fail(f"vocabularies differ ({len(vocab_a)} vs {len(vocab_b)} tokens)")
    if vocab_a != vocab_b:
        differing = sum(1 for token, index in vocab_a.items() if vocab_b.get(token) != index)
        raise fail(f"vocabularies differ ({differing} of {len(vocab_a)} tokens map to other ids)")
    if tok_a.encode(PROBE_TEXT) != tok_b.encode(PROBE_TEXT):
        raise fail("they encode the same text differently")
    if set(tok_a.eos_token_ids) != set(tok_b.eos_token_ids):
        raise fail(f"end-of-sequence ids differ ({sorted(tok_a.eos_token_ids)} vs "
                   f"{sorted(tok_b.eos_token_ids)})")
    if tok_a.has_chat_template and tok_b.has_chat_template:
        chat = [{"role": "user", "content": PROBE_TEXT}]
        if (tok_a.apply_chat_template(chat, add_generation_prompt=True)
                != tok_b.apply_chat_template(chat, add_generation_prompt=True)):
            raise fail("their chat templates render the same conversation differently")


def _hub_snapshot(repo_id: str) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors"],
                                      local_files_only=True))
    except Exception:  # not cached: we never go to the network just to look
        return None


def _local_path(source: str) -> Path | None:
    if is_embedded(source):
        from .resources import embedded_gguf_path

        return embedded_gguf_path() if _embedded_present() else None
    if looks_like_path(source):
        path = Path(source).expanduser()
        return path if path.exists() else None
    return _hub_snapshot(source)


def _embedded_present() -> bool:
    from .resources import embedded_gguf_present

    return embedded_gguf_present()


def model_available_offline(source: str) -> bool:
    """Whether the model's files are on this machine (embedded, a path, or the HF cache)."""
    return _local_path(source) is not None


def estimate_model_bytes(source: str) -> int | None:
    """Bytes the model's weights take in memory, from the files on disk (None if not local)."""
    path = _local_path(source)
    if path is None:
        return None
    if path.is_file():
        # GGUF fp16 quantization scales/biases become fp32 on CPU: +~25% for 4-bit tensors.
        return int(path.stat().st_size * 1.25)
    return sum(f.stat().st_size for f in path.glob("*.safetensors"))


def _kv_bytes(source: str, tokens: int = 4096) -> int:
    path = _local_path(source)
    config_path = path / "config.json" if path is not None and path.is_dir() else None
    if config_path is None or not config_path.exists():
        return 64 * 1024 * tokens  # a small model's KV per token, when the config is out of reach
    config = json.loads(config_path.read_text())
    layers = config.get("num_hidden_layers", 32)
    heads = config.get("num_key_value_heads") or config.get("num_attention_heads", 32)
    head_dim = config.get("head_dim") or config.get("hidden_size", 4096) // config.get("num_attention_heads", 32)
    return 2 * layers * heads * head_dim * 4 * tokens  # keys + values, fp32 worst case


def available_memory_bytes() -> int:
    """Memory the models may use: MemAvailable on Linux; 75% of RAM on macOS (Metal's working set)."""
    if platform.system() == "Darwin":
        try:
            total = int(subprocess.run(["sysctl", "-n", "hw.memsize"], capture_output=True,
                                       text=True, timeout=5).stdout.strip())
        except (OSError, ValueError, subprocess.SubprocessError):
            total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(total * 0.75)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


@dataclass(frozen=True)
class MemoryEstimate:
    """What a profile needs against what the machine has; unknown models count as zero."""

    needed: int
    available: int
    parts: tuple[tuple[str, int], ...]
    unknown: tuple[str, ...]

    @property
    def fits(self) -> bool:
        """Whether the known needs fit."""
        return self.needed <= self.available


def estimate_profile_memory(profile) -> MemoryEstimate:
    """Weights of every local model plus a 4k-token KV cache each."""
    parts, unknown = [], []
    for source in profile.models:
        size = estimate_model_bytes(source)
        if size is None:
            unknown.append(source)
            continue
        parts.append((source, size + _kv_bytes(source)))
    needed = sum(size for _, size in parts)
    return MemoryEstimate(needed, available_memory_bytes(), tuple(parts), tuple(unknown))


def check_memory(profile, force: bool = False) -> MemoryEstimate:
    """Refuse a profile whose models will not fit, unless forced."""
    estimate = estimate_profile_memory(profile)
    if not estimate.fits and not force:
        detail = " + ".join(f"{Path(name).name} {size / _GB:.1f} GB" for name, size in estimate.parts)
        raise InsufficientMemoryError(
            f"profile '{profile.name}' needs about {estimate.needed / _GB:.1f} GB ({detail}) but this "
            f"machine has {estimate.available / _GB:.1f} GB available; use --force-memory to try anyway")
    return estimate
