"""`mlxswitch bench --suite peer`: the command's flow, kept out of cmd_bench.py (Rich in ui*.py)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from ..errors import UsageError
from ..profiles import Profile
from . import ui, ui_tables


def bench_peer(
    profile: Profile,
    profile_flags: list[str],
    *,
    llama_bin: Path | None,
    arms: str | None,
    workloads: str | None,
    clients: str | None,
    rounds: int,
    max_tokens: int | None,
    json_path: Path | None,
) -> None:
    """Check every flag, find llama-server and the GGUF files it reads, run, write and print."""
    from ..api import parse_int_list
    from ..bench import peer
    from ..bench.command import check_output_path, write_json

    check_output_path(json_path, "--json")
    configs = peer.parse_choice(arms, peer.CONFIGS, peer.CONFIGS, "--arms")
    none = workloads is not None and not workloads.strip()  # '': the clients alone
    chosen_workloads = (
        () if none else peer.parse_choice(workloads, peer.WORKLOADS, peer.DEFAULT_WORKLOADS, "--workloads")
    )
    levels = parse_int_list(clients, "--clients") if clients else ()
    if any(level < 1 for level in levels):
        raise UsageError(f"--clients must list counts of at least 1 (got '{clients}')")
    if not chosen_workloads and not levels:
        raise UsageError("--workloads '' leaves nothing to measure without --clients")
    llama = _llama_folder(llama_bin)
    console = ui.make_console(stderr=True)
    if llama is None and any(c.startswith("llama") for c in configs):
        ui.print_dim(console, "llama.cpp: no llama-server on PATH or in --llama-bin; its configs are skipped")
        configs = tuple(c for c in configs if not c.startswith("llama"))
    if "llama-draft" in configs and len(profile.models) != 2:
        raise UsageError(f"--arms llama-draft needs a profile of two models ('{profile.name}' has one)")
    if not configs:
        raise UsageError("--arms: nothing left to run")
    top = profile.models[-1]
    ours_models = ["--model", top]
    with tempfile.TemporaryDirectory(prefix="mlxswitch-peer-ggufs-") as folder:
        ggufs: dict[str, Path] = {}
        if any(c.startswith("llama") for c in configs):
            ggufs["top"] = _gguf_file(top, Path(folder))
            if "llama-draft" in configs:
                ggufs["bottom"] = _gguf_file(profile.models[0], Path(folder))
        plan = peer.PeerPlan(
            configs,
            chosen_workloads,
            tuple(levels),
            rounds,
            max_tokens or peer.DEFAULT_MAX_TOKENS,
            llama,
            ggufs,
            tuple(ours_models),
            tuple(profile_flags),
        )

        def saved(results: dict) -> None:
            if json_path is not None:  # kept as it grows: a later failure loses nothing measured
                write_json(peer.report(results), json_path)

        with ui.bench_progress() as progress:
            results = peer.run(plan, progress, saved)
    record = peer.report(results)
    if json_path is not None:
        write_json(record, json_path)
    out = ui.make_console()
    for table in ui_tables.peer_tables(record, plan.max_tokens):
        out.print(table)


def _llama_folder(given: Path | None) -> Path | None:
    """The folder holding llama-server: --llama-bin (checked), else PATH's, else None."""
    if given is not None:
        if not (given / "llama-server").is_file():
            raise UsageError(f"--llama-bin {given}: no llama-server there")
        return given
    found = shutil.which("llama-server")
    return Path(found).parent if found else None


def _gguf_file(spec: str, folder: Path) -> Path:
    """The GGUF file llama.cpp reads for the model `spec`: a .gguf path as it is, a packaged one
    joined from its parts into `folder`; a UsageError for any other kind of model."""
    from ..models.packaged import join_parts
    from ..models.sources import GGUFFileSource, PackagedGGUFSource, model_source

    source = model_source(spec)
    if isinstance(source, PackagedGGUFSource):
        return join_parts(source.entry, folder / f"{source.entry.name}.gguf")
    if isinstance(source, GGUFFileSource):
        path = source.local_path()
        if path is None:
            raise UsageError(f"model '{spec}': no such file (llama.cpp reads the GGUF file itself)")
        return path
    raise UsageError(
        f"model '{spec}' is not a GGUF file, which llama.cpp reads: leave its configs out "
        "(--arms ours-top,ours-profile) or name GGUF models"
    )
