"""What both decoding loops (loop.py, verify.py) keep of one answer beside their own machinery: the
sequence they decode onto, how their driver runs their passes, and what the prompt's last
position measured. The engine (engine.py) reads and sets these on either loop alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class AnswerSequence:
    """The ids an answer is decoded onto: the conversation so far, extended in place as tokens are
    taken; the first `prompt_tokens` of them are the prompt, fed `prefill_step` ids a pass."""

    ids: list[int]
    prompt_tokens: int
    prefill_step: int = 512


@dataclass
class PassMode:
    """How the loop's passes are run; its driver may change both between passes."""

    # The next pass is queued before this token is read; only where passes stay lazy until read.
    pipelined: bool
    # The last pass was packed with other answers' rows: its seconds are not this answer's alone.
    shared_pass: bool = False


@dataclass
class Opening:
    """The bottom tier's uncertainty at the prompt's last position, which seeds the policy: its
    entropy and the routed signal (nan: not measured yet; None: no tier read that position)."""

    entropy: float | None = math.nan
    signal: float | None = math.nan
