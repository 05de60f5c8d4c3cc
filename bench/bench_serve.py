"""`mlxswitch serve` against `mlx_lm.server` on the same model: time to first byte and tokens/s.

    uv run python bench/bench_serve.py [--tokens 32] [--rounds 2] [--clients 1,2,4,8]
                                       [--profiles embedded-plain,embedded] [--baseline DIR]

The embedded SmolLM2 GGUF is loaded once and saved as an mlx-lm directory (same weights) for
mlx_lm.server; mlxswitch serves it as each of --profiles (`embedded-plain`: one tier, the same
model, mlx-lm's batch; `embedded`: the geared default, packed passes). With --pair, the Qwen
pair's profile against mlx_lm.server with --draft-model. All servers
run at once on loopback; each round visits them in turn (the order rotates), and for each,
every --clients level streams the same chat prompt with greedy
decoding at the same moment. Per level: median time to first byte (first SSE chunk), and the
tokens/s the clients got together (all completion tokens / wall time from first request to last).
With --baseline DIR (a `git worktree` of another commit), that checkout's `mlxswitch serve` runs
each profile in the same rounds too: a before-and-after measured side by side.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from mlxswitch.bench.servers import Server, free_port

PAIR = ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct")  # packaged GGUFs: small, large
PAIR_PROFILE = "qwen2.5-coder-0.5b-1.5b"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def save_mlx_dir(spec: str, out: Path) -> Path:
    """A model we load (the embedded or a packaged GGUF) as an mlx-lm directory, same weights
    (mlx_lm.server reads nothing else)."""
    from mlx_lm.utils import save_config, save_model

    from mlxswitch.models.sources import load_model

    loaded = load_model(spec)
    save_model(out, loaded.model)
    config = {k: v for k, v in loaded.config.items() if k not in ("gguf_file_type", "quantization_label")}
    save_config(config, out / "config.json")
    loaded.tokenizer.save_pretrained(str(out))
    return out


_REQUESTS = iter(range(1, 1 << 30))


def one_client(base: str, model: str, tokens: int, out: list) -> None:
    """Stream one greedy chat answer; record (time to first byte, completion tokens, end time).
    Each request's prompt is numbered: no server answers it from a kept cache of another's."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": f"Request {next(_REQUESTS)}. {PROMPT}"}],
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started, first, count, usage = time.perf_counter(), None, 0, None
    # No read deadline a server without batching can reach: a level ends only when every answer
    # has, so no server is still decoding an abandoned request while the next one is timed.
    timeout = httpx.Timeout(60, read=None)
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=timeout) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data:"):
                continue
            first = first or time.perf_counter()
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            chunk = httpx.Response(200, content=payload).json()
            usage = chunk.get("usage") or usage
            count += sum(1 for c in chunk.get("choices", []) if (c.get("delta") or {}).get("content"))
    done = time.perf_counter()
    out.append((first - started, usage["completion_tokens"] if usage else count, done))


def level(base: str, model: str, clients: int, tokens: int) -> dict:
    """`clients` streams at once: median time to first byte and their tokens/s together."""
    results: list = []
    threads = [
        threading.Thread(target=one_client, args=(base, model, tokens, results)) for _ in range(clients)
    ]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = max(r[2] for r in results) - started
    return {
        "ttfb_s": statistics.median(r[0] for r in results),
        "tokens": sum(r[1] for r in results),
        "tok_per_s": sum(r[1] for r in results) / wall,
    }


def main() -> None:
    """Start the servers, run the alternating rounds, print one table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", default="1,2,4,8")
    parser.add_argument("--profiles", default="embedded-plain,embedded", help="mlxswitch profiles to serve")
    parser.add_argument(
        "--pair",
        action="store_true",
        help="the Qwen pair: mlx_lm.server with --draft-model against --profiles (default: the pair's)",
    )
    parser.add_argument(
        "--baseline",
        help="a checkout of another commit (git worktree add): its `mlxswitch serve` of each profile "
        "runs in the same rounds, named mlxswitch@<its commit>, for a before-and-after on this machine",
    )
    parser.add_argument(
        "--no-mlx-lm",
        action="store_true",
        help="serve mlxswitch only (more rounds of it where mlx_lm.server has been measured: on the "
        "pair one round of mlx_lm.server takes ~40 minutes here)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.clients.split(",")]
    if args.pair and args.profiles == parser.get_default("profiles"):
        args.profiles = PAIR_PROFILE
    profiles = [p for p in args.profiles.split(",") if p]

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        servers: list[tuple[str, Server]] = []
        models: dict[str, str] = {}
        if not args.no_mlx_lm:
            port = free_port()
            if args.pair:  # mlx_lm.server turns batching off when a draft model is loaded
                model_dir = save_mlx_dir(f"package:{PAIR[1]}", tmp / "large-mlx")
                extra = ["--draft-model", str(save_mlx_dir(f"package:{PAIR[0]}", tmp / "small-mlx"))]
            else:
                model_dir, extra = save_mlx_dir("embedded", tmp / "smollm2-mlx"), []
            mlx_lm = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir), "--port", str(port)]
            command = [*mlx_lm, *extra, "--log-level", "WARNING"]
            servers.append(("mlx_lm.server", Server(command, tmp / "mlx_lm.server.log", dict(os.environ))))
            models["mlx_lm.server"] = str(model_dir)
        env_home = tmp / "home"
        env_home.mkdir()
        os.environ["MLXSWITCH_HOME"] = str(env_home)
        variants: list[tuple[str, dict[str, str] | None]] = [("mlxswitch", None)]
        if args.baseline:
            rev = subprocess.run(
                ["git", "-C", args.baseline, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            variants.append((f"mlxswitch@{rev}", {**os.environ, "PYTHONPATH": str(Path(args.baseline))}))
        runs = [(label, env, profile) for profile in profiles for label, env in variants]
        ports = [free_port() for _ in runs]
        for (label, env, profile), port in zip(runs, ports, strict=True):
            name = f"{label} {profile}"
            command = [sys.executable, "-m", "mlxswitch", "serve", "--profile", profile, "--port", str(port)]
            log = tmp / f"{name}.log"
            servers.append((name, Server([*command, "--log-level", "warning"], log, env or dict(os.environ))))
            models[name] = profile
        try:
            for name, server in servers:  # loaded, then a warm-up: the first request pays one-time costs
                server.wait_ready()
                level(server.base, models[name], 1, 4)
            rows: dict = {}
            for r in range(args.rounds):
                order = servers[r % len(servers) :] + servers[: r % len(servers)]
                for name, server in order:
                    for clients in levels:
                        rows.setdefault((name, clients), []).append(
                            level(server.base, models[name], clients, args.tokens)
                        )
        finally:
            for _, server in servers:
                server.stop()
    print(
        f"{args.tokens} tokens per answer, greedy, {args.rounds} rounds (server order rotating), "
        f"median over rounds; ttfb = time to the first SSE chunk"
    )
    print(f"{'server':<28} {'clients':>7} {'ttfb s':>8} {'tok/s (all clients)':>20} {'tokens':>7}")
    for (name, clients), runs in rows.items():
        print(
            f"{name:<28} {clients:>7} {statistics.median(x['ttfb_s'] for x in runs):>8.2f} "
            f"{statistics.median(x['tok_per_s'] for x in runs):>20.2f} "
            f"{statistics.median(x['tokens'] for x in runs):>7.0f}"
        )
    if 1 in levels and max(levels) > 1:
        print("\nagainst 1 client, per server (medians): first byte ×, tokens/s together ×")
        for name in models:
            one_ttfb = statistics.median(x["ttfb_s"] for x in rows[(name, 1)])
            one_rate = statistics.median(x["tok_per_s"] for x in rows[(name, 1)])
            for clients in (c for c in levels if c > 1):
                many = rows[(name, clients)]
                ttfb = statistics.median(x["ttfb_s"] for x in many) / one_ttfb
                rate = statistics.median(x["tok_per_s"] for x in many) / one_rate
                print(f"{name:<28} {clients:>2} clients: first byte {ttfb:5.2f}×   tokens/s {rate:5.2f}×")


if __name__ == "__main__":
    main()
