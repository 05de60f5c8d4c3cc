"""The README's pictures (bench/render_session.py) against the code: each was rendered from the
current default profile's settings, at a commit no later than the last change to what it shows,
and the README's caption names its command and commit, and quotes the 0.5B's share in each
recorded run (under verified drafting it varies with the passes the planner times)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from mlxswitch.api import resolve_profile
from mlxswitch.json_numbers import json_float
from mlxswitch.profile_load import load_profiles

ROOT = Path(__file__).resolve().parent.parent
RECORDS = sorted((ROOT / "docs").glob("session*.json"))
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)


def test_there_are_pictures():
    assert {r.stem for r in RECORDS} == {"session", "session-peek"}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_picture_shows_the_default_profile_as_the_code_resolves_it(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    preferred = load_profiles().preferred
    assert record["profile"] == preferred
    resolved = resolve_profile(preferred, **record["overrides"])
    assert record["router"] == resolved.router.settings(json_float)
    assert record["decoding"] == resolved.decoding.settings()
    assert path.with_suffix(".svg").exists()
    assert f"]({path.with_suffix('.svg').relative_to(ROOT)})" in README
    # The caption gives the command as run (less --color) and the commit it ran at.
    assert record["command"].removesuffix(" --color") in README
    assert record["commit"][:7] in README
    max_tokens = record["command"].split("--max-tokens ")[1].split()[0]
    assert record["status_line"].startswith(f"{max_tokens} tokens")


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_a_picture_is_newer_than_every_change_to_what_it_shows(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    last = _git("log", "-1", "--format=%H", "--", *record["watched"])
    if last.returncode != 0 or not last.stdout.strip():
        pytest.skip("no git history here (an sdist or an unpacked tree): nothing to compare with")
    if _git("cat-file", "-e", f"{record['commit']}^{{commit}}").returncode != 0:
        pytest.skip("the picture's commit is not in this (shallow) history")
    newer = _git("merge-base", "--is-ancestor", last.stdout.strip(), record["commit"])
    assert newer.returncode == 0, (
        f"{path.name} was rendered at {record['commit'][:10]}, before {last.stdout.strip()[:10]} changed "
        f"{', '.join(record['watched'])}: re-render with bench/render_session.py"
    )


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_the_caption_quotes_the_small_share_of_every_recorded_run(path):
    record = json.loads(path.read_text(encoding="utf-8"))
    assert record["runs"][0] == record["status_line"]  # the picture is the first run
    shares = [re.search(r"\bsmall (\d+)%", line) for line in record["runs"]]
    assert all(shares), record["runs"]
    quoted = ", ".join(f"{share.group(1)}%" for share in shares if share)
    assert f"{quoted} in {len(shares)} fresh runs" in README, quoted
    again = re.search(r"\bsmall (\d+)%", record["again"])
    assert again and f"{again.group(1)}% once its pass costs are saved" in README, record["again"]
