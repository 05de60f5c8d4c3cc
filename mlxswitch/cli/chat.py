"""Running a chat session for the CLI: the interactive loop, the piped loop, JSON and telemetry."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from typing import IO, Iterator

from ..decoding.answer import AnswerSummary, TokenEvent, json_float
from ..decoding.session import ChatSession
from ..errors import MlxSwitchError, UsageError
from ..routing.router import max_entropy_bits, parse_thresholds
from . import ui

HELP = """commands:
  /help              this list
  /reset             forget the conversation
  /stats             tokens per tier over this session
  /tau UP [DOWN]     set up (and down) thresholds, comma-separated per rung boundary
  /quit              leave (Ctrl-D too); Ctrl-C stops an answer"""


def _threshold_json(values) -> list:
    # JSON has no infinity; "inf"/"-inf" strings round-trip through float().
    return [json_float(v) for v in values]


def answer_record(summary: AnswerSummary, session: ChatSession) -> dict:
    """The JSON object printed for one answer with --json."""
    config = session.router_config
    return {
        "prompt": summary.prompt,
        "text": summary.text,
        "finish_reason": summary.finish_reason,
        "tokens": [event.record() for event in summary.tokens],
        "stats": summary.stats(),
        "router": {
            "tiers": summary.tier_names,
            "up": _threshold_json(config.up),
            "down": _threshold_json(config.downs()),
            "window": config.window,
            "min_run": config.min_run,
            "normalized": config.normalize,
            "vocab_size": config.vocab_size,
            "initial_entropy": json_float(summary.initial_entropy),
        },
    }


class ChatRunner:
    """Drives a ChatSession for the terminal or for stdin prompts."""

    def __init__(self, session: ChatSession, json_output: bool = False,
                 color: bool | None = None, shade: bool = False, telemetry: Path | None = None):
        self.session = session
        self.json_output = json_output
        self.color = color
        self.shade = shade
        self.summaries: list[AnswerSummary] = []
        self.telemetry: IO[str] | None = None
        self.telemetry_path = telemetry
        self.answer_index = 0

    # -- piped ------------------------------------------------------------------------------

    def piped(self, prompts: list[str], keep_history: bool) -> int:
        """Answer each prompt in order; stdout gets only answers (or JSON), stderr the status."""
        stdout_console = ui.make_console(color=bool(self.color))
        painter = ui.TokenPainter(stdout_console, self.session.ladder.tier_names, self.shade,
                                  self._max_entropy()) if self.color else None
        status = ui.make_console(stderr=True)
        exit_code = 0
        with self._telemetry_file():
            for prompt in prompts:
                if not keep_history:
                    self.session.reset()
                try:
                    summary = self._run_answer(prompt, painter)
                except KeyboardInterrupt:
                    self._finish_output(self.session.last_summary)
                    return ui_interrupted()
                except MlxSwitchError as exc:
                    ui.print_error(str(exc))
                    exit_code = exc.exit_code
                    continue
                self._finish_output(summary)
                ui.print_status(status, summary, painter.colours if painter else None)
        return exit_code

    def _finish_output(self, summary: AnswerSummary | None) -> None:
        if summary is None:
            return
        if self.json_output:
            sys.stdout.write(json.dumps(answer_record(summary, self.session), ensure_ascii=False,
                                        allow_nan=False) + "\n")
        else:
            sys.stdout.write("\n")
        sys.stdout.flush()

    # -- interactive ------------------------------------------------------------------------

    def interactive(self) -> int:
        """A multi-turn chat on a terminal, until /quit or Ctrl-D."""
        console = ui.make_console(color=self.color)
        painter = ui.TokenPainter(console, self.session.ladder.tier_names, self.shade,
                                  self._max_entropy())
        ui.print_banner(console, self.session.ladder.description, painter.legend())
        with self._telemetry_file():
            while True:
                try:
                    line = console.input("[bold]› [/bold]")
                except EOFError:
                    console.print()
                    return 0
                except KeyboardInterrupt:
                    console.print()
                    continue
                line = line.strip()
                if not line:
                    continue
                if line.startswith("/"):
                    if self._command(line, console) == "quit":
                        return 0
                    continue
                try:
                    summary = self._run_answer(line, painter)
                except KeyboardInterrupt:
                    summary = self.session.last_summary
                except MlxSwitchError as exc:
                    console.print()
                    ui.print_error(str(exc))
                    continue
                console.print()
                if summary is not None:
                    ui.print_status(console, summary, painter.colours)

    def _command(self, line: str, console) -> str | None:
        name, _, rest = line.partition(" ")
        if name in ("/quit", "/exit", "/q"):
            return "quit"
        if name == "/help":
            console.print(HELP)
        elif name == "/reset":
            self.session.reset()
            ui.print_dim(console, "conversation cleared")
        elif name == "/stats":
            console.print(ui.stats_table(self.summaries))
        elif name == "/tau":
            try:
                self._set_tau(rest.split())
            except MlxSwitchError as exc:
                ui.print_error(str(exc))
            else:
                config = self.session.router_config
                ui.print_dim(console, f"up {_threshold_json(config.up)} down "
                                      f"{_threshold_json(config.downs())}")
        else:
            ui.print_error(f"unknown command {name}; /help lists them")
        return None

    def _set_tau(self, words: list[str]) -> None:
        if not words or len(words) > 2:
            raise UsageError("usage: /tau UP[,UP…] [DOWN[,DOWN…]]")
        up = parse_thresholds(words[0])
        down = parse_thresholds(words[1]) if len(words) == 2 else None
        self.session.router_config = self.session.router_config.with_thresholds(up, down)

    # -- shared -----------------------------------------------------------------------------

    def _run_answer(self, prompt: str, painter: ui.TokenPainter | None) -> AnswerSummary:
        """Stream one answer to stdout (painted, plain, or silent for JSON); return its summary."""
        stream = self.session.stream(prompt)
        shown = ""
        tier, entropy = "", None

        def show(piece: str) -> None:
            if self.json_output or not piece:
                return
            if painter is not None:
                painter.paint(piece, tier, entropy)
            else:
                sys.stdout.write(piece)
                sys.stdout.flush()

        try:
            for event in stream:
                if isinstance(event, TokenEvent):
                    self._write_telemetry(event)
                    tier, entropy = event.tier, event.entropy
                    show(event.text)
                    shown += event.text
        finally:
            stream.close()  # on Ctrl-C this keeps the partial answer in the history
            summary = self.session.last_summary
            if summary is not None:
                show(summary.text[len(shown):])  # bytes the detokenizer held until the end
                self.summaries.append(summary)
            self.answer_index += 1
        return summary

    def _write_telemetry(self, event: TokenEvent) -> None:
        if self.telemetry is not None:
            record = {"answer": self.answer_index, "index": event.index, **event.record()}
            self.telemetry.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.telemetry.flush()

    @contextlib.contextmanager
    def _telemetry_file(self) -> Iterator[None]:
        if self.telemetry_path is None:
            yield
            return
        with open(self.telemetry_path, "w", encoding="utf-8") as handle:
            self.telemetry = handle
            try:
                yield
            finally:
                self.telemetry = None

    def _max_entropy(self) -> float:
        return max_entropy_bits(max(self.session.ladder.vocab_size, 2))


def ui_interrupted() -> int:
    """Exit code after Ctrl-C in piped mode (what was produced is already printed)."""
    ui.print_warning("interrupted")
    return 130
