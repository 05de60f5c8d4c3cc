"""Tiers of one ladder must share a tokenizer: the check that refuses a mismatched pair."""

from __future__ import annotations

from ..errors import TokenizerMismatchError

# Mixed prose, digits, accents, CJK, symbols and code: where byte-level BPEs tend to differ.
PROBE_TEXT = "Entropy 12345, naïve café — 日本語 ✓\ndef f(x):\n    return x ** 2  # ok"


def check_shared_tokenizer(name_a: str, tok_a, name_b: str, tok_b) -> None:
    """Refuse two tiers whose tokenizers differ in vocabulary, encoding or end-of-sequence ids."""
    if tok_a is tok_b:  # one object, parsed once from the same files (loading.shared_tokenizers)
        return

    def fail(what: str) -> TokenizerMismatchError:
        return TokenizerMismatchError(
            f"models '{name_a}' and '{name_b}' do not share a tokenizer: {what}; "
            "a pair must use one tokenizer"
        )

    # The tokenizers' own vocabularies: a model's embedding is often padded past them.
    vocab_a, vocab_b = tok_a.get_vocab(), tok_b.get_vocab()
    if len(vocab_a) != len(vocab_b):
        raise fail(f"vocabularies differ ({len(vocab_a)} vs {len(vocab_b)} tokens)")
    if vocab_a != vocab_b:
        differing = sum(1 for token, index in vocab_a.items() if vocab_b.get(token) != index)
        raise fail(f"vocabularies differ ({differing} of {len(vocab_a)} tokens map to other ids)")
    if tok_a.encode(PROBE_TEXT) != tok_b.encode(PROBE_TEXT):
        raise fail("they encode the same text differently")
    # The engine renders prompts with one tier's chat template: its special tokens must encode
    # alike in both (templates themselves may differ, e.g. in a default system prompt).
    for name, tok in ((name_a, tok_a), (name_b, tok_b)):
        rendered = _render_probe(tok)
        if rendered is not None and (
            tok_a.encode(rendered, add_special_tokens=False)
            != tok_b.encode(rendered, add_special_tokens=False)
        ):
            raise fail(f"they encode the chat text rendered by {name}'s template differently")
    eos_a, eos_b = sorted(tok_a.eos_token_ids), sorted(tok_b.eos_token_ids)
    if eos_a != eos_b:
        raise fail(f"end-of-sequence ids differ ({eos_a} vs {eos_b})")


def _render_probe(tok) -> str | None:
    if not getattr(tok, "has_chat_template", False):
        return None
    chat = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": PROBE_TEXT},
        {"role": "assistant", "content": "x = 42"},
        {"role": "user", "content": "2 + 2 = ?"},
    ]
    return tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
