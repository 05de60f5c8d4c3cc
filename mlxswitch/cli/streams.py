"""What the CLI reads and writes besides the terminal: prompts from stdin, the telemetry file,
crash logs, and a stdout whose reader went away."""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, BinaryIO

from ..errors import UsageError
from ..files import commit, open_temporary
from ..resources import user_dir


@dataclass(frozen=True)
class PromptLine:
    """One prompt from the input: its text, or why that line cannot be a prompt."""

    number: int  # 1-based input line (1 for --prompt and --whole)
    text: str | None
    error: UsageError | None = None


def _decode(raw: bytes, number: int, what: str) -> PromptLine:
    try:
        return PromptLine(number, raw.decode("utf-8").strip())
    except UnicodeDecodeError as exc:
        return PromptLine(
            number,
            None,
            UsageError(
                f"{what} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                "it was skipped"
            ),
        )


def prompt_lines(source: BinaryIO | list[str] | tuple[str, ...], whole: bool = False) -> Iterator[PromptLine]:
    """Prompts as they arrive: each non-empty line (or all of the input with `whole`)."""
    if isinstance(source, (list, tuple)):  # --prompt
        yield from (PromptLine(1, text.strip()) for text in source if text.strip())
        return
    if whole:
        line = _decode(source.read(), 1, "the input")
        if line.error is not None or line.text:
            yield line
        return
    # Iterating a binary stream returns each line as soon as its newline arrives: an open
    # pipe is answered line by line, not when it closes.
    for number, raw in enumerate(source, 1):
        line = _decode(raw, number, f"input line {number}")
        if line.error is not None or line.text:
            yield line


def typed_line_problem(line: str) -> str | None:
    """Why a line typed at the terminal cannot be a prompt (None: it can)."""
    try:  # a terminal may hand undecodable bytes over as surrogate escapes
        line.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"the line is not UTF-8 text (byte 0x{ord(line[exc.start]) & 0xFF:02x}); type it again"
    return None


def peek_prompts(source, whole: bool = False) -> Iterator[PromptLine] | None:
    """The prompts, or None when the input holds none (then nothing needs loading)."""
    lines = prompt_lines(source, whole)
    first = next(lines, None)
    return None if first is None else itertools.chain([first], lines)


class TelemetryFile:
    """Per-token JSON Lines written to a temporary name beside FILE and renamed when closed."""

    def __init__(self, path: Path | None, handle: IO[str] | None, temporary: Path | None):
        self.path, self.handle, self.temporary = path, handle, temporary

    @classmethod
    def open(cls, path: Path | None) -> TelemetryFile:
        """Open FILE's temporary twin now, so an unwritable path fails before any model loads."""
        if path is None:
            return cls(None, None, None)
        path = Path(path).expanduser()
        handle, temporary = open_temporary(path, "--telemetry")
        return cls(path, handle, temporary)

    def write(self, record: dict) -> None:
        """Append one record and flush it (a reader may follow the file)."""
        if self.handle is not None:
            self.handle.write(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
            self.handle.flush()

    def __enter__(self) -> TelemetryFile:
        return self

    def __exit__(self, *exc_info) -> None:
        # Every line is whole, so what was written stands even after a failure or Ctrl-C.
        if self.handle is None:
            return
        self.handle.close()
        self.handle = None
        assert self.temporary is not None and self.path is not None  # open() sets all three
        commit(self.temporary, self.path, "--telemetry")


def silence_stdout() -> None:
    """After the reader of stdout left: send what is still buffered nowhere, quietly."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test runner's buffer)
        pass


def write_crash_log(exc: BaseException) -> Path | str:
    """Write the traceback under the user directory; its path (or why it could not be written)."""
    folder = user_dir() / "logs"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
        path.write_text("".join(traceback.format_exception(exc)))
        return path
    except OSError as err:
        return f"nowhere: {err.strerror or err}"
