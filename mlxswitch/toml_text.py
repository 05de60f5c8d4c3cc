"""A TOML file read for messages that name a line: parse errors as file:line:column, and where each
table and key sits (tomllib gives values, not positions)."""

from __future__ import annotations

import re
import tomllib
from itertools import pairwise
from pathlib import Path

from .errors import ConfigError

_TOML_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)")
_HEADER = re.compile(r"^\s*\[\[?(.+?)\]\]?\s*(?:#.*)?$")
_HEADER_PART = re.compile(r"\"((?:[^\"\\]|\\.)*)\"|'([^']*)'|([A-Za-z0-9_-]+)")


def table_header(line: str) -> tuple[str, ...] | None:
    """The table path a `[table]` or `[[array]]` header line opens (quoted parts unquoted, so
    `[profiles."a.b"]` is ("profiles", "a.b")); None for any other line."""
    header = _HEADER.match(line)
    if header is None:
        return None
    return tuple(next(p for p in m.groups() if p is not None) for m in _HEADER_PART.finditer(header.group(1)))


class TomlFile:
    """One parsed TOML file and the line numbers of its tables and keys."""

    def __init__(self, path: Path, text: str, data: dict):
        self.path, self.lines, self.data = path, text.splitlines(), data
        # (first line index, table path) of every [table] header; the root table starts at 0.
        self.sections: list[tuple[int, tuple[str, ...]]] = [(0, ())]
        for index, line in enumerate(self.lines):
            parts = table_header(line)
            if parts is not None:
                self.sections.append((index, parts))

    def _ranges(self, table: tuple[str, ...]):
        bounds = self.sections + [(len(self.lines), None)]
        for (start, parts), (end, _) in pairwise(bounds):
            if parts == table:
                yield start, end

    def line_of(self, key: str | None, table: tuple[str, ...] = ()) -> int | None:
        """1-based line of `key = ` inside `table` (or of its header, or its inline definition)."""
        key_line = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=") if key else None
        headers = []
        for start, end in self._ranges(table):
            headers.append(start + 1)
            for index in range(start, end):
                if key_line and key_line.match(self.lines[index]):
                    return index + 1
        if key:  # the key may be a table of its own: [profiles.NAME.cloud]
            for start, _ in self._ranges(table + (key,)):
                return start + 1
        if headers and table:
            return headers[0]
        if len(table) > 1:  # an inline table, e.g. `NAME = { ... }` under [profiles]
            return self.line_of(table[-1], table[:-1])
        return None

    def where(self, key: str | None, table: tuple[str, ...] = ()) -> str:
        """'file:line' for a key (or 'file' when the line cannot be found)."""
        line = self.line_of(key, table)
        return f"{self.path}:{line}" if line else str(self.path)


def read_toml(path: Path) -> TomlFile:
    """`path` parsed; ConfigError naming the file (and line and column, for a syntax error)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        what = _TOML_POSITION.sub("", message)
        position = _TOML_POSITION.search(message)
        if position and position.group(1):
            line, column = position.group(1), position.group(2)
        else:  # "at end of document": point just past the last character
            lines = text.splitlines() or [""]
            line, column = len(lines), len(lines[-1]) + 1
        raise ConfigError(f"{path}:{line}:{column}: {what}") from None
    return TomlFile(path, text, data)
