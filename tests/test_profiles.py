"""models.toml: bundled profiles, user overrides, and errors that name file, line and key."""

from __future__ import annotations

import math
import re

import pytest

from mlxswitch.cloud import CloudSettings
from mlxswitch.errors import ConfigError
from mlxswitch.profile_load import load_profiles, user_models_toml
from mlxswitch.resources import bundled_models_toml
from mlxswitch.toml_text import table_header


def use_file(tmp_path, monkeypatch, text: str, name: str = "models.toml"):
    """Write `text` as the user's models.toml (named by MLXSWITCH_MODELS) and return its path."""
    path = tmp_path / name
    path.write_text(text)
    monkeypatch.setenv("MLXSWITCH_MODELS", str(path))
    return path


# -- the bundled file ---------------------------------------------------------------------------


def test_bundled_profiles_are_valid_and_default_is_the_plain_embedded_model():
    profiles = load_profiles()
    # The plain model answers as well as the gears' top tier, faster (issue 20): it is the default.
    plain = profiles.get(None)
    assert plain.name == "embedded-plain" and plain.mode == "single"
    assert plain.models == ("embedded:smollm2-135m",)
    default = profiles.get("embedded")
    assert default.mode == "gears"
    assert default.models == ("embedded:smollm2-135m",) and default.tier_names() == ("g4", "g8")
    # Re-chosen by calibrate on the held-out split (models.toml says so, and that plain is better).
    assert (default.router.policy, default.router.signal, default.router.window, default.router.min_run) == (
        "peek",
        "margin",
        1,
        1,
    )
    assert "embedded-plain is faster and as accurate" in default.description
    assert profiles.files == [bundled_models_toml()]
    for profile in profiles:
        assert profile.origin == str(bundled_models_toml())
        assert len(profile.router.up) == len(profile.tier_names()) - 1
        assert profile.router.down is None or all(
            d <= u for d, u in zip(profile.router.down, profile.router.up, strict=True)
        )
        # The default was calibrated (issue 11), the coder pair routes on the same position (peek);
        # the others keep EAD's timing.
        if profile.name not in ("embedded", "qwen2.5-coder-0.5b-1.5b"):
            assert (profile.router.window, profile.router.min_run, profile.router.normalize) == (5, 10, False)
        assert profile.description
        if profile.mode == "pair":
            assert profile.tier_names() == ("small", "large")
            assert all(
                re.fullmatch(r"mlx-community/.+-4bit|package:qwen2.5-coder-.+", m) for m in profile.models
            )
    names = [p.name for p in profiles]
    assert names[:2] == ["embedded", "embedded-plain"]  # file order
    assert {"qwen2.5-0.5b-7b", "llama3.2-1b-3b", "qwen3-0.6b-8b", "qwen2.5-7b-gears"} <= set(names)
    assert profiles.get("embedded-plain").tier_names() == ("model",)
    assert profiles.get("qwen2.5-7b-gears").tier_names() == ("g4", "g8", "g16")


def test_bundled_cascade_example_parses_once_uncommented(tmp_path, monkeypatch):
    text = bundled_models_toml().read_text()
    block = text.split("# BEGIN cascade example\n")[1].split("# END cascade example")[0]
    use_file(tmp_path, monkeypatch, re.sub(r"^# ?", "", block, flags=re.M))
    profile = load_profiles().get("qwen2.5-0.5b-7b-cloud")
    assert profile.mode == "cascade" and profile.tier_names() == ("small", "large", "cloud")
    assert profile.router.up == (0.6, 2.5) and profile.router.down == (0.36, 1.5)
    assert profile.cloud == CloudSettings(
        mode="span",
        model="claude-haiku-4-5",
        span_tokens=48,
        budget_usd=0.05,
        budget_calls=20,
        timeout_s=20.0,
    )


def test_bundled_cascade_profile_parses_and_runs_locally_with_cloud_off():
    from mlxswitch.api import resolve_profile

    profile = load_profiles().get("qwen2.5-0.5b-7b-cloud")  # uncommented in the bundled file
    assert profile.mode == "cascade" and profile.tier_names() == ("small", "large", "cloud")
    assert profile.cloud.model == "claude-haiku-4-5" and profile.cloud.mode == "span"
    local = resolve_profile("qwen2.5-0.5b-7b-cloud", cloud="off")
    assert local.cloud is None and local.tier_names() == ("small", "large")
    assert local.router.up == (0.6,) and local.router.down == (0.36,)
    answer = resolve_profile(
        "qwen2.5-0.5b-7b-cloud", cloud="answer", cloud_options={"handoff_threshold": 1.0}
    )
    assert answer.tier_names() == ("small", "large") and answer.cloud.handoff_threshold == 1.0


def test_cascade_profiles_parse_into_cloud_settings(tmp_path, monkeypatch):
    use_file(
        tmp_path,
        monkeypatch,
        '[profiles.c]\nmode = "cascade"\nmodel = "embedded"\ngears = [4, 8]\nup = [2.0, "inf"]\n'
        "[profiles.c.cloud]\nbudget_usd = 0.1\n",
    )
    profile = load_profiles().get("c")
    assert profile.tier_names() == ("g4", "g8", "cloud") and profile.router.up == (2.0, math.inf)
    assert profile.cloud == CloudSettings(budget_usd=0.1)


# -- the user's file ----------------------------------------------------------------------------


def test_user_file_in_home_overrides_and_adds(isolated_home):
    (isolated_home / "models.toml").write_text(
        'default = "mine"\n[defaults]\nmin_run = 7\n'
        '[profiles.mine]\nmode = "pair"\nsmall = "a/b"\nlarge = "a/c"\nup = [0.4]\nwindow = 3\n'
        '[profiles.embedded]\nmode = "single"\nmodel = "embedded"\n'
    )
    profiles = load_profiles()
    assert user_models_toml() == isolated_home / "models.toml"
    assert profiles.default == "mine" and load_profiles().get(None).name == "mine"
    mine = profiles.get("mine")
    assert mine.models == ("a/b", "a/c") and mine.router.down is None
    assert (mine.router.window, mine.router.min_run) == (3, 7) and mine.origin == str(
        isolated_home / "models.toml"
    )
    assert profiles.get("embedded").mode == "single"  # replaced by name
    assert profiles.get("qwen2.5-0.5b-7b").router.min_run == 7  # user [defaults] reach bundled profiles
    names = [p.name for p in profiles]
    assert names[0] == "embedded" and names[-1] == "mine"  # replaced in place, added at the end


def test_environment_variable_names_the_user_file(tmp_path, monkeypatch, isolated_home):
    (isolated_home / "models.toml").write_text('[profiles.home]\nmode = "single"\nmodel = "embedded"\n')
    path = use_file(
        tmp_path, monkeypatch, '[profiles.x]\nmode = "single"\nmodel = "embedded"\n', "elsewhere.toml"
    )
    profiles = load_profiles()
    assert user_models_toml() == path and "x" in profiles and "home" not in profiles
    assert profiles.get("x").models == ("embedded",)
    monkeypatch.setenv("MLXSWITCH_MODELS", str(tmp_path / "missing.toml"))
    with pytest.raises(ConfigError, match="missing.toml: no such file"):
        load_profiles()


def test_without_overrides_the_user_file_is_in_config(monkeypatch, tmp_path):
    monkeypatch.delenv("MLXSWITCH_HOME")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert user_models_toml() == tmp_path / ".config" / "mlxswitch" / "models.toml"
    assert load_profiles().default == "embedded-plain"  # an absent user file is fine


def test_paths_expand_home_and_resolve_against_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    path = use_file(
        tmp_path,
        monkeypatch,
        '[profiles.p]\nmode = "pair"\nsmall = "~/m/small"\nlarge = "./m/large.gguf"\nup = 1\n',
    )
    profile = load_profiles().get("p")
    assert profile.models == (str(tmp_path / "home" / "m" / "small"), str(tmp_path / "m" / "large.gguf"))
    assert profile.router.up == (1.0,) and path.exists()


def test_unknown_profile_lists_the_known_ones():
    with pytest.raises(ConfigError) as error:
        load_profiles().get("nope")
    message = str(error.value)
    assert message.startswith("unknown profile 'nope' (known: embedded, embedded-plain, ")
    assert "qwen2.5-0.5b-7b" in message and "llama3.2-1b-3b" in message


# -- errors with file and line ------------------------------------------------------------------


@pytest.mark.parametrize(
    "body,line,column",
    [
        ('[profiles.p]\nmode = "single"\nmodel = "x\n', 3, 11),
        ('[profiles.p]\nmode = "single"\n\nmodel = \n', 4, 9),
        ('[profiles.p]\nmode = "single"\nmode = "pair"\n', 3, 14),
        ("[profiles.p]\nup = [1,\n", 2, 9),  # cut short: the end of the document
    ],
)
def test_syntax_error_names_file_line_and_column(tmp_path, monkeypatch, body, line, column):
    path = use_file(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigError) as error:
        load_profiles()
    message = str(error.value)
    assert message.startswith(f"{path}:{line}:{column}: ") and "(at " not in message
    assert "\n" not in message


@pytest.mark.parametrize(
    "body,line,what",
    [
        ('[profiles.p]\nmode = "pear"\nmodel = "x"\n', 2, "mode must be one of pair, gears, single, cascade"),
        ('[profiles.p]\nmodel = "x"\n', 1, "mode must be one of"),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0, 2.0]\n',
            5,
            "2 tiers need 1 up threshold(s), got 2",
        ),
        ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\n', 1, "need 1 up threshold(s), got 0"),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0]\ndown = [2.0]\n',
            6,
            "down threshold 2 exceeds up threshold 1",
        ),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0]\ndown = [0.5, 0.2]\n',
            6,
            "2 tiers need 1 down threshold(s), got 2",
        ),
        ('[profiles.p]\nmode = "single"\nmodel = "x"\nwindw = 3\n', 4, "unknown key 'windw'"),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\n',
            1,
            "needs both 'small' and 'large' ('large' is missing)",
        ),
        ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = ["x"]\n', 5, "must be numbers"),
        ('[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [nan]\n', 5, "must be numbers"),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = 3\nup = [1.0]\n',
            4,
            "'large' must be a model source",
        ),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nmodel = "c"\nup = [1.0]\n',
            5,
            "'model' does not belong in a pair profile",
        ),
        ('[profiles.p]\nmode = "single"\nmodel = "a"\ngears = [4, 8]\n', 4, "'gears' does not belong"),
        ('[profiles.p]\nmode = "gears"\nmodel = "x"\n', 1, "needs both 'model' and 'gears'"),
        ('[profiles.p]\nmode = "gears"\nmodel = "x"\ngears = [8, 4]\nup = [1.0]\n', 4, "increasing"),
        ('[profiles.p]\nmode = "gears"\nmodel = "x"\ngears = [4, 11]\nup = [1.0]\n', 4, "planes of 4,7 bits"),
        (
            '[profiles.p]\nmode = "single"\nmodel = "x"\nwindow = 0\n',
            4,
            "the window must be at least 1 token (got 0)",
        ),
        ('[profiles.p]\nmode = "single"\nmodel = "x"\nnormalize = "yes"\n', 4, "true or false"),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nnormalize = true\nup = [0.6]\n'
            "down = [-1.0]\n",
            7,
            "fractions of log2(V), between 0 and 1",
        ),
        (
            '[profiles.p]\nmode = "cascade"\nsmall = "a"\nlarge = "b"\nup = [1.0, 2.0]\n',
            1,
            "a cascade profile needs a [profiles.NAME.cloud] table",
        ),
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\nup = [1.0]\n[profiles.p.cloud]\n'
            'model = "m"\n',
            6,
            "only a cascade profile has a cloud tier",
        ),
        (
            '[profiles.p]\nmode = "cascade"\nmodel = "a"\nup = [1.0]\n[profiles.p.cloud]\nmodel = "m"\n'
            "budget = 1\n",
            7,
            "unknown cloud setting 'budget'",
        ),
        (
            '[profiles.p]\nmode = "cascade"\nmodel = "a"\nup = [1.0]\n[profiles.p.cloud]\nmodel = "m"\n'
            "span_tokens = 0\n",
            7,
            "cloud span tokens must be a whole number from 1 to 1024, got 0",
        ),
        (
            '[profiles.p]\nmode = "cascade"\nmodel = "a"\nup = [1.0]\ncloud = { timeout_s = -1 }\n',
            5,
            "cloud timeout must be a number of seconds above 0",
        ),
        (
            '[profiles.p]\nmode = "cascade"\nmodel = "a"\nup = [1.0]\n[profiles.p.cloud]\nmodel = "gpt-x"\n',
            6,
            "no price known for cloud model 'gpt-x'",
        ),
        # The key is looked for in p's own table only, not in the profile after it.
        (
            '[profiles.p]\nmode = "pair"\nsmall = "a"\nlarge = "b"\n\n[profiles.q]\nmode = "single"\n'
            'model = "c"\nup = []\n',
            1,
            "need 1 up threshold(s), got 0",
        ),
    ],
)
def test_semantic_errors_name_file_line_and_profile(tmp_path, monkeypatch, body, line, what):
    path = use_file(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigError) as error:
        load_profiles()
    message = str(error.value)
    assert message.startswith(f"{path}:{line}: profile 'p': ")
    assert what in message and "\n" not in message


@pytest.mark.parametrize(
    "body,line,what",
    [
        ('colour = "red"\n', 1, "unknown top-level key 'colour'"),
        ("default = 3\n", 1, "'default' must be a profile name"),
        ('\ndefault = "ghost"\n', 2, "default profile 'ghost' is not defined (known: embedded, "),
        ("[defaults]\nwindow = 5\nmin_runs = 3\n", 3, "unknown key 'min_runs' in [defaults]"),
        ("[defaults]\nmin_run = -2\n", 2, "[defaults]: the min run must be at least 1 token (got -2)"),
        ("[profiles]\np = 3\n", 2, "profile 'p' must be a table"),
    ],
)
def test_file_level_errors_name_file_and_line(tmp_path, monkeypatch, body, line, what):
    path = use_file(tmp_path, monkeypatch, body)
    with pytest.raises(ConfigError) as error:
        load_profiles()
    assert str(error.value).startswith(f"{path}:{line}: ")
    assert what in str(error.value)


def test_normalize_from_defaults_is_named_when_bundled_thresholds_are_in_bits(tmp_path, monkeypatch):
    use_file(tmp_path, monkeypatch, "[defaults]\nnormalize = true\n")
    with pytest.raises(ConfigError, match=r"normalize = true comes from \[defaults\]"):
        load_profiles()


@pytest.mark.parametrize(
    ("line", "path"),
    [
        ('[profiles."qwen2.5-coder"]', ("profiles", "qwen2.5-coder")),
        ("[profiles.qwen2.5]  # nested: three tables deep", ("profiles", "qwen2", "5")),
        ("  [ profiles . 'a b' . cloud ]", ("profiles", "a b", "cloud")),
        ("[[profiles.list]]", ("profiles", "list")),
        ("up = [0.6]", None),
        ("# [profiles.commented]", None),
    ],
)
def test_a_table_header_reads_as_its_path_with_quoted_dots_kept(line, path):
    """One reading of a header for locating keys and for replacing a written profile's table."""
    assert table_header(line) == path
