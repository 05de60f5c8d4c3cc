"""A wheel built from the repo carries its Metal sources and models.toml and finds them installed."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_and_finds_its_data(tmp_path):
    from hatchling.builders.wheel import WheelBuilder

    wheel = Path(
        next(iter(WheelBuilder(str(ROOT)).build(directory=str(tmp_path / "dist"), versions=["standard"])))
    )
    names = zipfile.ZipFile(wheel).namelist()
    assert "mlxswitch/models.toml" in names
    assert "mlxswitch/metal/entropy.metal" in names
    assert "mlxswitch/metal/nested_qmv.metal" in names
    assert "mlxswitch/bench_prompts/suite.jsonl" in names
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    probe = (
        "import mlxswitch, mlxswitch.resources as r, mlxswitch.profile_load as p;"
        "print(mlxswitch.__file__); print(r.metal_dir()); print(r.bundled_models_toml());"
        "print(len(r.metal_source('entropy')) > 0); print(p.load_profiles().default);"
        "import mlxswitch.bench.prompts as b; print(b.default_suite_path())"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "MLXSWITCH_HOME": str(tmp_path / "home")},
        check=True,
    ).stdout.split()
    installed = site / "mlxswitch"
    from mlxswitch.models.packaged import CATALOGUE, parts_present

    # The bundled default: the Qwen pair where its parts are installed (no conversion is cached in
    # the fresh home), else the embedded model.
    pair_here = all(parts_present(entry) for entry in CATALOGUE.values())
    assert out == [
        str(installed / "__init__.py"),
        str(installed / "metal"),
        str(installed / "models.toml"),
        "True",
        "qwen2.5-coder-0.5b-1.5b" if pair_here else "embedded-plain",
        str(installed / "bench_prompts" / "suite.jsonl"),
    ]
