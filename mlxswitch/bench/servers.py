"""OpenAI-compatible servers on loopback, for the bench: a free port, a server process with its log
(ready when `/health` says 200: llama-server, mlx_lm.server and `mlxswitch serve` all answer it),
one streamed greedy answer, and several clients at once.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

from ..errors import UsageError


def free_port() -> int:
    """A loopback port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One server process on loopback, its output in a log file."""

    def __init__(self, command: list[str], log: Path, env: dict[str, str]):
        self.port = int(command[command.index("--port") + 1])
        self.base = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "wb") as sink:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, limit_s: float = 600, poll_s: float = 0.05) -> None:
        """Until the model is loaded: /health says 200 (llama-server answers 503 while it loads).
        A UsageError with the log's tail where the server exits first (a llama.cpp built for
        another CPU dies of SIGILL)."""
        import httpx

        deadline = time.perf_counter() + limit_s
        while time.perf_counter() < deadline:
            code = self.process.poll()
            if code is not None:
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"code {code}"
                tail = self.log.read_text(errors="replace").strip().splitlines()[-1:] or ["no output"]
                raise UsageError(f"the server at {self.base} exited ({how}) before it loaded: {tail[0]}")
            try:
                if httpx.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        raise UsageError(f"the server at {self.base} did not load its model in {limit_s:.0f} s")

    def model_name(self) -> str:
        """The model the server lists first (llama-server answers any name; ours its profile's)."""
        import httpx

        return str(httpx.get(f"{self.base}/v1/models", timeout=30).json()["data"][0]["id"])

    def peak_rss_gb(self) -> float:
        """The process's peak resident memory (VmHWM), in GB (nan where /proc has none)."""
        try:
            for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
        except OSError:
            pass
        return float("nan")

    def stop(self) -> None:
        """End the process and wait for it."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def ask(base: str, model: str, prompt: str, tokens: int) -> dict:
    """Stream one greedy answer: first token seconds, completion tokens, seconds, text."""
    import httpx

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
