"""models.toml: bundled profiles, user overrides, and errors that name file, line and key."""

from __future__ import annotations

import pytest

from mlxswitch.errors import CloudError, ConfigError
from mlxswitch.profiles import load_profiles, user_models_toml


def test_bundled_profiles_are_valid_and_default_is_geared_embedded():
    profiles = load_profiles()
    default = profiles.get(None)
    assert default.name == "embedded" and default.mode == "gears"
    assert default.tier_names() == ("g4", "g8")
    for profile in profiles:
        assert len(profile.up) == len(profile.tier_names()) - 1
        if profile.mode == "pair":
            assert profile.models[0].startswith("mlx-community/")


def test_user_file_in_home_overrides_and_adds(isolated_home):
    (isolated_home / "models.toml").write_text(
        'default = "mine"\n[defaults]\nmin_run = 7\n'
        '[profiles.mine]\nmode = "pair"\nsmall = "a/b"\nlarge = "a/c"\nup = [0.4]\n'
        '[profiles.embedded]\nmode = "single"\nmodel = "embedded"\n')
    profiles = load_profiles()
    assert profiles.default == "mine"
    mine = profiles.get("mine")
    assert mine.models == ("a/b", "a/c") and mine.min_run == 7 and mine.down is None
    assert profiles.get("embedded").mode == "single"  # replaced by name
    assert "qwen2.5-0.5b-7b" in profiles.profiles  # bundled ones stay
    assert user_models_toml() == isolated_home / "models.toml"


def test_environment_variable_names_the_user_file(tmp_path, monkeypatch):
    path = tmp_path / "elsewhere.toml"
    path.write_text('[profiles.x]\nmode = "single"\nmodel = "embedded"\n')
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    assert load_profiles().get("x").models == ("embedded",)
    monkeypatch.setenv("MLXSWITCH_MODELS", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="missing.toml: no such file"):
        load_profiles()


@pytest.mark.parametrize("body,line,what", [
    ('[profiles.p]\nmode = "pear"\nmodel = "x"\n', 2, "mode must be one of"),
    ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0, 2.0]\n', 5,
     "2 tiers (small, large) need 1 'up' threshold(s), got 2"),
    ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0]\ndown = [2.0]\n', 6,
     "must be ≤ its 'up' threshold"),
    ('[profiles.p]\nmode = "single"\nmodel = "x"\nwindw = 3\n', 4, "unknown key 'windw'"),
    ('[profiles.p]\nmode = "pair"\nsmall = "a"\n', 1, "needs both 'small' and 'large'"),
    ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = ["x"]\n', 5, "must be numbers"),
    ('[profiles.p]\nmode = "gears"\nmodel = "x"\ngears = [8, 4]\nup = [1.0]\n', 4, "increasing"),
])
def test_semantic_errors_name_file_line_and_profile(tmp_path, monkeypatch, body, line, what):
    path = tmp_path / "models.toml"
    path.write_text(body)
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    with pytest.raises(ConfigError) as error:
        load_profiles()
    message = str(error.value)
    assert message.startswith(f"{path}:{line}: profile 'p': ")
    assert what in message


def test_syntax_error_names_line_and_column(tmp_path, monkeypatch):
    path = tmp_path / "models.toml"
    path.write_text('[profiles.p]\nmode = "single"\nmodel = "x\n')
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    with pytest.raises(ConfigError, match=rf"^{path}:3:\d+: "):
        load_profiles()


def test_cascade_profiles_parse_but_cannot_run_yet(tmp_path, monkeypatch):
    from mlxswitch.api import build_ladder

    path = tmp_path / "models.toml"
    path.write_text('[profiles.c]\nmode = "cascade"\nsmall = "a/b"\nlarge = "a/c"\nup = [0.5, 2.0]\n'
                    '[profiles.c.cloud]\nmodel = "claude-haiku-4-5"\nbudget_usd = 0.1\n')
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    profile = load_profiles().get("c")
    assert profile.tier_names() == ("small", "large", "cloud") and profile.cloud.budget_usd == 0.1
    with pytest.raises(CloudError, match="cloud tier, which this version cannot run yet"):
        build_ladder(profile)
