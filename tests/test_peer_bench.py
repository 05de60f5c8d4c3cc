"""`mlxswitch bench --suite peer` (mlxswitch/bench/peer.py, cli/peer.py): configs, workloads, the
record and its tables, beside a stand-in `llama-server` on loopback (a small script that speaks
llama-server's health, models and streaming chat endpoints and notes its command line) and our own
`serve` on the tiny pair; every flag error one line before anything starts."""

from __future__ import annotations

import json
import stat
import sys
import textwrap
from pathlib import Path

import pytest
from cli_helpers import invoke, one_error_line

FAKE_SERVER = textwrap.dedent(
    """\
    #!{python}
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    with open({calls!r}, "a") as calls:
        calls.write(json.dumps(argv) + "\\n")
    asked = {{"health": 0}}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _json(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health":
                asked["health"] += 1  # loading at the first ask, as llama-server says while it loads
                return self._json(503 if asked["health"] == 1 else 200, {{}})
            self._json(200, {{"data": [{{"id": "fake.gguf"}}]}})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if os.environ.get("FAKE_LLAMA_FAILS"):
                return self._json(500, {{"error": "out of memory"}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            count = body["max_tokens"]
            for i in range(count):
                chunk = {{"choices": [{{"delta": {{"content": f"t{{i}} "}}}}]}}
                self.wfile.write(f"data: {{json.dumps(chunk)}}\\n\\n".encode())
            usage = {{"choices": [], "usage": {{"completion_tokens": count}}}}
            self.wfile.write(f"data: {{json.dumps(usage)}}\\n\\ndata: [DONE]\\n\\n".encode())

    port = int(argv[argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
    """
)


@pytest.fixture
def fake_llama(tmp_path) -> tuple[Path, Path]:
    """A folder holding a stand-in llama-server, and the file its command lines go to."""
    folder, calls = tmp_path / "llama-bin", tmp_path / "calls.jsonl"
    folder.mkdir()
    server = folder / "llama-server"
    server.write_text(FAKE_SERVER.format(python=sys.executable, calls=str(calls)))
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return folder, calls


@pytest.fixture
def gguf_pair(tmp_path) -> list[str]:
    """--small/--large naming two .gguf files (read by the stand-in llama-server only: never loaded)."""
    small, large = tmp_path / "small.gguf", tmp_path / "large.gguf"
    small.write_bytes(b"GGUF small")
    large.write_bytes(b"GGUF large")
    return ["--small", str(small), "--large", str(large)]


def _llama_run(gguf_pair: list[str], folder: Path, arms: str, out: Path) -> list[str]:
    """`bench --suite peer` on the .gguf pair with the stand-in llama-server, its record to `out`."""
    return [
        "bench",
        "--suite",
        "peer",
        *gguf_pair,
        "--llama-bin",
        str(folder),
        "--arms",
        arms,
        "--json",
        str(out),
    ]


def test_llama_configs_run_each_workload_and_record_it(fake_llama, gguf_pair, tmp_path):
    folder, calls = fake_llama
    out = tmp_path / "peer.json"
    args = _llama_run(gguf_pair, folder, "llama-top,llama-draft", out)
    args += ["--workloads", "everyday,edit,cold-start", "--clients", "2", "--max-tokens", "3"]
    result = invoke(args)
    assert result.exit_code == 0, result.stderr
    record = json.loads(out.read_text())
    results = record["results"]
    assert set(results) == {"llama-top", "llama-draft"}
    for config in results:
        runs = results[config]["runs"]
        assert len(runs["everyday"]) == 5 and [r["tokens"] for r in runs["everyday"]] == [3] * 5
        assert [r["tokens"] for r in runs["edit"]] == [9]  # the edit's budget: 3×
        assert len(runs["cold-start"]) == 1 and runs["cold-start"][0]["text"] == "t0 "
        assert [c["tokens"] for c in results[config]["clients"]["2"]] == [2 * 64]
        assert len(results[config]["load_s"]) == 1
    everyday = {row["config"]: row for row in record["workloads"]["everyday"]}
    assert everyday["llama-draft"]["same_as_top"] == 5 and "same_as_top" not in everyday["llama-top"]
    commands = [json.loads(line) for line in calls.read_text().splitlines()]
    large, small = gguf_pair[3], gguf_pair[1]
    assert all(c[c.index("-m") + 1] == large for c in commands)
    served = [c for c in commands if "-np" in c]  # the cold starts' servers take no client slots
    assert len(served) == 2 and len(commands) == 6  # a cold start a config not counted, then one counted
    assert sum("-md" in c and c[c.index("-md") + 1] == small for c in commands) == 3
    assert "mlxswitch bench --suite peer · everyday" in result.stdout and "2 clients" in result.stdout


def test_our_configs_serve_the_profile_and_its_top_model(pair_args, tmp_path):
    out = tmp_path / "peer.json"
    args = ["bench", "--suite", "peer", *pair_args, "--arms", "ours-top,ours-profile"]
    result = invoke([*args, "--workloads", "humaneval", "--max-tokens", "3", "--json", str(out)])
    assert result.exit_code == 0, result.stderr
    assert "no llama-server" not in result.stderr  # none asked for
    record = json.loads(out.read_text())
    rows = {row["config"]: row for row in record["workloads"]["humaneval"]}
    assert rows["ours-top"]["answers"] == rows["ours-profile"]["answers"] == 3
    assert 0 <= rows["ours-profile"]["same_as_top"] <= 3
    assert all(record["loads"][c]["peak_rss_gb"] > 0 for c in rows)


@pytest.mark.parametrize(
    ("extra", "line"),
    [
        (
            ["--arms", "llama-top,nope"],
            "error: --arms: unknown nope (known: llama-top, llama-ngram, llama-draft, "
            "ours-top, ours-profile)",
        ),
        (
            ["--workloads", "poems"],
            "error: --workloads: unknown poems (known: everyday, humaneval, edit, cold-start)",
        ),
        (["--clients", "0"], "error: --clients must list counts of at least 1 (got '0')"),
        (["--workloads", ""], "error: --workloads '' leaves nothing to measure without --clients"),
        (["--records", "r.jsonl"], "error: --records does not apply to --suite peer"),
    ],
)
def test_peer_flag_errors_are_one_line(gguf_pair, extra, line):
    result = invoke(["bench", "--suite", "peer", *gguf_pair, *extra])
    assert result.exit_code == 2 and one_error_line(result) == line


def test_llama_needs_gguf_files_and_a_server(pair_args, fake_llama, tmp_path):
    folder, _ = fake_llama
    refused = invoke(
        ["bench", "--suite", "peer", *pair_args, "--llama-bin", str(folder), "--arms", "llama-top"]
    )
    assert refused.exit_code == 2
    assert "is not a GGUF file, which llama.cpp reads" in one_error_line(refused)
    missing = invoke(
        ["bench", "--suite", "peer", *pair_args, "--llama-bin", str(tmp_path), "--arms", "llama-top"]
    )
    assert one_error_line(missing) == f"error: --llama-bin {tmp_path}: no llama-server there"
    elsewhere = invoke(["bench", "--workloads", "edit"])
    assert one_error_line(elsewhere) == "error: --workloads applies to --suite peer only"
    arms = invoke(["bench", "--arms", "top"])  # the one table of which suite takes which flag
    assert one_error_line(arms) == "error: --arms applies to --suite humaneval, everyday or peer only"
    clients = invoke(["bench", "--suite", "humaneval", "--clients", "4"])
    assert one_error_line(clients) == "error: --clients does not apply to --suite humaneval"


def test_without_llama_server_its_configs_are_skipped_in_one_line(gguf_pair, monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = invoke(["bench", "--suite", "peer", *gguf_pair, "--arms", "llama-top,llama-ngram"])
    assert "llama.cpp: no llama-server on PATH or in --llama-bin; its configs are skipped" in result.stderr
    assert one_error_line(result) == "error: --arms: nothing left to run"


def test_a_server_that_fails_a_request_is_one_line_naming_its_config(
    fake_llama, gguf_pair, tmp_path, monkeypatch
):
    folder, _ = fake_llama
    args = _llama_run(gguf_pair, folder, "llama-top,llama-ngram", tmp_path / "peer.json")
    args += ["--workloads", "everyday", "--max-tokens", "2"]
    assert invoke(args).exit_code == 0
    monkeypatch.setenv("FAKE_LLAMA_FAILS", "1")
    failed = invoke(args)
    assert failed.exit_code == 2
    assert one_error_line(failed).startswith("error: llama-top: a request failed (Server error '500")
