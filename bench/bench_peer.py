"""mlxswitch beside llama.cpp on the same GGUF files: one OpenAI-compatible client, same threads.

    uv run --extra qwen-coder python bench/bench_peer.py [--llama-bin DIR] [--rounds 1]
        [--configs llama-1.5b,llama-ngram,llama-draft,ours-1.5b,ours-pair] [--tokens 128]
        [--clients 4,8] [--workloads everyday,humaneval,edit]

Needs llama.cpp's `llama-server` on PATH or in --llama-bin (../shared/peer/build-llama-server.sh
builds one; docs/benchmarks.md says how); without one the llama.cpp configs are skipped with one
line. The Qwen2.5-Coder GGUFs are the `qwen-coder` extra's parts, joined into a temporary folder.
Servers run one at a time (load timed until /v1/models answers); each streams the same greedy
chat requests in turn: everyday requests (one per category of everyday-heldout7), HumanEval-style
completions, and an edit request (a ~125-line module pasted with "rename one function, return the
whole file"). Rounds rotate the config order. Per config and workload: seconds, completion tokens,
tokens/s, median first token; per config: load seconds and peak RSS (VmHWM); and which answers
are identical to the 1.5B alone's on the same program. With --clients, each config then serves
that many streaming clients at once (each its own everyday or HumanEval-style request, 64
tokens; llama-server started with `-np 8 --kv-unified` slots, ours batching up to 8 answers as it does by
default): the tokens all clients got over the wall time, first request to last answer.

With --cold-start N it measures start-up instead, N rounds in turns (and a round 0 not counted):
`llama-server` with the 1.5B from start until the first streamed token of one request (/health
polled every 50 ms, then max_tokens 1), and `mlxswitch chat -p` with the pair, one process per
checkout in --trees (NAME=PATH, each run with PYTHONPATH=PATH; default: this one), from start until
the first byte of its answer on stdout, and until it exits.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from bench_serve import free_port, start, stop

HERE = Path(__file__).parent
SMALL, LARGE = "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"
PAIR_PROFILE = "qwen2.5-coder-0.5b-1.5b"
CONFIGS = ("llama-1.5b", "llama-ngram", "llama-draft", "ours-1.5b", "ours-pair")
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


def workloads() -> dict[str, list[str]]:
    """Workload name → prompts."""
    everyday, seen = [], set()
    for line in (HERE / "prompts" / "everyday-heldout7.jsonl").read_text().splitlines():
        item = json.loads(line)
        if item["category"] not in seen:
            seen.add(item["category"])
            everyday.append(item["prompt"])
    humaneval = [f"Complete this Python function.\n\n```python\n{p}```" for p in HUMANEVAL_STYLE]
    return {"everyday": everyday, "humaneval": humaneval, "edit": [edit_request()]}


def ask(base: str, model: str, prompt: str, tokens: int) -> dict:
    """Stream one greedy answer: first token seconds, completion tokens, seconds, text."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, text, usage = time.perf_counter(), None, [], None
    with httpx.stream(
        "POST", f"{base}/v1/chat/completions", json=body, timeout=httpx.Timeout(60, read=None)
    ) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = json.loads(payload)
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    first = first or time.perf_counter()
                    text.append(piece)
    done = time.perf_counter()
    return {
        "first_s": (first or done) - started,
        "tokens": usage["completion_tokens"] if usage else len(text),
        "seconds": done - started,
        "text": "".join(text),
    }


def concurrent(base: str, model: str, prompts: list[str], tokens: int) -> dict:
    """Every prompt streamed at once, one client each: the wall time from the first request to
    the last answer, and the tokens they all got."""
    answers: list[dict] = [{} for _ in prompts]

    def one(i: int) -> None:
        answers[i] = ask(base, model, prompts[i], tokens)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    return {"clients": len(prompts), "seconds": seconds, "tokens": sum(a.get("tokens", 0) for a in answers)}


def wait_ready(base: str, process: subprocess.Popen, limit_s: float = 600) -> None:
    """Until the server has its model loaded: llama-server answers /v1/models while it still
    loads (503 on requests), so /health must say 200; a server without /health is ready. One
    error line where the server exits first (a llama.cpp built for another CPU dies of SIGILL)."""
    deadline = time.perf_counter() + limit_s
    while time.perf_counter() < deadline:
        code = process.poll()
        if code is not None:
            how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
            sys.exit(f"error: the server at {base} exited ({how}) before it loaded its model")
        try:
            status = httpx.get(f"{base}/health", timeout=5).status_code
        except httpx.HTTPError:
            status = 503
        if status != 503:
            return
        time.sleep(0.2)
    sys.exit(f"error: {base} did not load its model in {limit_s:.0f} s")


def peak_rss_gb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in GB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024 / 1e9
    return float("nan")


def command(
    config: str, ggufs: dict[str, Path], llama: Path | None, port: int, parallel: bool = False
) -> list[str] | None:
    """The server command of a config (None: llama.cpp absent)."""
    if config.startswith("llama"):
        if llama is None:
            return None
        base = [str(llama / "llama-server"), "-m", str(ggufs[LARGE]), "-t", "2", "-c", "4096"]
        base += ["--port", str(port)]
        if parallel:  # 8 slots for concurrent clients sharing one 4096-token KV pool (as one had)
            base += ["-np", "8", "--kv-unified"]
        if config == "llama-ngram":
            base += ["--spec-type", "ngram-mod"]
        if config == "llama-draft":
            base += ["-md", str(ggufs[SMALL]), "--spec-type", "draft-simple", "--spec-draft-n-max", "3"]
        return base
    served = ["--model", f"package:{LARGE}"] if config == "ours-1.5b" else ["--profile", PAIR_PROFILE]
    return [
        sys.executable,
        "-m",
        "mlxswitch",
        "serve",
        *served,
        "--port",
        str(port),
        "--log-level",
        "warning",
    ]


def join_ggufs(folder: Path) -> dict[str, Path]:
    """The pair's GGUFs, joined from the installed wheel parts (checked by size and sha256)."""
    from mlxswitch.models.packaged import CATALOGUE, join_parts

    return {name: join_parts(CATALOGUE[name], folder / f"{name}.gguf") for name in (SMALL, LARGE)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-bin", type=Path, default=None, help="folder holding llama-server")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128, help="max tokens (the edit request: 3×)")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    parser.add_argument("--clients", default="", help="concurrent client counts, e.g. 4,8 (none: skip)")
    parser.add_argument(
        "--workloads", default="everyday,humaneval,edit", help="one client's workloads ('' for none)"
    )
    parser.add_argument("--cold-start", type=int, default=0, help="rounds of start-up instead (see above)")
    parser.add_argument("--trees", default=f"ours={HERE.parent}", help="--cold-start's checkouts: N=PATH,…")
    args = parser.parse_args()
    found = shutil.which("llama-server")
    llama = args.llama_bin or (Path(found).parent if found else None)
    if llama is not None and not (llama / "llama-server").exists():
        sys.exit(f"error: no llama-server in {llama}")
    if llama is None:
        print("llama.cpp: no llama-server on PATH or --llama-bin; its configs are skipped")
    env = {**os.environ, "LD_LIBRARY_PATH": f"{llama}:{os.environ.get('LD_LIBRARY_PATH', '')}"}
    configs = [c for c in args.configs.split(",") if llama is not None or not c.startswith("llama")]
    every = workloads()
    unknown = sorted(set(filter(None, args.workloads.split(","))) - set(every))
    if unknown:
        sys.exit(f"error: unknown workload {', '.join(unknown)} (known: {', '.join(every)})")
    work = {name: every[name] for name in args.workloads.split(",") if name}
    levels = [int(n) for n in args.clients.split(",") if n.strip()]
    results: dict[str, dict] = {
        c: {"load_s": [], "rss_gb": [], "runs": {w: [] for w in work}, "clients": {}} for c in configs
    }
    with tempfile.TemporaryDirectory(prefix="mlxswitch-peer-") as tmp:
        ggufs = join_ggufs(Path(tmp))
        if args.cold_start:
            trees = dict(tree.split("=", 1) for tree in args.trees.split(","))
            return cold_start(args.cold_start, trees, ggufs[LARGE], llama, env)
        for round_index in range(args.rounds):
            order = configs[round_index % len(configs) :] + configs[: round_index % len(configs)]
            for config in order:
                port = free_port()
                started = time.perf_counter()
                server_command = command(config, ggufs, llama, port, parallel=bool(levels)) or []
                server = start(config, server_command, port, Path(tmp), env)
                wait_ready(server[2], server[1])
                results[config]["load_s"].append(time.perf_counter() - started)
                # the name the server itself lists (llama-server answers any; ours its profile's)
                model = httpx.get(f"{server[2]}/v1/models", timeout=30).json()["data"][0]["id"]
                for name, prompts in work.items():
                    tokens = args.tokens * (3 if name == "edit" else 1)
                    for prompt in prompts:
                        results[config]["runs"][name].append(ask(server[2], model, prompt, tokens))
                for level in levels:
                    prompts = (every["everyday"] + every["humaneval"]) * level
                    together = concurrent(server[2], model, prompts[:level], 64)
                    results[config]["clients"].setdefault(str(level), []).append(together)
                results[config]["rss_gb"].append(peak_rss_gb(server[1].pid))
                stop([server])
                print(f"round {round_index + 1}: {config} done", file=sys.stderr)
                if args.json:  # kept as it grows: a later failure loses nothing measured
                    args.json.write_text(json.dumps(results, indent=1))
    report(results, work)


COLD_PROMPT = "Write hello world in Python."


def cold_start(rounds: int, trees: dict[str, str], gguf: Path, llama: Path | None, env: dict) -> None:
    """Start-up in turns (the module's docstring): one line a run, then the medians of rounds 1..N."""
    times: dict[str, list[float]] = {}
    for round_index in range(rounds + 1):
        for name, tree in trees.items():
            first, done, text = _ours_cold(tree)
            print(f"{round_index} {name} first {first:.3f} exit {done:.3f} {text!r}", flush=True)
            if round_index:
                times.setdefault(f"{name} first", []).append(first)
                times.setdefault(f"{name} exit", []).append(done)
        if llama is not None:
            first, text = _llama_cold(llama, gguf, env)
            print(f"{round_index} llama first {first:.3f} {text!r}", flush=True)
            if round_index:
                times.setdefault("llama first", []).append(first)
    medians = {key: statistics.median(values) for key, values in times.items()}
    llama_s = medians.get("llama first")
    for key, median in medians.items():
        ratio = f" ({median / llama_s:.2f}x llama.cpp's)" if llama_s and not key.startswith("llama") else ""
        print(f"median {key}: {median:.2f} s{ratio}")


def _ours_cold(tree: str) -> tuple[float, float, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    command = [sys.executable, "-m", "mlxswitch", "chat", "-p", COLD_PROMPT, "--profile", PAIR_PROFILE]
    started = time.perf_counter()
    process = subprocess.Popen(
        [*command, "--max-tokens", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**env, "PYTHONPATH": tree},
        cwd=tempfile.gettempdir(),  # not a checkout: PYTHONPATH alone says which code runs
    )
    assert process.stdout is not None
    head = process.stdout.read(1)
    first = time.perf_counter() - started
    rest = process.stdout.read()
    process.wait()
    return first, time.perf_counter() - started, (head + rest).decode().strip()


def _llama_cold(llama: Path, gguf: Path, env: dict) -> tuple[float, str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    server = [str(llama / "llama-server"), "-m", str(gguf), "-t", "2", "-c", "4096", "--port", str(port)]
    started = time.perf_counter()
    process = subprocess.Popen(server, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                if process.poll() is not None:
                    sys.exit(f"error: llama-server exited (code {process.returncode}) before it loaded")
            time.sleep(0.05)
        asked = time.perf_counter() - started
        answer = ask(base, "any", COLD_PROMPT, 1)
        return asked + answer["first_s"], answer["text"]
    finally:
        process.terminate()
        process.wait(30)


def report(results: dict[str, dict], work: dict[str, list[str]]) -> None:
    """One table per workload, then load and memory per config."""
    base = {"llama": "llama-1.5b", "ours": "ours-1.5b"}
    for name in work:
        print(f"\n## {name}")
        print(f"{'config':<13}{'s':>8}{'tokens':>8}{'tok/s':>8}{'first s':>9}{'same as its 1.5B':>18}")
        for config, data in results.items():
            runs = data["runs"][name]
            seconds = sum(r["seconds"] for r in runs)
            tokens = sum(r["tokens"] for r in runs)
            reference = results.get(base[config.split("-")[0]], {}).get("runs", {}).get(name, [])
            same = sum(a["text"] == b["text"] for a, b in zip(runs, reference, strict=False))
            print(
                f"{config:<13}{seconds:8.1f}{tokens:8d}{tokens / seconds:8.2f}"
                f"{statistics.median(r['first_s'] for r in runs):9.2f}{f'{same}/{len(runs)}':>18}"
            )
    levels = sorted({int(n) for data in results.values() for n in data.get("clients", {})})
    if levels:
        print("\n## concurrent clients (64 tokens each): tokens/s all clients got together")
        print(f"{'config':<13}" + "".join(f"{f'{n} clients':>12}" for n in levels))
        for config, data in results.items():
            cells = []
            for n in levels:
                runs = data.get("clients", {}).get(str(n), [])
                seconds = sum(r["seconds"] for r in runs)
                cells.append(f"{sum(r['tokens'] for r in runs) / seconds if runs else float('nan'):12.2f}")
            print(f"{config:<13}" + "".join(cells))
    print(f"\n{'config':<13}{'load s':>8}{'peak RSS GB':>13}")
    for config, data in results.items():
        print(f"{config:<13}{statistics.median(data['load_s']):8.1f}{max(data['rss_gb']):13.2f}")
    if "everyday" in work:
        readme_table(results)


# The README's rows (tests/test_readme.py checks them against the --json record).
README_ROWS = {
    "llama-1.5b": "llama.cpp, 1.5B alone",
    "llama-draft": "llama.cpp, 0.5B as draft",
    "ours-1.5b": "mlxswitch, 1.5B alone",
    "ours-pair": "mlxswitch, the pair as shipped",
}


def readme_table(results: dict[str, dict]) -> None:
    """The everyday workload as the README's table shows it."""
    print("\n## the README's table (everyday)")
    print("| program, config | seconds | tokens/s | answers = its 1.5B's | load | peak RSS |")
    print("|---|---|---|---|---|---|")
    for config, label in README_ROWS.items():
        if config not in results:
            continue
        runs = results[config]["runs"]["everyday"]
        seconds, tokens = sum(r["seconds"] for r in runs), sum(r["tokens"] for r in runs)
        base = "llama-1.5b" if config.startswith("llama") else "ours-1.5b"
        alone = results.get(base, {}).get("runs", {}).get("everyday", [])
        kept = sum(a["text"] == b["text"] for a, b in zip(runs, alone, strict=False))
        same = "–" if config == base else f"{kept}/{len(runs)}"
        load, rss = statistics.median(results[config]["load_s"]), max(results[config]["rss_gb"])
        print(f"| {label} | {seconds:.1f} | {tokens / seconds:.1f} | {same} | {load:.1f} s | {rss:.2f} GB |")


if __name__ == "__main__":
    main()
