"""Which arms a HumanEval run decodes with: the bench's own (runner.make_arms) and the controls.

Bottom and top alone always run: every other figure is read against them. `--arms` picks among
the groups below; random controls match every routed arm picked (the profile, the calibrated
setting, each swept point).

- `calibrated`: peek, each position on its own, at the threshold that gives `target_share` of the
  top tier's tokens teacher-forced on calibration problems (run.py): the setting calibrate would
  promise, decoded live on the held-out problems.
- `verify`: verified drafting (decoding/verify.py) at that threshold: lossless.
- `mlx-lm`: mlx-lm's stream_generate on each tier as shipped (on x86, MLX's quantized mat-vec is a
  scalar loop); `mlx-lm-fp32`: the same with that tier's model dequantized to fp32 while it runs,
  on MLX's own kernels (the fair bar for a model alone on x86; separate models only).
- `speculative`: mlx-lm's speculative decoding as shipped; `speculative-ours`: the same generator
  on our CPU routes (mlx-lm's algorithm, our kernels), so that the comparison with `verify`
  isolates the drafting rule; `speculative-fp32`: mlx-lm's speculative decoding on MLX's own
  kernels with both models dequantized to fp32 while it runs (the fair bar for mlx-lm's own drafting on x86).
"""

from __future__ import annotations

from pathlib import Path

from ...decoding.mode import DecodingMode
from ...decoding.tiers import Ladder
from ...errors import UsageError
from ...profiles import Profile
from ...routing.registry import POLICY_BY_NAME
from ...routing.router import RouterConfig
from ..runner import MLX_LM_TIER_KINDS, PLAIN, SPECULATIVE_KINDS, Arm, forced_config, make_arms

GROUPS = (
    "profile",
    "calibrated",
    "verify",
    *POLICY_BY_NAME,
    "random",
    "oracle",
    "mlx-lm",
    "mlx-lm-fp32",
    "speculative",
    "speculative-ours",
    "speculative-fp32",
)
QUICK_GROUPS = ("profile", "peek", "random", "oracle")
ROUTED_KINDS = ("profile", "calibrated", "sweep")
CONTROL_KINDS = ("random", "oracle")
CALIBRATED_GROUPS = ("calibrated", "verify")  # their arms run at the calibrated threshold
# Groups whose thresholds a run chooses from calibration answers before its first problem.
THRESHOLD_GROUPS = (*POLICY_BY_NAME, *CALIBRATED_GROUPS)
STOCK_KINDS = (*MLX_LM_TIER_KINDS, *SPECULATIVE_KINDS)  # mlx-lm's generator decodes them


def calibrated_signal(profile: Profile) -> str:
    """What the calibrated arms route on: the profile's signal, or entropy in place of the probe."""
    return "entropy" if profile.router.signal == "probe" else profile.router.signal


def calibrated_config(signal: str, tau: float, num_tiers: int) -> RouterConfig:
    """peek on `signal`, each position on its own, at `tau` (a verify arm's drafts end there)."""
    return RouterConfig(up=(tau,) * (num_tiers - 1), policy="peek", window=1, min_run=1, signal=signal)


def parse_groups(text: str | None, quick: bool = False) -> tuple[str, ...]:
    """`--arms a,b,…` (or all; --quick: QUICK_GROUPS; `none`: the tiers alone) in GROUPS order; a
    UsageError for an unknown one."""
    if text is None:
        return QUICK_GROUPS if quick else GROUPS
    asked = [part.strip() for part in text.split(",") if part.strip()]
    if asked == ["none"]:
        return ()
    unknown = [part for part in asked if part not in GROUPS]
    if unknown:
        raise UsageError(
            f"--arms: unknown arm group '{unknown[0]}' (choose among {', '.join(GROUPS)}; "
            "bottom and top alone always run)"
        )
    return tuple(group for group in GROUPS if group in asked)


def _pair_of_models(profile: Profile) -> bool:
    """Two models of their own (a ladder's local tiers are the profile's gears, else its models)."""
    return not profile.gears and len(profile.models) == 2


def refuse_unrunnable(groups: tuple[str, ...], profile: Profile) -> None:
    """A UsageError for an asked group this profile's ladder has no arm for (rather than a run
    without it): the speculative ones need a pair of models, `mlx-lm-fp32` models of their own."""
    for group in groups:
        if group in SPECULATIVE_KINDS and not _pair_of_models(profile):
            raise UsageError(
                f"--arms {group}: needs a pair of models, a draft and a target; profile "
                f"'{profile.name}' has tiers {', '.join(profile.tier_names())}"
            )
        if group == "mlx-lm-fp32" and profile.gears:
            raise UsageError(
                f"--arms {group}: runs each model of its own; profile '{profile.name}' has gears "
                f"{', '.join(profile.tier_names())} of one model"
            )


def _group(arm: Arm) -> str | None:
    if arm.kind == "sweep":
        return arm.policy
    return None if arm.kind == "tier" else arm.kind


def random_control(arm_name: str) -> str:
    """The name of the random control that spends the routed arm `arm_name`'s share."""
    return f"random@{arm_name}"


def matched_arm(control_name: str) -> str:
    """The name of the routed arm whose per-problem share the random control `control_name` spends."""
    return control_name.split("@", 1)[1]


def swept_thresholds(derived: dict) -> dict[str, list[float]]:
    """Each swept policy's thresholds, from a records header's `derived` block. Headers written
    before the sweep was chosen per policy keep one list (`taus`) that every policy swept."""
    if "sweep" in derived:
        return {policy: [point["tau"] for point in points] for policy, points in derived["sweep"].items()}
    return dict.fromkeys(POLICY_BY_NAME, derived.get("taus", []))


def refuse_unaddable(groups: tuple[str, ...], header: dict, path: Path) -> None:
    """A UsageError for a group a resumed run adds (`header`: its records') whose arms need a
    threshold the records did not choose when they began: a swept policy, the calibrated setting."""
    derived = header["derived"]
    for group in groups:
        if group in header["settings"]["groups"]:
            continue
        swept = group in POLICY_BY_NAME and not swept_thresholds(derived).get(group)
        if swept or group in CALIBRATED_GROUPS and derived.get("calibrated") is None:
            raise UsageError(
                f"--arms {group}: {path} began without it, and thresholds are chosen when records "
                "begin; pass --restart to start over, or another --records file"
            )


def humaneval_arms(
    profile: Profile,
    ladder: Ladder,
    sweep: dict[str, list[float]],
    groups: tuple[str, ...],
    calibrated_tau: float | None = None,
) -> list[Arm]:
    """Tiers alone, the routed arms, their random controls, the oracle, then mlx-lm's arms."""
    n = len(ladder.tiers)
    bench = [
        arm
        for arm in make_arms(profile, ladder, sweep)
        if arm.kind == "tier" and arm.tier in (0, n - 1) or _group(arm) in groups
    ]
    if n == 2 and calibrated_tau is not None:
        tau = calibrated_tau
        for kind, verify in (("calibrated", False), ("verify", True)):
            if kind in groups:
                name = f"{kind} (peek τ={tau:g})"
                config = calibrated_config(calibrated_signal(profile), tau, n)
                bench.append(Arm(name, kind, config, DecodingMode(verify=verify), policy="peek", tau=tau))
    if "mlx-lm-fp32" in groups and not profile.gears:
        bench += [
            Arm(f"mlx-lm {name} (fp32 weights)", "mlx-lm-fp32", tier=r)
            for r, name in enumerate(ladder.tier_names)
        ]
    two_models = _pair_of_models(profile)
    if "speculative-ours" in groups and two_models:
        bench.append(Arm("mlx-lm speculative (our kernels)", "speculative-ours"))
    if "speculative-fp32" in groups and two_models:
        bench.append(Arm("mlx-lm speculative (fp32 weights)", "speculative-fp32"))
    own = [arm for arm in bench if arm.kind not in STOCK_KINDS]
    stock = [arm for arm in bench if arm.kind in STOCK_KINDS]
    controls = []
    if n > 1 and "random" in groups:
        controls += [
            Arm(random_control(arm.name), "random", forced_config(n, 0), PLAIN)
            for arm in own
            if arm.kind in ROUTED_KINDS and not arm.decoding.verify  # verified: lossless
        ]
    if n > 1 and "oracle" in groups:
        controls.append(Arm("oracle", "oracle", forced_config(n, 0), PLAIN))
    return own + controls + stock
