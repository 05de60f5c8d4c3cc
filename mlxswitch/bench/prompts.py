"""The benchmark prompt suite: load and validate a JSON Lines file, check answers, pick subsets.

One JSON object per line (blank lines are skipped)::

    {"id": "arith-03", "category": "arithmetic", "split": "heldout",
     "prompt": "What is 25 + 17? Reply with only the number.",
     "answer": {"number": 42}, "max_tokens": 16}

- ``id``: unique non-empty string. ``category``: non-empty string (the bundled suite uses
  CATEGORIES). ``prompt``: non-empty string.
- ``answer``: ``{"number": N}`` (an int or float, not a string), ``{"regex": "..."}`` (a Python
  regular expression, matched with ``re.search``), or ``null`` / absent (not checkable).
- ``max_tokens``: optional positive integer. ``split``: optional, "calibration" or "heldout"
  (default "heldout"): a calibrate command tunes on one split and reports on the other.

Every problem is a ConfigError naming ``file:line`` and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, UsageError, one_line
from ..resources import bundled_file

CATEGORIES = ("code", "arithmetic", "facts", "instructions", "chat")
SPLITS = ("calibration", "heldout")
ANSWER_KINDS = ("number", "regex")
NUMBER_TOLERANCE = 1e-6
QUICK_PER_CATEGORY = 2

_KEYS = {"id", "category", "prompt", "answer", "max_tokens", "split"}

# A number in model output: optional minus, digits with optional thousands commas (1,250 -> 1250),
# optional decimals. "1,2,3" is read as the three numbers 1, 2 and 3, not as 123.
_NUMBER_RE = re.compile(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?")


@dataclass(frozen=True)
class BenchPrompt:
    """One suite item; answer_kind is "number", "regex" or None (then answer_value is None too)."""

    id: str
    category: str
    prompt: str
    answer_kind: str | None
    answer_value: float | str | None
    max_tokens: int | None
    split: str

    @property
    def checkable(self) -> bool:
        """Whether check_answer can score this prompt."""
        return self.answer_kind is not None


def default_suite_path() -> Path:
    """The bundled suite: bench_prompts/suite.jsonl in the package (wheel) or bench/prompts/ (checkout)."""
    path = bundled_file("bench_prompts/suite.jsonl", "bench/prompts/suite.jsonl")
    if not path.is_file():
        raise ConfigError(f"the bundled prompt suite is missing (looked for {path})")
    return path


# Characters of the user's text an error message quotes.
QUOTED = 80


def _parse_answer(raw: object, where: str) -> tuple[str | None, float | str | None]:
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise ConfigError(
            f'{where}: "answer" must be an object like {{"number": 42}} or {{"regex": "..."}}, or null'
        )
    if len(raw) != 1:
        kinds = ", ".join(sorted(map(str, raw))) or "none"
        raise ConfigError(f'{where}: "answer" must have exactly one of "number" or "regex" (got: {kinds})')
    ((kind, value),) = raw.items()
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            got = one_line(json.dumps(value), QUOTED)
            raise ConfigError(f'{where}: answer "number" must be a finite JSON number (got {got})')
        return "number", float(value)
    if kind == "regex":
        if not isinstance(value, str) or not value:
            raise ConfigError(f'{where}: answer "regex" must be a non-empty string')
        try:
            re.compile(value)
        except re.error as exc:
            raise ConfigError(
                f"{where}: bad answer regex {one_line(json.dumps(value), QUOTED)}: {one_line(exc, QUOTED)}"
            ) from None
        return "regex", value
    raise ConfigError(f'{where}: unknown answer kind "{one_line(kind, 40)}" (expected "number" or "regex")')


def _required_text(obj: dict, key: str, where: str) -> str:
    if key not in obj:
        raise ConfigError(f'{where}: missing "{key}"')
    value = obj[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f'{where}: "{key}" must be a non-empty string')
    return value


def _parse_line(line: str, where: str) -> BenchPrompt:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where}: bad JSON: {exc.msg} at column {exc.colno}") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{where}: each line must be a JSON object")
    unknown = sorted(set(obj) - _KEYS)
    if unknown:
        names, allowed = ", ".join(map(repr, unknown)), ", ".join(sorted(_KEYS))
        raise ConfigError(f"{where}: unknown key(s) {names} (allowed: {allowed})")
    pid = _required_text(obj, "id", where)
    category = _required_text(obj, "category", where)
    prompt = _required_text(obj, "prompt", where)
    kind, value = _parse_answer(obj.get("answer"), where)
    max_tokens = obj.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        raise ConfigError(
            f'{where}: "max_tokens" must be a positive integer '
            f"(got {one_line(json.dumps(max_tokens), QUOTED)})"
        )
    split = obj.get("split", "heldout")
    if split not in SPLITS:
        raise ConfigError(
            f'{where}: "split" must be "calibration" or "heldout" (got {one_line(json.dumps(split), QUOTED)})'
        )
    return BenchPrompt(pid, category, prompt, kind, value, max_tokens, split)


def load_prompts(path: str | Path) -> list[BenchPrompt]:
    """Read and validate a suite file; every problem is a ConfigError naming file:line."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such prompt file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a prompt file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({one_line(exc.strerror or exc, QUOTED)})") from None
    prompts: list[BenchPrompt] = []
    first_line: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        item = _parse_line(line, where)
        if item.id in first_line:
            raise ConfigError(
                f'{where}: duplicate id "{one_line(item.id, 40)}" (first on line {first_line[item.id]})'
            )
        first_line[item.id] = lineno
        prompts.append(item)
    if not prompts:
        raise ConfigError(f"{path}: no prompts (the file is empty)")
    return prompts


def numbers_in(text: str) -> list[float]:
    """Every number in text, in order, with thousands commas stripped ("1,250" -> 1250.0)."""
    return [float(m.group().replace(",", "")) for m in _NUMBER_RE.finditer(text)]


def check_answer(prompt: BenchPrompt, text: str) -> bool | None:
    """Score a reply: None if not checkable; number: the LAST number in text within 1e-6; regex: re.search.

    The last number is used because short replies put the result last ("17 + 25 = 42",
    "The answer is 42."); a reply with no number is wrong.
    """
    if prompt.answer_kind is None:
        return None
    if prompt.answer_kind == "number":
        found = numbers_in(text)
        assert isinstance(prompt.answer_value, float | int)  # the loader parses number answers
        return bool(found) and abs(found[-1] - float(prompt.answer_value)) <= NUMBER_TOLERANCE
    if prompt.answer_kind == "regex":
        return re.search(str(prompt.answer_value), text) is not None
    raise ValueError(f"unknown answer kind {prompt.answer_kind!r}")


def select(
    prompts: list[BenchPrompt],
    quick: bool = False,
    split: str | None = None,
    per_category: int = QUICK_PER_CATEGORY,
) -> list[BenchPrompt]:
    """Keep one split (None: all); with quick, the first per_category items of each category in file order."""
    if split is not None and split not in SPLITS:
        raise UsageError(f"unknown split '{split}' (expected calibration or heldout)")
    chosen = [p for p in prompts if split is None or p.split == split]
    if quick:
        taken: dict[str, int] = {}
        subset = []
        for p in chosen:
            if taken.get(p.category, 0) < per_category:
                taken[p.category] = taken.get(p.category, 0) + 1
                subset.append(p)
        chosen = subset
    if not chosen:
        raise UsageError(f"no prompts in split '{split}'" if split else "no prompts to run")
    return chosen
