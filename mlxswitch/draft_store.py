"""What verified drafting learned on this machine, kept between runs: each ladder's pass costs.

A one-shot `mlxswitch chat -p` would otherwise spend its first rounds timing the passes again
(on this CPU that cost a first answer 10–20%). The costs belong to the machine, the models and
the route, so the file is keyed by all three; the kept shares belong to the text and are not
kept. A file that cannot be read is ignored (timed again), one that cannot be written is skipped:
learning is an optimisation, never a reason to fail.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .decoding.draft_memory import DraftMemory, PassCosts
from .decoding.tiers import Ladder
from .errors import OutputError
from .files import atomic_file
from .kernels.route import current_route
from .resources import user_dir

# 2: a drafter's passes read its draft head (models/heads.py), so its step costs less than a
# version 1 file says.
VERSION = 2


def store_path(ladder: Ladder) -> Path:
    """The file of this ladder's models on this route, in the user directory."""
    route = current_route()
    key = json.dumps(
        {
            "models": [(g.model.source, g.model.precision, g.model.linears) for g in ladder.groups],
            "route": [
                route.backend,
                route.kernels,
                route.plain_linears,
                route.quant_activations,
                route.quant_scales,
                route.resident_product,
                route.blas_threads,
                route.compute_dtype,
            ],
        },
        sort_keys=True,
    )
    return user_dir() / "drafting" / f"{hashlib.sha256(key.encode()).hexdigest()[:16]}.json"


def load_draft_costs(ladder: Ladder) -> bool:
    """Give the ladder the pass costs a previous run learned here; whether there were any."""
    try:
        data = json.loads(store_path(ladder).read_text())
        if data.get("version") != VERSION:
            return False
        check = {int(k): float(v) for k, v in data["check"].items()}
        draft = {int(k): float(v) for k, v in data["draft"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    ladder.draft_memory = DraftMemory(check=PassCosts(check), draft=PassCosts(draft))
    return bool(check)


def save_draft_costs(ladder: Ladder) -> None:
    """Keep the ladder's pass costs for the next run (nothing to keep, or no room: skipped)."""
    memory = ladder.draft_memory
    if not memory.check.known:
        return
    record = {
        "version": VERSION,
        "check": {str(k): v for k, v in sorted(memory.check.seconds.items())},
        "draft": {str(k): v for k, v in sorted(memory.draft.seconds.items())},
    }
    path = store_path(ladder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(path, "draft costs") as handle:
            json.dump(record, handle)
    except (OSError, OutputError):
        pass
