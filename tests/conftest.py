"""Shared fixtures: isolated user state, no network, tiny models built once per session."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tinymodels import make_pair_dirs


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Point mlxswitch's user dir at a temp dir and forbid hub downloads."""
    home = tmp_path / "mlxswitch-home"
    home.mkdir()
    monkeypatch.setenv("MLXSWITCH_HOME", str(home))
    monkeypatch.delenv("MLXSWITCH_MODELS", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    return home


@pytest.fixture(autouse=True)
def default_pair_absent(monkeypatch):
    """models.toml's default is the Qwen pair where its models are on this machine: every test
    sees it absent (so the default is embedded-plain and no test loads the real pair), whether or
    not this environment has the `qwen-coder` extra; tests/test_default_profile.py turns it on."""
    monkeypatch.setattr("mlxswitch.profiles.profile_available", lambda profile: False)


@pytest.fixture(autouse=True)
def restore_route():
    """Put back the route (mlxswitch.kernels.route) a test resolved or faked: MLXSWITCH_KERNELS is
    read when the route is resolved, not per call, so a test flips it with resolve_route()."""
    from mlxswitch.kernels import route

    saved = route._ROUTE
    yield
    route.use_route(saved)


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """Paths of a tiny small/large llama pair sharing a tokenizer (mlx-lm directories)."""
    return make_pair_dirs(tmp_path_factory.mktemp("tiny-pair"))


@pytest.fixture(scope="session")
def tiny_gears_4_8(tmp_path_factory):
    """A tiny llama nested into gears 4 and 8 (planes 4+4, group 32), loaded."""
    from tinymodels import llama_config, make_model, save_model_dir, train_tokenizer

    from mlxswitch.models.nesting import nest_model
    from mlxswitch.models.sources import load_model

    tok = train_tokenizer(320)
    config = llama_config(tok.get_vocab_size(), hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128)
    source = save_model_dir(tmp_path_factory.mktemp("gears-4-8") / "m", make_model(config, 5), config, tok)
    loaded = load_model(str(source))
    nest_model(loaded.model, (4, 4), 32)
    return loaded


@pytest.fixture
def ctrl_c():
    """Python's own SIGINT handler for the test, so `_thread.interrupt_main()` acts as a Ctrl-C.

    A shell starts a background job (`cmd &`) with SIGINT ignored, and Python then installs no
    handler: interrupt_main does nothing, and a Ctrl-C test would pass or fail by how it was run."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="module")
def pair_args(tiny_pair):
    """--small/--large naming the tiny pair (the CLI tests' ad-hoc pair)."""
    small, large = tiny_pair
    return ["--small", str(small), "--large", str(large)]


@pytest.fixture
def sandbox_root(tmp_path):
    """A directory the HumanEval sandbox makes its temporary directory in, a sentinel beside it."""
    root = tmp_path / "box" / "sandbox"
    root.mkdir(parents=True)
    (root.parent / "sentinel.txt").write_text("untouched")
    return root
