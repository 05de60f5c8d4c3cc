"""What `mlxswitch models` and `mlxswitch doctor` report: profiles, backends, kernels, the default ladder."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass, field

from . import __version__
from .errors import MlxSwitchError
from .models.model_bytes import resident_bytes
from .models.packaged import CATALOGUE, parts_present
from .models.sources import PackagedGGUFSource, model_source
from .profile_load import load_profiles, user_models_toml
from .resources import bundled_models_toml, embedded_gguf_path, metal_dir
from .routing.probe import describe_probe


def profile_rows() -> list[dict]:
    """One row per profile for `mlxswitch models`: mode, tiers, models and offline availability."""
    profiles = load_profiles()
    return [
        {
            "name": p.name,
            "default": p.name == profiles.default,
            "mode": p.mode,
            "decoding": p.decoding.describe(p.router, len(p.local_tiers()), one_cache=bool(p.gears)),
            "tiers": list(p.tier_names()),
            "models": list(p.models),
            "notes": p.description,
            "offline": [model_source(source).available() for source in p.models],
            "how_to_get": [model_source(source).how_to_get() for source in p.models],
        }
        for p in profiles
    ]


@dataclass
class DoctorReport:
    """Sections of facts, and the problems that make the verdict 'not ok'."""

    sections: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Whether the default profile loads and every check passed."""
        return not self.problems

    def verdict(self) -> str:
        """One line a script can read: `doctor: ok` or `doctor: FAIL: …`."""
        return "doctor: ok" if self.ok else "doctor: FAIL: " + "; ".join(self.problems)


def doctor_report() -> DoctorReport:
    """Check MLX, the backends, the models.toml files, the embedded model, the default ladder, kernels."""
    import mlx.core as mx

    from .api import build_ladder, resolve_profile
    from .kernels import kernel_self_check
    from .kernels.route import current_route

    report = DoctorReport()
    report.sections.append(
        (
            "system",
            [
                ("mlxswitch", __version__),
                ("python", platform.python_version()),
                ("platform", f"{platform.system()} {platform.machine()}"),
                ("mlx", mx.__version__),  # type: ignore[attr-defined]  # mlx's stubs omit __version__
                ("metal sources", str(metal_dir())),
            ],
        )
    )
    # What computes each part of a token here (kernels/route.py), one line per field: the backend
    # (metal, cuda or cpu) and whether Metal is there are the route's, asked of MLX once.
    report.sections.append(("route", current_route().describe()))

    user = user_models_toml()
    origin = "$MLXSWITCH_MODELS" if os.environ.get("MLXSWITCH_MODELS") else "user"
    files = [
        ("models.toml (bundled)", str(bundled_models_toml())),
        (f"models.toml ({origin})", str(user) if user.exists() else f"{user} (none)"),
    ]
    models: list[tuple[str, str]] = []
    try:
        embedded = f"ok, checksum verified ({embedded_gguf_path()})"
    except MlxSwitchError as exc:
        embedded = f"missing: {exc}"
        report.problems.append("embedded model missing")
    models.append(("embedded model", embedded))
    for entry in CATALOGUE.values():  # optional models: reported, never a failure when absent
        source = model_source(f"package:{entry.name}")
        converted = source.converted() if isinstance(source, PackagedGGUFSource) else None
        state = (
            f"converted ({converted})"
            if converted is not None
            else "parts installed; converted on first use"
            if parts_present(entry)
            else f"not installed: {source.how_to_get()}"
        )
        models.append((f"package:{entry.name}", state))
    key = os.environ.get("ANTHROPIC_API_KEY")
    models.append(("anthropic key", "set (ANTHROPIC_API_KEY)" if key else "not set"))
    report.sections.append(("configuration", files + models))

    ladder_rows: list[tuple[str, str]] = []
    try:
        default = resolve_profile(None)
        ladder_rows.append(
            ("default profile", f"{default.name} ({default.mode}: {', '.join(default.models)})")
        )
        ladder = build_ladder(default)
        for tier in ladder.tiers:
            ladder_rows.append((f"tier {tier.name}", f"{tier.bytes_per_token / 1e6:.1f} MB read per token"))
        for group in ladder.groups:
            ladder_rows.append(
                (
                    f"resident {group.model.name}",
                    f"{resident_bytes(group.model.model) / 1e6:.1f} MB; {group.model.precision}",
                )
            )
        if len(ladder.tiers) > 1:
            ladder_rows.append(("probe", describe_probe(*default.probe_key())))
    except MlxSwitchError as exc:
        ladder_rows.append(("load", f"failed: {exc}"))
        report.problems.append(f"the default profile cannot load ({exc})")
    report.sections.append(("default ladder", ladder_rows))

    kernels = []
    for check in kernel_self_check():
        kernels.append((f"{check.name} [{check.backend}]", check.status))
        if check.status.startswith(("mismatch", "failed")):  # works (falls back), but say so
            report.problems.append(f"kernel {check.name}: {check.status}")
    report.sections.append(("kernels", kernels))
    return report
