"""The README's pictures (bench/render_session.py) against the code: each was rendered from the
current default profile's settings, at a commit no later than the last change to what it shows,
and the README's caption names its command and commit."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlxswitch.api import resolve_profile
from mlxswitch.json_numbers import json_float
from mlxswitch.profiles import load_profiles

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
    assert record["router"] == resolve_profile(preferred, **record["overrides"]).router.settings(json_float)
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
