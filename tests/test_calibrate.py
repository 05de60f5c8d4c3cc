"""`mlxswitch calibrate` on a tiny pair: the target is chosen on one split and reported on the
other, every signal's AUROC is printed, and --write edits the user's models.toml in place."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from mlxswitch.bench.calibrate import Candidate, choose
from mlxswitch.bench.simulate import Quality
from mlxswitch.cli import app
from mlxswitch.profile_load import load_profiles
from mlxswitch.routing.router import RouterConfig

runner = CliRunner()


def _candidate(share, retained, bytes_=1.0):
    return Candidate(
        "peek", "entropy", 1.0, RouterConfig(up=(1.0,)), Quality(10, share, 1.0, retained, bytes_)
    )


def test_choose_takes_the_best_fidelity_near_the_share_and_the_cheapest_that_retains():
    options = [_candidate(0.10, 0.30), _candidate(0.24, 0.40), _candidate(0.26, 0.50), _candidate(0.40, 0.90)]
    assert choose(options, 0.25, None).quality.retained == 0.50
    costs = [_candidate(0.3, 0.6, 5.0), _candidate(0.2, 0.6, 3.0), _candidate(0.1, 0.4, 1.0)]
    assert choose(costs, None, 0.5).quality.bytes_per_token == 3.0
    with pytest.raises(Exception, match="no setting retains 0.95"):
        choose(costs, None, 0.95)


@pytest.mark.parametrize(
    "args,line",
    [
        ([], "error: give exactly one of --target-share and --target-retained"),
        (["--target-share", "1.5"], "error: --target-share must be between 0 and 1 (got 1.5)"),
        (
            ["--target-share", "0.2", "--model", "embedded"],
            "error: profile 'ad-hoc' has a single tier: there is nothing to calibrate",
        ),
    ],
)
def test_calibrate_refuses_bad_requests_in_one_line(args, line):
    result = runner.invoke(app, ["calibrate", *args])
    assert result.exit_code == 2
    assert result.stderr.strip() == line


def test_calibrate_reports_heldout_figures_and_writes_the_profile(tiny_pair, isolated_home, tmp_path):
    small, large = tiny_pair
    (isolated_home / "models.toml").write_text(
        '# my own notes stay\n[profiles.other]\nmode = "single"\nmodel = "embedded"\n\n'
        f'[profiles.tiny]\nmode = "pair"\nsmall = "{small}"\nlarge = "{large}"\nup = [9.0]\n'
    )
    result = runner.invoke(
        app,
        [
            "calibrate",
            "--profile",
            "tiny",
            "--target-share",
            "0.3",
            "--quick",
            "--max-tokens",
            "24",
            "--write",
            "--json",
            str(tmp_path / "c.json"),
        ],
    )
    assert result.exit_code == 0, result.stderr
    assert "AUROC heldout" in result.stdout and "varentropy" in result.stdout and "margin" in result.stdout
    record = json.loads((tmp_path / "c.json").read_text())
    assert set(record["auroc_heldout"]) == {"entropy", "varentropy", "margin", "probe"}
    # Each signal's own best setting for the target, measured on the same held-out text.
    assert set(record["per_signal_heldout"]) == {"entropy", "varentropy", "margin", "probe"}
    assert record["per_signal_heldout"]["probe"]["policy"] == "peek"
    chosen = record["per_signal_heldout"][record["chosen"]["signal"]]
    assert chosen["retained"] == pytest.approx(record["heldout"]["retained"])
    assert "best on probe" in result.stdout
    learned = record["probe"]
    assert learned["status"] == "trained" and learned["features"] == 32 + 3  # hidden state + 3 signals
    assert str(isolated_home) in learned["path"]  # under the user directory
    assert 0 <= learned["auroc_heldout"] <= 1 and learned["cost_s_per_token"] > 0
    assert not set(record["prompts"]["calibration"]) & set(record["prompts"]["heldout"])
    pick = record["chosen"]
    assert abs(pick["calibration"]["top_share"] - 0.3) < 0.1
    text = (isolated_home / "models.toml").read_text()
    assert text.startswith("# my own notes stay\n[profiles.other]")
    profile = load_profiles().get("tiny")
    assert profile.router.up == (pick["tau"],) and profile.router.policy == pick["policy"]
    assert profile.models == (str(small), str(large))
    # Calibrating again replaces the table instead of adding a second one.
    again = runner.invoke(
        app,
        [
            "calibrate",
            "--profile",
            "tiny",
            "--target-share",
            "0.6",
            "--quick",
            "--max-tokens",
            "8",
            "--write",
        ],
    )
    assert again.exit_code == 0, again.stderr
    assert (isolated_home / "models.toml").read_text().count('[profiles."tiny"]') == 1
    assert "other" in load_profiles()


def test_the_probe_fits_a_separable_signal_and_round_trips(tmp_path):
    import numpy as np

    from mlxswitch.bench import metrics, probe

    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 6))
    y = (x[:, 2] - 0.5 * x[:, 4] + 0.1 * rng.normal(size=400)) > 0
    learned = probe.fit(x[:300], y[:300])
    assert metrics.auroc(learned.score(x[300:]), y[300:]) > 0.95
    path = learned.save(tmp_path / "p.npz", {"what": "test"})
    data = np.load(path)
    again = probe.Probe(data["mean"], data["scale"], data["weights"], float(data["bias"]))
    assert np.allclose(again.score(x), learned.score(x))
