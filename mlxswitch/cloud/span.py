"""A span call's prompt, and splicing its streamed reply onto the local answer (pure text)."""

from __future__ import annotations

import re

_TAIL_WORD = re.compile(r"\w+$")


def span_prompt(question: str, partial: str, span_tokens: int) -> str:
    """The last user turn of a span call: the question, the local answer so far, the instruction."""
    words = max(3, span_tokens * 3 // 4)  # ~0.75 English words a token
    if not partial.strip():
        return (
            f"{question}\n\n(Write only the first sentence of your reply, at most {words} words,"
            " no preamble.)"
        )
    tail = _TAIL_WORD.search(partial)
    # A reply that ends in a letter may end mid-word: asking for that word again, in full, makes
    # the join exact (strip_repeated_prefix removes it) instead of guessing whether to add a space.
    anchor = (
        f'It stops at "{tail.group()}", which may be a cut-off word: begin by writing that word '
        "again in full, then go on. "
        if tail
        else ""
    )
    return (
        f"{question}\n\n<reply_so_far>\n{partial}</reply_so_far>\n\n"
        "The text in <reply_so_far> is the beginning of your reply to my message above; it breaks "
        "off mid-way. Continue it from exactly where it stops, in the same voice and language: "
        f"write only the next part, about one sentence and at most {words} words, ending at the end "
        f"of a sentence. {anchor}No preamble, no quotes, no tags, and do not repeat the text so far"
        f"{' beyond that word' if tail else ''}."
    )


def _word_start(text: str, i: int) -> bool:
    return i == 0 or not (text[i - 1].isalnum() and text[i].isalnum())


def _overlap(partial: str, body: str) -> int:
    """Length of the longest prefix of body that repeats a suffix of partial starting a word."""
    for k in range(min(len(partial), len(body)), 0, -1):
        if partial.endswith(body[:k]) and _word_start(partial, len(partial) - k):
            return k
    return 0


def _may_still_repeat(partial: str, body: str) -> bool:
    """Whether more text could make body a longer repeat of partial (so: wait before showing)."""
    i = partial.find(body)
    while i != -1:
        if len(partial) - i > len(body) and _word_start(partial, i):
            return True
        i = partial.find(body, i + 1)
    return False


def strip_repeated_prefix(partial: str, reply: str) -> str:
    """The reply without any leading repeat of the partial answer's end (whole words from its start)."""
    body = reply.lstrip()
    k = _overlap(partial, body)
    return body[k:] if k else reply


_BOUNDARY = re.compile(r"[.!?…][\"'”’)\]]*(?=\s)|\n")
_FINAL_BOUNDARY = re.compile(r"[.!?…][\"'”’)\]]*(?=\s|$)|\n")


def _last_boundary(text: str, final: bool) -> int:
    # Mid-stream a "." needs the next character to be a space ("3.14" is no end); at the end, not.
    ends = [m.end() for m in (_FINAL_BOUNDARY if final else _BOUNDARY).finditer(text)]
    return ends[-1] if ends else 0


class SpanSplicer:
    """Turns streamed reply pieces into the text to show after the partial answer."""

    def __init__(self, partial: str) -> None:
        self.partial = partial
        self.raw = ""  # everything the model sent
        self.text: str | None = None  # spliced text once the repeat question is settled
        self.sent = 0  # how much of self.text was handed out

    def feed(self, piece: str) -> str:
        """Take a piece of the reply; return what may be shown now (held: repeats, unfinished sentence)."""
        self.raw += piece
        if self.text is None:
            body = self.raw.lstrip()
            if not body or _may_still_repeat(self.partial, body):
                return ""
            self.text = self._join(self.raw)
        else:
            self.text += piece
        # Show whole sentences only, so a reply cut by max_tokens can lose its unfinished tail.
        end = _last_boundary(self.text, final=False)
        out, self.sent = self.text[self.sent : max(end, self.sent)], max(end, self.sent)
        return out

    def finish(self, cut: bool) -> str:
        """The rest to show at the end; a reply cut at max_tokens drops its unfinished sentence."""
        if self.text is None:
            self.text = self._join(self.raw)
        end = _last_boundary(self.text, final=True) if cut else 0
        if end:  # with no sentence end at all, a cut reply is still better than none
            self.text = self.text[: max(end, self.sent)]
        out, self.sent = self.text[self.sent :], len(self.text)
        return out

    def _join(self, reply: str) -> str:
        partial = self.partial
        text = strip_repeated_prefix(partial, reply)
        overlapped = text != reply
        if not partial.strip():
            return text.lstrip()
        if partial[-1].isspace():
            return text.lstrip(" \t")
        if not text or text[0].isspace() or overlapped:
            return text
        # No repeat to align on: a letter or a sentence mark then a letter means a new word.
        if text[0].isalnum() and (partial[-1].isalnum() or partial[-1] in ".!?,;:"):
            return " " + text
        return text


def join_continuation(partial: str, reply: str, cut: bool = False) -> str:
    """The text that follows partial, given the whole reply (cut: it stopped at max_tokens)."""
    splicer = SpanSplicer(partial)
    return splicer.feed(reply) + splicer.finish(cut)


class Passthrough:
    """An answer hand-off shows the reply as it comes (without leading whitespace)."""

    def __init__(self) -> None:
        self.raw = ""

    def feed(self, piece: str) -> str:
        """Show the piece (minus the reply's leading whitespace)."""
        shown = piece if self.raw.strip() else piece.lstrip()
        self.raw += piece
        return shown

    def finish(self, cut: bool) -> str:
        """Nothing is held back: a whole answer cut at max_tokens is still kept whole."""
        return ""
