"""Two chat clients taking turns on one `mlxswitch serve`: what keeping their caches saves.

    uv run python bench/bench_prompt_cache.py [--profile embedded-plain] [--turns 2] [--rounds 2]

Two servers of the same profile run at once on loopback, one with `--prompt-cache-size 0` (one
held sequence: a client coming back after the other prefills its history again) and one with the
default 4. Each round visits them in turn (the order rotates); on each, clients A and B alternate
A1, B1, A2, B2, … with a long first message each, every turn resending the history. A turn asks
for one token (greedy), so its latency is the time to the first token: mostly prefill. Printed
per server, over the turns after the first: median latency, prompt tokens and tokens reused.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from mlxswitch.bench.servers import Server, free_port

OPENINGS = {
    "A": "Here are my notes on the history of lighthouses, one line per fact. "
    + " ".join(
        f"Fact {i}: the lamp of lighthouse {i} was lit in {1800 + i} and kept by one family."
        for i in range(12)
    )
    + " Summarise them.",
    "B": "Here is a list of recipes I keep, one per line. "
    + " ".join(
        f"Recipe {i}: {i} eggs, {2 * i} grams of flour, a pinch of salt, baked for {10 + i} minutes."
        for i in range(12)
    )
    + " Which one is quickest?",
}


def turn(base: str, model: str, messages: list[dict]) -> dict:
    """One greedy one-token answer: its latency, prompt tokens and the tokens the caches reused."""
    body = {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0}
    started = time.perf_counter()
    response = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=600)
    response.raise_for_status()
    answer = response.json()
    return {
        "latency_s": time.perf_counter() - started,
        "prompt_tokens": answer["usage"]["prompt_tokens"],
        "reused": answer["mlxswitch"]["usage"]["prompt_tokens_reused"],
        "text": answer["choices"][0]["message"]["content"],
    }


def conversation_round(base: str, model: str, turns: int) -> list[dict]:
    """A and B alternate for `turns` turns each; the records of every turn after each first one."""
    history = {name: [] for name in OPENINGS}
    later = []
    for t in range(turns):
        for name, opening in OPENINGS.items():
            question = opening if t == 0 else f"Tell me more about point {t}."
            history[name].append({"role": "user", "content": question})
            record = turn(base, model, history[name])
            print(f"{base} {name}{t + 1}: {record['latency_s']:.1f} s", file=sys.stderr, flush=True)
            history[name].append({"role": "assistant", "content": record["text"]})
            if t > 0:
                later.append(record)
    return later


def main() -> None:
    """Start the two servers, run the alternating rounds, print one table."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="embedded-plain")
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "home").mkdir()
        os.environ["MLXSWITCH_HOME"] = str(tmp / "home")
        servers = []
        for size in (0, 4):
            port = free_port()
            command = [
                sys.executable,
                "-m",
                "mlxswitch",
                "serve",
                "--profile",
                args.profile,
                "--port",
                str(port),
            ]
            command += ["--prompt-cache-size", str(size), "--log-level", "warning"]
            server = Server(command, tmp / f"{size}.log", dict(os.environ))
            servers.append((f"--prompt-cache-size {size}", server))
        try:
            for _, server in servers:  # loaded, then a warm-up: the first request pays one-time costs
                server.wait_ready()
                turn(server.base, args.profile, [{"role": "user", "content": "Hi"}])
            rows: dict = {}
            for r in range(args.rounds):
                for name, server in servers[r % 2 :] + servers[: r % 2]:
                    answered = conversation_round(server.base, args.profile, args.turns)
                    rows.setdefault(name, []).extend(answered)
        finally:
            for _, server in servers:
                server.stop()
    print(
        f"profile {args.profile}: clients A and B alternating, {args.turns} turns each, {args.rounds} rounds "
        "(server order rotating); turns after each client's first, one greedy token each"
    )
    print(f"{'server':<24} {'turns':>5} {'latency s':>10} {'prompt tokens':>14} {'reused':>7}")
    for name, records in rows.items():
        print(
            f"{name:<24} {len(records):>5} {statistics.median(x['latency_s'] for x in records):>10.2f} "
            f"{statistics.median(x['prompt_tokens'] for x in records):>14.0f} "
            f"{statistics.median(x['reused'] for x in records):>7.0f}"
        )


if __name__ == "__main__":
    main()
