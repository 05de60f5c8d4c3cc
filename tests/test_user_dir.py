"""The user directory: $MLXSWITCH_HOME, else the platform's convention, else the old ~/.config place."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mlxswitch.resources import user_dir


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.delenv("MLXSWITCH_HOME")
    for name in ("XDG_CONFIG_HOME", "APPDATA", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(Path, "home", classmethod(lambda cls: tmp_path))
    return tmp_path


def test_mlxswitch_home_wins(isolated_home):
    assert user_dir() == isolated_home


@pytest.mark.parametrize(
    "platform, env, expected",
    [
        ("darwin", {}, "Library/Application Support/mlxswitch"),
        ("linux", {}, ".config/mlxswitch"),
        ("linux", {"XDG_CONFIG_HOME": "xdg"}, "xdg/mlxswitch"),
        ("win32", {"APPDATA": "roaming"}, "roaming/mlxswitch"),
    ],
)
def test_the_platform_convention(home, monkeypatch, platform, env, expected):
    monkeypatch.setattr(sys, "platform", platform)
    for name, value in env.items():
        monkeypatch.setenv(name, str(home / value))
    assert user_dir() == home / expected


def test_the_old_location_is_read_while_the_new_one_does_not_exist(home, monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    old = home / ".config" / "mlxswitch"
    old.mkdir(parents=True)
    assert user_dir() == old
    new = home / "Library" / "Application Support" / "mlxswitch"
    new.mkdir(parents=True)
    assert user_dir() == new
