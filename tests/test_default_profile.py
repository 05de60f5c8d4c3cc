"""`mlxswitch chat` with no options: the Qwen2.5-Coder pair where its models are on this machine,
else the embedded model and one `note:` line saying how to get the pair.

Offline and small: the availability check is monkeypatched both ways, and the ladder a chat
builds is swapped for tiny models (the profile it was asked for is recorded), so the real pair
never loads.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
from typer.testing import CliRunner

from mlxswitch import api
from mlxswitch import profiles as profiles_module
from mlxswitch.cli import app
from mlxswitch.errors import ConfigError
from mlxswitch.profile_load import load_profiles

# The real check, taken before conftest's autouse fixture replaces it for every test.
real_profile_available = profiles_module.profile_available

PAIR = "qwen2.5-coder-0.5b-1.5b"
NOTE = (
    f"note: the {PAIR} pair is not installed, so embedded-plain answers; "
    "for two tiers at work: uv run --extra qwen-coder mlxswitch chat"
)


@pytest.fixture
def built(monkeypatch, tiny_pair):
    """Chats load tiny models in place of the profile's; the names of the profiles asked for."""
    small, large = (str(path) for path in tiny_pair)
    asked: list[str] = []
    build = api.build_ladder

    def tiny_ladder(profile, **kwargs):
        asked.append(profile.name)
        models = (small, large) if len(profile.models) == 2 else (large,)
        return build(dataclasses.replace(profile, models=models), **kwargs)

    monkeypatch.setattr(api, "build_ladder", tiny_ladder)
    return asked


def chat(*args):
    return CliRunner().invoke(app, ["chat", "-p", "hello", "--max-tokens", "3", *args])


def test_with_the_pair_here_the_default_is_the_pair_and_says_nothing(monkeypatch, built):
    monkeypatch.setattr(profiles_module, "profile_available", lambda profile: profile.name == PAIR)
    profiles = load_profiles()
    assert (profiles.default, profiles.default_note) == (PAIR, "")
    assert profiles.get(None).mode == "pair" and profiles.get(None).decoding.verify
    result = chat()
    assert result.exit_code == 0, result.output
    assert built == [PAIR]
    assert "note:" not in result.stderr and result.stdout.strip()


def test_without_the_pair_the_embedded_model_answers_and_one_line_says_how_to_get_it(built):
    profiles = load_profiles()  # conftest: the pair counts as absent
    assert (profiles.default, profiles.default_note) == ("embedded-plain", NOTE.removeprefix("note: "))
    result = chat()
    assert result.exit_code == 0, result.output
    assert built == ["embedded-plain"]
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == [NOTE] and result.stderr.startswith(NOTE + "\n")  # one line, before the answer
    assert result.stdout.strip()


@pytest.mark.parametrize("args", [["--profile", "embedded-plain"], ["--profile", "embedded"]])
def test_a_profile_asked_for_by_name_gets_no_note(built, args):
    result = chat(*args)
    assert result.exit_code == 0, result.output
    assert built == [args[1]] and "note:" not in result.stderr


def test_an_ad_hoc_model_gets_no_note(tiny_pair):
    result = chat("--model", str(tiny_pair[1]))
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


def test_empty_stdin_still_prints_nothing(built):
    result = CliRunner().invoke(app, ["chat"], input="\n \n")
    assert (result.exit_code, result.stdout, result.stderr, built) == (0, "", "", [])


def test_the_pair_is_available_when_its_parts_or_their_conversion_are_here(monkeypatch):
    """The real check: every model of the profile on this machine (installed parts or their cached
    conversion: model_available_offline), monkeypatched both ways."""
    pair, plain = load_profiles().get(PAIR), load_profiles().get("embedded-plain")
    monkeypatch.setattr(profiles_module, "model_available_offline", lambda source: True)
    assert real_profile_available(pair)
    monkeypatch.setattr(profiles_module, "model_available_offline", lambda source: "0.5b" in source)
    assert not real_profile_available(pair)  # one model of two is not enough
    monkeypatch.undo()
    assert real_profile_available(plain)  # the embedded model ships with mlxswitch


def test_a_user_list_default_falls_back_in_order_and_names_the_first(isolated_home, monkeypatch):
    (isolated_home / "models.toml").write_text(
        'default = ["mine", "embedded"]\n'
        '[profiles.mine]\nmode = "pair"\nsmall = "org/small-model"\nlarge = "org/large-model"\nup = [1.0]\n'
    )
    monkeypatch.setattr(profiles_module, "profile_available", lambda profile: profile.name == "embedded")
    profiles = load_profiles()
    assert profiles.default == "embedded"
    assert profiles.default_note == (
        "the mine pair is not installed, so embedded answers; for two tiers at work: "
        "mlxswitch chat --profile mine (downloaded from Hugging Face on first use)"
    )
    monkeypatch.setattr(profiles_module, "profile_available", lambda profile: True)
    assert (load_profiles().default, load_profiles().default_note) == ("mine", "")
    (isolated_home / "models.toml").write_text('default = "embedded"\n')  # one name: no fallback
    assert (load_profiles().default, load_profiles().default_note) == ("embedded", "")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('default = ["embedded", "ghost"]', "default profile 'ghost' is not defined"),
        ("default = []", "'default' must be a profile name (a string), or a list of them"),
        ('default = ["embedded", 3]', "'default' must be a profile name (a string), or a list of them"),
    ],
)
def test_a_bad_default_list_is_refused_with_its_line(isolated_home, line, message):
    (isolated_home / "models.toml").write_text(line + "\n")
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_profiles()
