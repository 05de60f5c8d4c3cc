"""The terminal UI: tier colours, the legend, status lines, stats, progress, line editing, errors.
All Rich code; the result tables are in ui_tables.py and ui_humaneval.py."""

from __future__ import annotations

import contextlib
import itertools
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

# Cheap tiers in cool/green tones, strong ones warm, the cloud its own blue.
_LADDER_COLOURS = ["green", "yellow", "magenta", "red"]
CLOUD_COLOUR = "bright_blue"


def tier_colours(tier_names: Iterable[str]) -> dict[str, str]:
    """A distinct colour per tier, bottom to top; the cloud tier is always blue."""
    names = list(tier_names)
    local = [n for n in names if n != "cloud"]
    palette = _LADDER_COLOURS if len(local) > 1 else ["default"]
    colours = {name: palette[min(i, len(palette) - 1)] for i, name in enumerate(local)}
    if len(local) == 2:  # two tiers: the two most distinct colours
        colours = {local[0]: "green", local[1]: "magenta"}
    if "cloud" in names:
        colours["cloud"] = CLOUD_COLOUR
    return colours


def make_console(stderr: bool = False, color: bool | None = None) -> Console:
    """A console on stdout or stderr; color=None lets Rich detect a terminal."""
    stream = sys.stderr if stderr else sys.stdout
    # Off a terminal Rich assumes 80 columns and folds tables; a file or pipe has no width.
    width = None if stream.isatty() else 200
    if color is False:
        return Console(stderr=stderr, no_color=True, highlight=False, color_system=None, width=width)
    return Console(stderr=stderr, highlight=False, force_terminal=True if color else None, width=width)


def print_error(message: str) -> None:
    """One line on stderr, prefixed so it stands out from answers."""
    console = make_console(stderr=True)
    console.print(Text("error: ", style="bold red") + Text(message), soft_wrap=True)


def print_banner(console: Console, title: str, legend: Text, note: str = "") -> None:
    """The interactive chat's opening lines: what runs, the tier colours, how to get help."""
    console.print(Text(title, style="bold"))
    if note:
        console.print(Text(note, style="dim"))
    console.print(legend)
    console.print(Text("/help for commands, Ctrl-D to leave", style="dim"))


def print_dim(console: Console, message: str) -> None:
    """A quiet informational line."""
    console.print(Text(message, style="dim"))


def print_warning(message: str) -> None:
    """One line on stderr for something the user should know but that does not stop us."""
    make_console(stderr=True).print(Text("note: ", style="yellow") + Text(message), soft_wrap=True)


class TokenPainter:
    """Prints tokens in the colour of the tier that made them, optionally shaded by entropy."""

    def __init__(
        self, console: Console, tier_names: list[str], shade: bool = False, max_entropy: float = 1.0
    ):
        self.console = console
        self.colours = tier_colours(tier_names)
        self.shade = shade
        self.max_entropy = max(max_entropy, 1e-9)

    def legend(self) -> Text:
        """`tiers: small large` with each name in its colour."""
        text = Text("tiers: ", style="dim")
        for i, (name, colour) in enumerate(self.colours.items()):
            text.append(("  " if i else "") + f"■ {name}", style=colour)
        return text

    def paint(self, piece: str, tier: str, entropy: float | None, source: str | None = None) -> None:
        """Write one token's text without a newline (underlined: drafted from the text itself)."""
        style = self.colours.get(tier, "default") + (" underline" if source == "lookup" else "")
        if self.shade and entropy is not None and entropy == entropy:
            # Uncertain tokens bold, confident ones dim: the router's view at a glance.
            share = entropy / self.max_entropy
            style += " bold" if share > 0.25 else (" dim" if share < 0.05 else "")
        self.console.print(Text(piece, style=style), end="", soft_wrap=True)


def print_status(console: Console, summary, colours: dict[str, str] | None = None) -> None:
    """The one-line summary after an answer, never wrapped."""
    console.print(status_line(summary, colours), soft_wrap=True)


def status_line(summary, colours: dict[str, str] | None = None) -> Text:
    """`42 tokens · 9.1 tok/s · small 80% large 20% · 2 switches · prompt 37 tok at 120 tok/s · …`."""
    text = Text(style="dim")
    if summary.generated == 0:
        # No token, no decode speed: say why the answer is empty instead.
        why = {
            "stop": "the model ended its answer at once (end of sequence)",
            "interrupted": "interrupted before the first token",
        }.get(summary.finish_reason, summary.finish_reason)
        text.append(
            f"0 tokens · {why} · prompt {summary.prefilled_tokens} tok in "
            f"{summary.elapsed_s:.2f} s · peak {summary.peak_memory_gb:.2f} GB"
        )
        return text
    speed = f"{summary.tok_per_s:.1f} tok/s" if summary.tok_per_s is not None else "– tok/s"
    text.append(f"{summary.generated} tokens · {speed} · ")
    _shares(text, summary, colours or {})
    prompt_speed = summary.prompt_tok_per_s
    text.append(
        f" · prompt {summary.prefilled_tokens} tok"
        + (f" at {prompt_speed:.0f} tok/s" if prompt_speed else "")
        + f" · first token {summary.first_token_s:.2f} s · peak {summary.peak_memory_gb:.2f} GB"
    )
    if summary.finish_reason == "interrupted":
        text.append(f" · interrupted after {summary.generated} tokens", style="yellow")
    elif summary.finish_reason == "length":
        text.append(" · stopped at max tokens", style="yellow")
    if getattr(summary, "refed_tokens", 0):
        text.append(
            f" · KV cache rebuilt: {summary.refed_tokens} earlier tokens fed again "
            "(--max-kv-size: a rotating cache past its limit cannot rewind)",
            style="yellow",
        )
    _cloud_status(text, summary, colours)
    return text


def _shares(text: Text, summary, colours: dict[str, str]) -> None:
    """Where the tokens came from. Verified drafting: `proposed by small 0% · lookup 23% · large 77%
    · large checked every token` (each share in its colour, lookup underlined as in the answer).
    Routing: `small 80% large 20% (lookup 5%) · 2 switches`, the tiers that made the tokens."""

    def share(count: int) -> str:
        return f"{100 * count / summary.generated:.0f}%"

    checker = getattr(summary, "checked_by", None)
    if checker is not None:
        text.append("proposed by ")
        counts = summary.proposer_counts
        # The drafter, lookup (0% too: both kinds of draft are always said), then the checker.
        names = [*summary.tier_names[:-1], "lookup", *summary.tier_names[-1:]]
        lookup_style = colours.get(checker, "default") + " underline"
        for i, (name, count) in enumerate((n, counts.get(n, 0)) for n in names):
            style = lookup_style if name == "lookup" else colours.get(name, "")
            text.append(("· " if i else "") + f"{name} {share(count)} ", style=style)
        text.append(f"· {checker} checked every token")
        return
    for name, count in summary.tier_counts.items():
        text.append(f"{name} {share(count)} ", style=colours.get(name, "default"))
    for source, count in summary.source_counts.items():  # lookup drafts, checked by the tier chosen
        text.append(f"({source} {share(count)}) ")
    text.append(f"· {summary.switches} switch{'es' if summary.switches != 1 else ''}")


def _cloud_status(text: Text, summary, colours: dict[str, str] | None) -> None:
    """` · answer: cloud (score 2.41 > 2.00 bits) · cloud $0.0004, 1 call (session $0.0011)`."""
    handoff = getattr(summary, "handoff", None)
    if handoff is not None and handoff.get("score") is not None:
        sign = ">" if handoff["decision"] == "cloud" else "≤"
        why = f"score {handoff['score']:.2f} {sign} {handoff['threshold']:.2f} bits"
        if handoff["decision"] == "cloud" and handoff["shown"] == "local":
            why += ", the cloud failed"
        text.append(
            f" · answer: {handoff['shown']} ({why})",
            style=(colours or {}).get("cloud", CLOUD_COLOUR) if handoff["shown"] == "cloud" else "",
        )
    cloud = getattr(summary, "cloud", None)
    if cloud is not None:
        answer, session = cloud["answer"], cloud["session"]
        calls = answer["calls"]
        text.append(
            f" · cloud ${answer['usd']:.4f}, {calls} call{'s' if calls != 1 else ''} "
            f"(session ${session['usd']:.4f})"
        )


def stats_table(summaries: list) -> Table:
    """Totals of a chat session so far, one row per tier."""
    table = Table(title="session", show_edge=False)
    table.add_column("tier")
    table.add_column("tokens", justify="right")
    table.add_column("share", justify="right")
    totals: dict[str, int] = {}
    for s in summaries:
        for name, count in s.tier_counts.items():
            totals[name] = totals.get(name, 0) + count
    overall = max(sum(totals.values()), 1)
    for name, count in totals.items():
        table.add_row(name, str(count), f"{100 * count / overall:.1f}%")
    answers = len(summaries)
    switches = sum(s.switches for s in summaries)
    table.caption = f"{answers} answer{'s' if answers != 1 else ''}, {switches} switches"
    clouded = [s.cloud for s in summaries if getattr(s, "cloud", None)]
    if clouded:  # the newest record holds the session's running totals
        session = clouded[-1]["session"]
        table.caption += (
            f", cloud ${session['usd']:.4f} over {session['calls']} calls "
            f"({session['input_tokens']} in, {session['output_tokens']} out tokens)"
        )
    return table


def profiles_table(rows: list[dict]) -> Table:
    """The `mlxswitch models` table: name, mode (and how it decodes), models and whether each is on
    this machine."""
    table = Table(show_edge=False)
    for column in ("profile", "mode", "tiers", "models", "offline", "notes"):
        table.add_column(column, overflow="fold")
    for row in rows:
        name = row["name"] + (" (default)" if row.get("default") else "")
        table.add_row(
            name,
            f"{row['mode']}\n{row['decoding']}",
            " → ".join(row["tiers"]),
            "\n".join(row["models"]),
            "\n".join(
                "yes" if ok else f"no: {how}"
                for ok, how in zip(row["offline"], row["how_to_get"], strict=True)
            ),
            row.get("notes", ""),
        )
    return table


def key_value_table(title: str, rows: list[tuple[str, str]]) -> Table:
    """Two columns of facts, for `mlxswitch doctor`."""
    table = Table(title=title, show_header=False, show_edge=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


@contextlib.contextmanager
def loading_status(enabled: bool) -> Iterator:
    """A spinner on stderr while models load; the callback updates its text."""
    if not enabled:
        yield lambda message: None
        return
    console = make_console(stderr=True)
    with console.status("loading…", spinner="dots") as status:
        yield lambda message: status.update(message)


def cloud_waiting(enabled: bool):
    """A factory of spinners shown after the text while a cloud call runs (on a terminal only).

    It draws after the cursor and restores it, so the answer's line is never redrawn, and clears
    itself when the call ends, Ctrl-C included.
    """

    @contextlib.contextmanager
    def waiting(what: str) -> Iterator[None]:
        if not enabled:
            yield
            return
        stop = threading.Event()

        def spin() -> None:
            for frame in itertools.cycle("⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"):
                sys.stderr.write(f"\x1b7\x1b[2m {frame} {what}…\x1b[0m\x1b8")
                sys.stderr.flush()
                if stop.wait(0.1):
                    return

        sys.stdout.flush()
        thread = threading.Thread(target=spin, daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            sys.stderr.write("\x1b[K")  # erase the spinner, from the cursor to the line's end
            sys.stderr.flush()

    return waiting


def stderr_is_terminal() -> bool:
    """Whether a person is watching stderr (spinners make sense)."""
    return sys.stderr.isatty()


@contextlib.contextmanager
def line_editing(history: Path) -> Iterator[None]:
    """Arrow keys and history for input() (and so console.input), history kept in `history`."""
    try:
        import readline
    except ImportError:  # a Python built without readline: plain input still works
        yield
        return
    with contextlib.suppress(OSError):  # first run, or unreadable: start empty
        readline.read_history_file(history)
    readline.set_history_length(1000)
    try:
        yield
    finally:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError:
            pass  # history is a convenience: never fail a chat over it


@contextlib.contextmanager
def bench_progress() -> Iterator:
    """Progress bars on stderr for the bench's stages; the callback takes (stage, done, total)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TaskID,
        TextColumn,
        TimeElapsedColumn,
    )

    console = make_console(stderr=True)
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=not console.is_terminal,
    ) as bars:
        tasks: dict[str, TaskID] = {}

        def update(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bars.add_task(stage, total=total)
            bars.update(tasks[stage], completed=done, total=total)

        yield update
