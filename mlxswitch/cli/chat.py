"""Running a chat session for the CLI: the interactive loop, the piped loop, JSON and telemetry.

Piped output: each answer is followed by a newline and answers are separated by one blank
line; with --json, one object per prompt (a failed prompt too) is written and flushed as soon
as it is complete. The exit code is the first failure's.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

from ..decoding.answer import AnswerSummary, TokenEvent, json_float
from ..decoding.session import ChatSession, shown_by_cloud, shown_text
from ..errors import EXIT_INTERRUPTED, MlxSwitchError, UsageError
from ..kernels.route import current_route
from ..resources import user_dir
from ..routing.router import max_entropy_bits, parse_thresholds
from . import ui
from .streams import PromptLine, TelemetryFile, typed_line_problem

HELP = """commands:
  /help              this list
  /reset             forget the conversation
  /stats             tokens per tier over this session
  /tau UP [DOWN]     set up (and down) thresholds, comma-separated per rung boundary
  /quit              leave (Ctrl-D too); Ctrl-C stops an answer"""


def router_record(session: ChatSession, summary: AnswerSummary) -> dict:
    """The router settings an answer ran with: enough to re-derive every token's tier."""
    config = session.router_config
    settings = config.settings(json_float)
    settings["normalized"] = settings.pop("normalize")  # this record's name for it
    return {
        "tiers": session.tier_names,
        **settings,
        "vocab_size": config.vocab_size,
        "initial_entropy": json_float(summary.initial_entropy),
        **(
            {"initial_signal": json_float(summary.initial_signal)}
            if summary.initial_signal is not None
            else {}
        ),
    }


def route_record(session: ChatSession) -> dict:
    """What computes the tokens: the route (kernels/route.py) and each model's linears' route."""
    return {
        **current_route().record(),
        "models": {group.name: group.model.linears for group in session.ladder.groups},
    }


def route_line(session: ChatSession) -> str:
    """The route in one line, said once under the chat's banner."""
    route = current_route()
    models = ", ".join(f"{g.name} {g.model.linears or '?'}" for g in session.ladder.groups)
    product = {"panel-kernel": "panel kernel", "numpy-blas": "NumPy BLAS"}.get(route.resident_product)
    resident = any(g.model.linears == "resident-fp32" for g in session.ladder.groups)
    products = f" · fp32 copies by the {product}" if product and resident else ""
    if any(g.model.linears == "quant-kernel" for g in session.ladder.groups):
        products = " · stored codes by the quantized kernel (no fp32 copies)"
    threads = f" · threads {route.blas_threads}" if route.backend == "cpu" else ""
    return f"route: {route.backend} · linears: {models}{products} · signals {route.signals}{threads}"


def answer_record(summary: AnswerSummary, session: ChatSession) -> dict:
    """The JSON object printed for one answer with --json."""
    return {
        "prompt": summary.prompt,
        "text": shown_text(summary),  # both answers of a hand-off are in "handoff"
        "finish_reason": summary.finish_reason,
        "tokens": [event.record() for event in summary.tokens],
        "stats": summary.stats(),
        "router": router_record(session, summary),
        "decoding": session.decoding.settings(),
        "route": route_record(session),
        **({"handoff": summary.handoff} if summary.handoff is not None else {}),
    }


def history_problem(path: Path) -> str | None:
    """Why the interactive chat's history cannot be kept in `path` (None: it can).

    The line editor drops a history it cannot write without a word; this asks the file system
    first (making the directory and the file if they are missing), so the user hears it once.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"the chat history will not be kept: cannot write {path} ({exc.strerror or exc})"
    return None


class ChatRunner:
    """Drives a ChatSession for the terminal or for stdin prompts."""

    def __init__(
        self,
        session: ChatSession,
        json_output: bool = False,
        color: bool | None = None,
        shade: bool = False,
        telemetry: TelemetryFile | None = None,
    ):
        self.session = session
        self.json_output = json_output
        self.color = color
        self.shade = shade
        self.summaries: list[AnswerSummary] = []
        self.telemetry = telemetry or TelemetryFile(None, None, None)
        self.answer_index = 0
        self._gap_pending = False
        self._interactive = False
        if session.cloud is not None:
            session.cloud.waiting = ui.cloud_waiting(ui.stderr_is_terminal())

    # -- piped ------------------------------------------------------------------------------

    def piped(self, prompts: Iterable[PromptLine], keep_history: bool) -> int:
        """Answer each prompt as it arrives; stdout gets only answers (or JSON), stderr the rest."""
        painter = (
            ui.TokenPainter(
                ui.make_console(color=True), self.session.tier_names, self.shade, self._max_entropy()
            )
            if self.color
            else None
        )
        status = ui.make_console(stderr=True)
        first_failure = 0
        for line in prompts:
            failure: MlxSwitchError | None = line.error
            if failure is None:
                assert line.text is not None  # a line without an error holds a prompt
                if not keep_history:
                    self.session.reset()
                try:
                    summary = self._run_answer(line.text, painter)
                except KeyboardInterrupt:
                    self._finish_output(self.session.last_summary)
                    ui.print_warning("interrupted")
                    return EXIT_INTERRUPTED
                except MlxSwitchError as exc:
                    failure = exc
                else:
                    self._finish_output(summary)
                    self._gap_pending = not self.json_output  # one blank line before the next answer
                    self._print_notices()
                    if summary is not None:
                        ui.print_status(status, summary, painter.colours if painter else None)
                    continue
            ui.print_error(str(failure))
            first_failure = first_failure or failure.exit_code
            if self.json_output:
                self._write(
                    json.dumps(
                        {
                            "prompt": line.text,
                            "line": line.number,
                            "error": str(failure),
                            "exit_code": failure.exit_code,
                        },
                        ensure_ascii=False,
                    )
                    + "\n"
                )
        return first_failure

    def _finish_output(self, summary: AnswerSummary | None) -> None:
        if summary is None:
            return
        if self.json_output:
            self._write(
                json.dumps(answer_record(summary, self.session), ensure_ascii=False, allow_nan=False) + "\n"
            )
        else:
            self._write("\n")

    def _write(self, text: str) -> None:
        if self._gap_pending:  # the blank line between answers, only once the next one shows up
            self._gap_pending = False
            sys.stdout.write("\n")
        sys.stdout.write(text)
        sys.stdout.flush()  # a reader downstream sees each answer as soon as it is complete

    # -- interactive ------------------------------------------------------------------------

    def interactive(self) -> int:
        """A multi-turn chat on a terminal, until /quit or Ctrl-D."""
        console = ui.make_console(color=self.color)
        painter = ui.TokenPainter(console, self.session.tier_names, self.shade, self._max_entropy())
        self._interactive = True
        ui.print_banner(console, self.session.ladder.description, painter.legend(), self.session.ladder.note)
        ui.print_dim(console, route_line(self.session))
        history = user_dir() / "history"
        problem = history_problem(history)
        if problem:  # said once, here; the chat goes on without it
            ui.print_warning(problem)
        with ui.line_editing(history):
            while True:
                try:
                    line = console.input("[bold]› [/bold]")
                except EOFError:
                    console.print()
                    return 0
                except KeyboardInterrupt:
                    console.print()
                    continue
                except UnicodeDecodeError as exc:
                    ui.print_error(
                        f"the line is not UTF-8 text (byte 0x{exc.object[exc.start]:02x}); type it again"
                    )
                    continue
                problem = typed_line_problem(line)
                if problem:
                    ui.print_error(problem)
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
                self._print_notices()
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
                ui.print_dim(
                    console,
                    f"up {[json_float(v) for v in config.up]} down {[json_float(v) for v in config.downs()]}",
                )
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

    def _run_answer(self, prompt: str, painter: ui.TokenPainter | None) -> AnswerSummary | None:
        """Stream one answer to stdout (painted, plain, or silent for JSON); return its summary.

        None when the prompt was refused before any token.
        """
        cloud = self.session.cloud
        # Piped, a hand-off holds the local answer back: stdout gets only the answer shown.
        hold = cloud is not None and not cloud.spans_on and not self._interactive
        self.session.on_cloud_text = self._cloud_text_shower(painter, hold)
        # Prepared first: a refused prompt raises here, before any output. A hand-off, if any,
        # runs before the summary comes.
        stream = self.session.stream_prepared(self.session.prepare(prompt))
        summary: AnswerSummary | None = None
        written = 0  # events whose telemetry line is out
        try:
            for item in stream:
                if isinstance(item, AnswerSummary):
                    summary = item
                    break
                self._write_telemetry(item)
                written += 1
                if not self.json_output and item.text and not hold:
                    if painter is not None:
                        self._write("")
                        painter.paint(item.text, item.tier, item.entropy, item.source)
                    else:
                        self._write(item.text)
            if summary is not None and hold and not self.json_output:
                self._show_held(summary, painter)
        finally:
            stream.close()  # on Ctrl-C this keeps the partial answer in the history
            summary = summary or self.session.last_summary
            if summary is not None:  # None: the prompt was refused before any token
                for event in summary.tokens[written:]:
                    self._write_telemetry(event)
                self.telemetry.write(
                    {
                        "answer": self.answer_index,
                        "summary": {
                            "prompt": summary.prompt,
                            "finish_reason": summary.finish_reason,
                            "stats": summary.stats(),
                            "router": router_record(self.session, summary),
                            "decoding": self.session.decoding.settings(),
                            **({"handoff": summary.handoff} if summary.handoff is not None else {}),
                        },
                    }
                )
                self.summaries.append(summary)
                self.answer_index += 1
        return summary

    def _cloud_text_shower(self, painter: ui.TokenPainter | None, hold: bool) -> Callable[[str], None] | None:
        """Where a hand-off's cloud answer goes as it arrives: after the local answer on screen,
        marked with the model's name; nowhere when the answer is held (piped) or JSON."""
        cloud = self.session.cloud
        if cloud is None or cloud.spans_on or hold or self.json_output:
            return None
        started: list[bool] = []

        def on_text(piece: str) -> None:
            if not started:  # the local answer is on screen: the cloud's follows, marked
                started.append(True)
                self._write(f"\n\n[{cloud.settings.model}]\n")
            if painter is not None:
                painter.paint(piece, "cloud", None)
            else:
                self._write(piece)

        return on_text

    def _show_held(self, summary: AnswerSummary, painter: ui.TokenPainter | None) -> None:
        """A held (piped) answer, once the hand-off chose it: the cloud's, or the local tokens."""
        if shown_by_cloud(summary):
            pieces = [(shown_text(summary), "cloud")]
        else:
            pieces = [(e.text, e.tier) for e in summary.tokens]
        for text, tier in pieces:
            if painter is not None:
                self._write("")
                painter.paint(text, tier, None)
            else:
                self._write(text)

    def _print_notices(self) -> None:
        if self.session.cloud is not None:
            for line in self.session.cloud.take_notices():
                ui.print_warning(line)

    def _write_telemetry(self, event: TokenEvent) -> None:
        self.telemetry.write({"answer": self.answer_index, "index": event.index, **event.record()})

    def _max_entropy(self) -> float:
        return max_entropy_bits(max(self.session.ladder.vocab_size, 2))
