"""The peer suite (`mlxswitch bench --suite peer`): mlxswitch beside llama.cpp's `llama-server` on
the same GGUF files, through one OpenAI-compatible client, the same threads, one server at a time.

Configs (`--arms`):

- `llama-top`: llama-server with the profile's top model; `llama-ngram`: the same with
  `--spec-type ngram-mod` (draft-free n-gram drafts); `llama-draft`: with the bottom model as its
  draft model (`-md`, 3 tokens a draft);
- `ours-top`: `mlxswitch serve` with the top model alone; `ours-profile`: with the profile.

Workloads (`--workloads`): `everyday` (one request per category of the held-out everyday
prompts), `humaneval` (three HumanEval-style completions), `edit` (a ~130-line module pasted with
"rename one function, return the whole module", 3× the token budget), each streamed greedily one
request at a time; `cold-start`: each config from a cold process to its first token (llama-server:
start until the first streamed token of one request, /health polled every 50 ms; ours: `mlxswitch
chat -p` with the config's models, start until the first byte of its answer on stdout, and until it
exits), after one start not counted (bytecode written, the files in the page cache).
`--clients 4,8`: each config then serves that many streaming clients at once (llama-server
with `-np 8 --kv-unified`), 64 tokens each. Rounds (`--repeats`) rotate the config order.

Per config and workload: seconds, completion tokens, tokens/s, median first token and the answers
identical to the same program's top model alone; per config: load seconds (start until /health
says 200) and peak RSS (VmHWM). Figures are this machine's, side by side in one run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..resources import bundled_file
from .servers import Server, ask, concurrent, free_port

CONFIGS = ("llama-top", "llama-ngram", "llama-draft", "ours-top", "ours-profile")
WORKLOADS = ("everyday", "humaneval", "edit", "cold-start")
DEFAULT_WORKLOADS = ("everyday", "humaneval", "edit")
DEFAULT_MAX_TOKENS = 128
CLIENT_TOKENS = 64  # each concurrent client's answer
COLD_PROMPT = "Write hello world in Python."
Progress = Callable[[str, int, int], None]  # (stage, done, total)

HUMANEVAL_STYLE = (
    'def has_close_elements(numbers: list[float], threshold: float) -> bool:\n    """Check if in '
    "given list of numbers, are any two numbers closer to each other than given threshold.\n    "
    '>>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n    False\n    """\n',
    'def separate_paren_groups(paren_string: str) -> list[str]:\n    """Input to this function '
    "is a string containing multiple groups of nested parentheses. Separate those groups into "
    'separate strings and return the list of those.\n    >>> separate_paren_groups("( ) (( )) '
    "(( )( ))\")\n    ['()', '(())', '(()())']\n    \"\"\"\n",
    'def below_zero(operations: list[int]) -> bool:\n    """You are given a list of deposit and '
    "withdrawal operations on a bank account that starts with zero balance. Detect if at any "
    'point the balance falls below zero.\n    >>> below_zero([1, 2, -4, 5])\n    True\n    """\n',
)


def edit_request() -> str:
    """A ~130-line module pasted with a request to rename one function and return it whole."""
    blocks = []
    for n in range(12):
        blocks.append(
            f"def load_record_{n}(path: str) -> dict:\n"
            f'    """Read record {n} from a JSON file and check its fields."""\n'
            f"    with open(path) as handle:\n"
            f"        data = json.load(handle)\n"
            f"    if 'id' not in data:\n"
            f"        raise ValueError('record {n} has no id')\n"
            f"    data['score'] = compute_score(data.get('values', []))\n"
            f"    return data\n"
        )
    module = (
        "import json\n\n\ndef compute_score(values: list[float]) -> float:\n"
        '    """The mean of the values, 0 when there are none."""\n'
        "    return sum(values) / len(values) if values else 0.0\n\n\n" + "\n\n".join(blocks)
    )
    return (
        "Rename the function compute_score to mean_score everywhere in this module and return the "
        f"whole module, nothing else.\n\n```python\n{module}```"
    )


def workload_prompts() -> dict[str, list[str]]:
    """Workload name → its requests (cold-start: the one request a cold process answers)."""
    everyday, seen = [], set()
    path = bundled_file("bench_prompts/everyday-heldout7.jsonl", "bench/prompts/everyday-heldout7.jsonl")
    for line in path.read_text(encoding="utf-8").splitlines():
        item = json.loads(line)
        if item["category"] not in seen:
            seen.add(item["category"])
            everyday.append(item["prompt"])
    humaneval = [f"Complete this Python function.\n\n```python\n{p}```" for p in HUMANEVAL_STYLE]
    return {
        "everyday": everyday,
        "humaneval": humaneval,
        "edit": [edit_request()],
        "cold-start": [COLD_PROMPT],
    }


def parse_choice(
    text: str | None, known: tuple[str, ...], default: tuple[str, ...], flag: str
) -> tuple[str, ...]:
    """A comma-separated subset of `known`, in the order given; a UsageError naming an unknown one."""
    if text is None:
        return default
    asked = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    unknown = [part for part in asked if part not in known]
    if unknown or not asked:
        raise UsageError(f"{flag}: unknown {', '.join(unknown) or 'empty list'} (known: {', '.join(known)})")
    return asked


@dataclass(frozen=True)
class PeerPlan:
    """What a run measures and with what: the configs' commands are built from it."""

    configs: tuple[str, ...]
    workloads: tuple[str, ...]
    clients: tuple[int, ...]
    rounds: int
    max_tokens: int
    llama: Path | None  # the folder holding llama-server (None: its configs are not in `configs`)
    ggufs: dict[str, Path] = field(default_factory=dict)  # "top", "bottom": the files llama.cpp reads
    ours_models: tuple[str, ...] = ()  # `serve`/`chat` flags naming the top model alone
    ours_profile: tuple[str, ...] = ()  # the same naming the profile


def server_command(plan: PeerPlan, config: str, port: int, slots: bool = False) -> list[str]:
    """The command that serves `config` on `port` (`slots`: llama-server with 8 for the clients)."""
    if config.startswith("llama"):
        assert plan.llama is not None
        command = [str(plan.llama / "llama-server"), "-m", str(plan.ggufs["top"]), "-t", "2", "-c", "4096"]
        command += ["--port", str(port)]
        if slots:  # 8 slots for concurrent clients sharing one 4096-token KV pool (as one had)
            command += ["-np", "8", "--kv-unified"]
        if config == "llama-ngram":
            command += ["--spec-type", "ngram-mod"]
        if config == "llama-draft":
            command += [
                "-md",
                str(plan.ggufs["bottom"]),
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                "3",
            ]
        return command
    models = plan.ours_models if config == "ours-top" else plan.ours_profile
    return [
        sys.executable,
        "-m",
        "mlxswitch",
        "serve",
        *models,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def _environment(plan: PeerPlan) -> dict[str, str]:
    found = os.environ.get("LD_LIBRARY_PATH", "")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{plan.llama}:{found}" if plan.llama else found}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # ours starts as an install does: from its bytecode
    return env


def cold_start(plan: PeerPlan, config: str, logs: Path) -> dict:
    """One cold start of `config` (the module's docstring): first token seconds (ours: exit too)."""
    env = _environment(plan)
    if config.startswith("llama"):
        server = Server(server_command(plan, config, free_port()), logs / f"{config}-cold.log", env)
        started = time.perf_counter()
        try:
            server.wait_ready()
            asked = time.perf_counter() - started
            answer = ask(server.base, "any", COLD_PROMPT, 1)
            return {"first_s": asked + answer["first_s"], "text": answer["text"]}
        finally:
            server.stop()
    models = plan.ours_models if config == "ours-top" else plan.ours_profile
    command = [sys.executable, "-m", "mlxswitch", "chat", "-p", COLD_PROMPT, *models, "--max-tokens", "1"]
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert process.stdout is not None
    head = process.stdout.read(1)
    first = time.perf_counter() - started
    rest = process.stdout.read()
    code = process.wait()
    if code != 0:
        raise UsageError(f"{config}: `mlxswitch chat -p` exited with code {code} in a cold start")
    return {"first_s": first, "exit_s": time.perf_counter() - started, "text": (head + rest).decode().strip()}


def empty_results(plan: PeerPlan) -> dict[str, dict]:
    """The record's shape: per config, loads, peak RSS, each workload's runs and clients' runs."""
    return {
        config: {"load_s": [], "rss_gb": [], "runs": {w: [] for w in plan.workloads}, "clients": {}}
        for config in plan.configs
    }


def run(plan: PeerPlan, progress: Progress, saved: Callable[[dict], None]) -> dict[str, dict]:
    """Every round, every config in turn (the order rotated a place each round): its server started
    and loaded, each workload's requests in turn, then the concurrent clients; `saved` gets the
    results after each config (a later failure loses nothing measured)."""
    import httpx

    prompts = workload_prompts()
    results = empty_results(plan)
    served = [w for w in plan.workloads if w != "cold-start"]
    total, done = plan.rounds * len(plan.configs), 0
    with tempfile.TemporaryDirectory(prefix="mlxswitch-peer-") as folder:
        logs = Path(folder)
        for round_index in range(plan.rounds):
            shift = round_index % len(plan.configs)
            for config in plan.configs[shift:] + plan.configs[:shift]:
                progress(f"round {round_index + 1}: {config}", done, total)
                data = results[config]
                try:
                    if "cold-start" in plan.workloads:
                        if round_index == 0:  # not counted: bytecode written, the files in the page cache
                            cold_start(plan, config, logs)
                        data["runs"]["cold-start"].append(cold_start(plan, config, logs))
                    if served or plan.clients:
                        _serve_round(plan, config, data, prompts, served, logs)
                except httpx.HTTPError as error:  # a server that failed or dropped a request
                    raise UsageError(
                        f"{config}: a request failed ({error}); what was measured before is in --json"
                    ) from None
                done += 1
                saved(results)
    progress("done", total, total)
    return results


def _serve_round(
    plan: PeerPlan, config: str, data: dict, prompts: dict, served: list[str], logs: Path
) -> None:
    started = time.perf_counter()
    command = server_command(plan, config, free_port(), slots=bool(plan.clients))
    server = Server(command, logs / f"{config}.log", _environment(plan))
    try:
        server.wait_ready()
        data["load_s"].append(time.perf_counter() - started)
        model = server.model_name()
        for name in served:
            tokens = plan.max_tokens * (3 if name == "edit" else 1)
            for prompt in prompts[name]:
                data["runs"][name].append(ask(server.base, model, prompt, tokens))
        for level in plan.clients:
            asked = (prompts["everyday"] + prompts["humaneval"]) * level
            data["clients"].setdefault(str(level), []).append(
                concurrent(server.base, model, asked[:level], CLIENT_TOKENS)
            )
        data["rss_gb"].append(server.peak_rss_gb())
    finally:
        server.stop()


def report(results: dict[str, dict]) -> dict:
    """The figures of a run: per workload and config, per client count, per config's load."""
    base = {"llama": "llama-top", "ours": "ours-top"}
    workloads: dict[str, list[dict]] = {}
    for config, data in results.items():
        alone = results.get(base[config.split("-")[0]], {}).get("runs", {})
        for name, runs in data["runs"].items():
            if not runs:
                continue
            texts = [r["text"] for r in alone.get(name, [])]
            row = {"config": config, "answers": len(runs)}
            if name == "cold-start":
                row["first_s"] = statistics.median(r["first_s"] for r in runs)
                if "exit_s" in runs[0]:
                    row["exit_s"] = statistics.median(r["exit_s"] for r in runs)
            else:
                seconds, tokens = sum(r["seconds"] for r in runs), sum(r["tokens"] for r in runs)
                row |= {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds}
                row["first_s"] = statistics.median(r["first_s"] for r in runs)
            if config not in base.values() and texts:
                row["same_as_top"] = sum(r["text"] == t for r, t in zip(runs, texts, strict=False))
            workloads.setdefault(name, []).append(row)
    clients = {
        config: {
            level: sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)
            for level, runs in data.get("clients", {}).items()
            if runs
        }
        for config, data in results.items()
    }
    loads = {
        config: {"load_s": statistics.median(data["load_s"]), "peak_rss_gb": max(data["rss_gb"])}
        for config, data in results.items()
        if data["load_s"]
    }
    return {"suite": "peer", "workloads": workloads, "clients": clients, "loads": loads, "results": results}
