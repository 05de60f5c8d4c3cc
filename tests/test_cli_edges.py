"""The CLI at its edges: an empty --prompt, bracketed text in tables, flags in --help, an MLX
that cannot load its CUDA backend, a history that cannot be written."""

from __future__ import annotations

import importlib.abc
import io
import os
import re
import sys

import pytest
from cli_helpers import invoke, one_error_line

# -- an empty --prompt is an error, not a cue to chat -------------------------------------------


@pytest.mark.parametrize("prompt", ["", "   "])
def test_an_empty_prompt_is_refused_not_a_chat(pair_args, prompt):
    result = invoke(["chat", *pair_args, "-p", prompt, "--json"], "Say hi\n")
    assert result.exit_code == 2
    assert result.stdout == ""  # no banner, no `›` prompt
    assert one_error_line(result) == (
        "error: --prompt is empty: give it the text to answer (or leave it out to read stdin)"
    )


# -- text with brackets reaches the terminal as written -----------------------------------------


@pytest.fixture
def qwen_parts_missing(monkeypatch):
    """The qwen-coder parts neither installed nor converted (this machine may have them)."""
    monkeypatch.setattr("mlxswitch.models.packaged.part_file", lambda import_name: None)
    monkeypatch.setattr("mlxswitch.models.sources.PackagedGGUFSource.converted", lambda self: None)


def test_models_keeps_the_brackets_of_an_install_hint(isolated_home, qwen_parts_missing):
    (isolated_home / "models.toml").write_text(
        '[profiles.coder]\nmode = "single"\nmodel = "package:qwen2.5-coder-0.5b-instruct"\n'
        'description = "needs [the extra]"\n'
    )
    result = invoke(["models"])
    assert result.exit_code == 0, result.output
    # The cell may fold between words, never inside one.
    assert "(or pip install" in result.stdout and "'mlxswitch[qwen-coder]')" in result.stdout
    assert "needs [the extra]" in result.stdout


def test_doctor_keeps_the_brackets_of_an_install_hint(qwen_parts_missing):
    result = invoke(["doctor"])
    assert result.exit_code == 0, result.output
    line = next(x for x in result.stdout.splitlines() if "package:qwen2.5-coder-0.5b-instruct" in x)
    assert line.rstrip().endswith(
        "not installed: install its parts: uv sync --extra qwen-coder "
        "(or pip install 'mlxswitch[qwen-coder]')"
    )
    assert re.search(r"\[(cpu|mx ops)\]", result.stdout)  # the kernels' backends too


# -- --help: a flag takes no value ----------------------------------------------------------------


def test_root_help_shows_flags_without_a_value():
    result = invoke(["--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    assert re.search(r"│ --version +Print the version and exit\.", result.stdout)
    assert re.search(r"│ --help +Show this message and exit\.", result.stdout)


def test_chat_help_shows_flags_without_a_value_and_options_with_one():
    result = invoke(["chat", "--help"])
    assert result.exit_code == 0
    assert "<bool>" not in result.stdout
    assert re.search(r"│ --json +One JSON object", result.stdout)
    assert re.search(r"│ --color +--no-color +Colour tokens", result.stdout)
    assert re.search(r"│ --help +Show this message", result.stdout)
    assert re.search(r"│ --max-tokens +<int> +Most tokens", result.stdout)


# -- MLX installed with its CUDA backend on a machine without CUDA --------------------------------

_NO_LIBCUDA = "libcuda.so.1: cannot open shared object file: No such file or directory"


class _CudaWheelWithoutDriver(importlib.abc.MetaPathFinder):
    """Imports mlx.core as mlx[cuda] does where no NVIDIA driver is installed."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "mlx.core":
            raise ImportError(_NO_LIBCUDA, path="/venv/lib/mlx/core.cpython-311-x86_64-linux-gnu.so")
        return None


@pytest.fixture
def cuda_wheel_without_driver(monkeypatch):
    monkeypatch.delitem(sys.modules, "mlx.core")
    monkeypatch.setattr(sys, "meta_path", [_CudaWheelWithoutDriver(), *sys.meta_path])


_CUDA_LINE = (
    f"error: MLX's CUDA backend cannot load ({_NO_LIBCUDA}): the cuda extra needs an NVIDIA GPU "
    "and its driver; without them reinstall without that extra: uv sync (not --all-extras; "
    "--extra NAME for the others you want), or pip uninstall mlx-cuda-12 && pip install 'mlx[cpu]'"
)


def test_doctor_without_libcuda_says_how_to_reinstall(cuda_wheel_without_driver):
    result = invoke(["doctor"])
    assert result.exit_code == 1
    assert one_error_line(result) == _CUDA_LINE
    assert "internal error" not in result.stderr


def test_models_without_libcuda_says_how_to_reinstall(monkeypatch):
    def failing():
        raise ImportError(_NO_LIBCUDA, path="/venv/lib/mlx/core.cpython-311-x86_64-linux-gnu.so")

    monkeypatch.setattr("mlxswitch.checks.profile_rows", failing)
    result = invoke(["models"])
    assert result.exit_code == 1
    assert one_error_line(result) == _CUDA_LINE


def test_a_broken_mlx_without_cuda_is_named_too(monkeypatch):
    def failing():
        raise ImportError(
            "libmlx.so: cannot open shared object file: No such file or directory",
            path="/venv/lib/python3.11/site-packages/mlx/core.cpython-311-x86_64-linux-gnu.so",
        )

    monkeypatch.setattr("mlxswitch.checks.profile_rows", failing)
    result = invoke(["models"])
    assert result.exit_code == 1
    assert one_error_line(result).startswith(
        "error: MLX cannot be imported (libmlx.so: cannot open shared object file: No such file or "
        "directory): reinstall it: uv sync --reinstall-package mlx"
    )


def test_an_unrelated_import_error_stays_an_internal_error(monkeypatch):
    def failing():
        raise ImportError("cannot import name 'x' from 'somewhere'")

    monkeypatch.setattr("mlxswitch.checks.profile_rows", failing)
    result = invoke(["models"])
    assert result.exit_code == 70
    assert one_error_line(result).startswith("error: internal error: ImportError: cannot import name")


# -- an unwritable history: said once, the chat goes on -------------------------------------------


class _Terminal(io.BytesIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def typed(monkeypatch):
    """CliRunner's stdin as a terminal: `chat` opens the interactive loop."""
    monkeypatch.setattr("typer.testing.make_input_stream", lambda text, charset: _Terminal(text.encode()))


def _chat_typed(pair_args, lines: str):
    return invoke(["chat", *pair_args, "--max-tokens", "2", "--no-color"], lines)


def _assert_warned_once_and_answered(result, history):
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "history" in line]
    assert len(notes) == 1, result.stderr
    assert notes[0].startswith(f"note: the chat history will not be kept: cannot write {history} (")
    assert "error:" not in result.stderr
    assert result.stdout.count("› ") == 3  # both prompts answered, then Ctrl-D
    assert "tokens ·" in result.stdout


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_home_is_said_once_and_the_chat_goes_on(pair_args, isolated_home, typed):
    isolated_home.chmod(0o500)
    try:
        result = _chat_typed(pair_args, "Say hi\nAgain\n")
    finally:
        isolated_home.chmod(0o700)
    _assert_warned_once_and_answered(result, isolated_home / "history")
    assert "(Permission denied)" in result.stderr


def test_a_home_that_cannot_be_made_is_said_once_and_the_chat_goes_on(
    pair_args, tmp_path, monkeypatch, typed
):
    (tmp_path / "a-file").write_text("")
    home = tmp_path / "a-file" / "mlxswitch"  # even root cannot make a directory in a file
    monkeypatch.setenv("MLXSWITCH_HOME", str(home))
    result = _chat_typed(pair_args, "Say hi\nAgain\n")
    _assert_warned_once_and_answered(result, home / "history")
    assert "(Not a directory)" in result.stderr


def test_a_writable_home_keeps_the_history_without_a_word(pair_args, isolated_home, typed):
    result = _chat_typed(pair_args, "Say hi\n")
    assert result.exit_code == 0, result.output
    assert "history" not in result.stderr
    assert (isolated_home / "history").is_file()
