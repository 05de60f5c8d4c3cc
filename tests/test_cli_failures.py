"""The CLI under bad input, pipes and habits: one `error:` line and the right exit code for every
failure, the other prompts still answered, nothing half-written, streaming pipes."""

from __future__ import annotations

import json
import select
import subprocess
import sys

import pytest
from cli_helpers import invoke, one_error_line

from mlxswitch.routing.router import RouterConfig, derive_tiers


def _cli(args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mlxswitch", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        **kwargs,
    )


# -- input that cannot be a prompt --------------------------------------------------------------


def test_non_utf8_line_is_refused_and_the_others_are_answered(pair_args):
    result = invoke(
        ["chat", *pair_args, "--json", "--max-tokens", "4"], b"Say hi.\n\xff\xfe\nName a colour.\n"
    )
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "error: input line 2 is not UTF-8 text (byte 0xff at offset 0); it was skipped"
    )
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r.get("prompt") for r in records] == ["Say hi.", None, "Name a colour."]
    assert records[1] == {
        "prompt": None,
        "line": 2,
        "exit_code": 2,
        "error": "input line 2 is not UTF-8 text (byte 0xff at offset 0); it was skipped",
    }


def test_an_undecodable_typed_line_is_refused_not_fatal():
    from mlxswitch.cli.streams import typed_line_problem

    # What input() hands over for bytes ff fe on a UTF-8 terminal: surrogate escapes.
    typed = b"\xff\xfe".decode("utf-8", errors="surrogateescape")
    assert typed_line_problem(typed) == "the line is not UTF-8 text (byte 0xff); type it again"
    assert typed_line_problem("naïve café") is None


def test_a_failed_prompt_leaves_plain_output_clean(pair_args):
    big = "Say hi.\n" + "word " * 40_000 + "\nName a colour.\n"
    plain = invoke(["chat", *pair_args, "--max-tokens", "5", "--tau", "inf"], big)
    answers = invoke(["chat", *pair_args, "--json", "--max-tokens", "5", "--tau", "inf"], big)
    assert plain.exit_code == answers.exit_code == 7
    assert one_error_line(plain).startswith("error: the prompt is ")
    texts = [
        json.loads(line)["text"] for line in answers.stdout.splitlines() if "error" not in json.loads(line)
    ]
    # The first answer is not printed again: two answers, one blank line between them.
    assert plain.stdout == texts[0] + "\n\n" + texts[1] + "\n"


# -- flags: refused before anything loads, one line each --------------------------------------


@pytest.mark.parametrize(
    "args,code,line",
    [
        (["--min-p", "1.5", "--temp", "0.7"], 2, "error: --min-p must be in [0, 1] (got 1.5)"),
        (["--top-k", "-1"], 2, "error: --top-k must be ≥ 0 (got -1; 0 keeps every token)"),
        (["--max-kv-size", "0"], 2, "error: --max-kv-size must be at least 1 token (got 0)"),
        (["--window", "0"], 2, "error: the window must be at least 1 token (got 0)"),
        (
            ["--normalize", "--tau", "2"],
            2,
            "error: with normalize, thresholds are fractions of log2(V), between 0 and 1; got 2, 1.2",
        ),
        (
            ["--draft-model", "x", "--gears", "4,8"],
            2,
            "error: --draft-model goes with --model (the large model) and nothing "
            "else: it is mlx-lm's spelling of --small/--large",
        ),
        (
            ["--max-tokens", "x"],
            2,
            "error: Invalid value for '--max-tokens': Input should be a valid "
            "integer, unable to parse string as an integer (see 'root chat --help')",
        ),
        (["--no-such-flag"], 2, "error: No such option: --no-such-flag"),
    ],
)
def test_flag_errors_are_one_line_and_win_over_a_missing_model(args, code, line):
    # --model names nothing that exists: were the model looked at first, exit code 4 would win.
    result = invoke(["chat", "--model", "./no-such-model", *args], "hi\n")
    assert result.exit_code == code
    assert one_error_line(result).startswith(line)
    assert result.stdout == ""


def test_one_boundary_ladder_refuses_two_thresholds_before_loading(pair_args):
    result = invoke(["chat", "--small", "./missing-a", "--large", "./missing-b", "--tau", "1,2"], "hi\n")
    assert result.exit_code == 2
    assert one_error_line(result) == "error: 2 tiers need 1 up threshold(s), got 2"


def test_unwritable_telemetry_path_fails_before_loading(tmp_path):
    result = invoke(["chat", "--model", "./no-such-model", "--telemetry", "/no/such/dir/x.jsonl"], "hi\n")
    assert result.exit_code == 9
    assert one_error_line(result) == (
        "error: --telemetry /no/such/dir/x.jsonl: cannot write there (No such file or directory)"
    )


# -- telemetry: atomic, self-contained -----------------------------------------------------------


def test_telemetry_alone_rederives_every_tier(pair_args, tmp_path):
    path = tmp_path / "out" / "run.jsonl"
    path.parent.mkdir()
    result = invoke(
        [
            "chat",
            *pair_args,
            "--max-tokens",
            "12",
            "--tau",
            "1.5",
            "--tau-down",
            "1.0",
            "--window",
            "3",
            "--min-run",
            "2",
            "--telemetry",
            str(path),
        ],
        "Hello there\nCount\n",
    )
    assert result.exit_code == 0
    assert [p.name for p in path.parent.iterdir()] == ["run.jsonl"]  # no temporary left behind
    records = [json.loads(line) for line in path.read_text().splitlines()]
    summaries = [r for r in records if "summary" in r]
    assert len(summaries) == 2
    switched = False
    for summary in summaries:
        router = summary["summary"]["router"]
        tokens = [r for r in records if r.get("answer") == summary["answer"] and "index" in r]
        config = RouterConfig(
            up=tuple(map(float, router["up"])),
            down=tuple(map(float, router["down"])),
            window=router["window"],
            min_run=router["min_run"],
            normalize=router["normalized"],
            vocab_size=router["vocab_size"],
        )
        tiers = derive_tiers(
            float(router["initial_entropy"]),
            [float(t["entropy"]) for t in tokens],
            config,
            len(router["tiers"]),
        )
        assert [router["tiers"][r] for r in tiers[: len(tokens)]] == [t["tier"] for t in tokens]
        switched |= len({t["tier"] for t in tokens}) > 1
    assert switched  # the re-derivation above is not vacuous


# -- pipes ---------------------------------------------------------------------------------------


def test_an_open_pipe_is_answered_line_by_line(pair_args):
    proc = _cli(["chat", *pair_args, "--json", "--max-tokens", "4"])
    try:
        proc.stdin.write(b"a\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "no answer while stdin stayed open"
        first = json.loads(proc.stdout.readline())
        assert first["prompt"] == "a"
        proc.stdin.write(b"b\n")
        proc.stdin.close()
        rest = [json.loads(line) for line in proc.stdout.read().splitlines()]
        assert [r["prompt"] for r in rest] == ["b"]
        assert proc.wait(60) == 0
    finally:
        proc.kill()


def test_the_process_ends_with_everything_it_wrote_and_its_code(pair_args, tmp_path):
    # main() ends the process without Python's teardown: what was buffered still arrives.
    telemetry = tmp_path / "tokens.jsonl"
    args = ["chat", *pair_args, "-p", "Hello", "--json", "--max-tokens", "6", "--telemetry", str(telemetry)]
    done = subprocess.run([sys.executable, "-m", "mlxswitch", *args], capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    (record,) = [json.loads(line) for line in done.stdout.splitlines()]
    tokens = [json.loads(line) for line in telemetry.read_text().splitlines()]
    assert record["prompt"] == "Hello" and record["text"]
    assert [t["index"] for t in tokens if "index" in t] == list(range(record["stats"]["generated"]))
    refused = subprocess.run(
        [sys.executable, "-m", "mlxswitch", "chat", "--top-k", "-1"], capture_output=True, timeout=120
    )
    assert refused.returncode == 2
    assert refused.stderr.decode().strip().splitlines() == [
        "error: --top-k must be ≥ 0 (got -1; 0 keeps every token)"
    ]


def test_a_reader_that_goes_away_ends_the_run_quietly(pair_args):
    reader = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlxswitch", "chat", *pair_args, "--max-tokens", "40", "--tau", "inf"],
        stdin=subprocess.PIPE,
        stdout=reader.stdin,
        stderr=subprocess.PIPE,
    )
    reader.stdin.close()
    _, err = proc.communicate(b"\n".join([b"one", b"two", b"three", b"four"] * 20) + b"\n", timeout=300)
    reader.wait(30)
    assert proc.returncode == 141
    # No traceback, no error line: only the status lines of what was answered before it noticed.
    assert b"Traceback" not in err and b"error:" not in err
    assert err.count(b"tokens") < 10  # it stopped instead of answering all 80 prompts


# -- gears build ---------------------------------------------------------------------------------


def test_gears_build_refuses_a_non_empty_out_without_force(tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    result = invoke(["gears", "build", "embedded", "--out", str(out)])
    assert result.exit_code == 2
    assert (
        one_error_line(result) == f"error: --out {out}: the directory is not empty; use --force to replace it"
    )
    assert (out / "notes.txt").read_text() == "mine"


def test_gears_build_into_a_file_path_is_one_line_before_loading(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    result = invoke(["gears", "build", "./no-such-model", "--out", str(blocker / "sub")])
    assert result.exit_code == 9
    assert one_error_line(result) == f"error: cannot write {blocker / 'sub'}: {blocker} is not a directory"


def test_a_failed_gears_build_leaves_nothing_behind(tiny_pair, tmp_path, monkeypatch):
    import errno

    from mlxswitch.models import gear_files

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(gear_files.mx, "save_safetensors", full_disk)
    out = tmp_path / "builds" / "geared"
    out.parent.mkdir()
    result = invoke(["gears", "build", str(tiny_pair[0]), "--out", str(out), "--group-size", "32"])
    assert result.exit_code == 9
    assert one_error_line(result) == f"error: cannot write {out}: No space left on device"
    assert list(out.parent.iterdir()) == []


# -- doctor --------------------------------------------------------------------------------------


def test_doctor_names_the_files_and_fails_when_the_default_cannot_load(tmp_path, monkeypatch):
    broken = tmp_path / "broken-pair.toml"
    broken.write_text(
        'default = "p"\n[profiles.p]\nmode = "pair"\nsmall = "./nope-a"\nlarge = "./nope-b"\nup = [1.0]\n'
    )
    monkeypatch.setenv("MLXSWITCH_MODELS", str(broken))
    result = invoke(["doctor"])
    assert result.exit_code == 1
    assert str(broken) in result.stdout
    # ./ in a models.toml is relative to that file.
    assert result.stdout.strip().splitlines()[-1] == (
        f"doctor: FAIL: the default profile cannot load (model '{tmp_path / 'nope-a'}': "
        "no such file or directory)"
    )


# -- habits of mlx-lm users ----------------------------------------------------------------------


def test_version_flag():
    result = invoke(["--version"])
    assert result.exit_code == 0 and result.stdout == "mlxswitch 0.1.0\n"


def test_prompt_flag_answers_one_prompt_and_ignores_stdin(pair_args):
    result = invoke(
        ["chat", *pair_args, "-p", "Hello", "--json", "--max-tokens", "3", "--system-prompt", "Be brief."],
        "ignored\n",
    )
    assert result.exit_code == 0
    records = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["prompt"] for r in records] == ["Hello"]


def test_draft_model_spells_a_pair(tiny_pair):
    small, large = tiny_pair
    spelled = invoke(
        [
            "chat",
            "--draft-model",
            str(small),
            "--model",
            str(large),
            "--json",
            "--max-tokens",
            "6",
            "--tau",
            "1.5",
        ],
        "Hello\n",
    )
    pair = invoke(
        ["chat", "--small", str(small), "--large", str(large), "--json", "--max-tokens", "6", "--tau", "1.5"],
        "Hello\n",
    )
    assert spelled.exit_code == pair.exit_code == 0
    a, b = json.loads(spelled.stdout), json.loads(pair.stdout)
    assert a["router"]["tiers"] == ["small", "large"] and a["tokens"] == b["tokens"]


def test_max_kv_size_keeps_a_rotating_cache(tiny_pair):
    # A llama: mlx-lm builds its cache with the model's own make_cache and would ignore the bound.
    import mlx.core as mx
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import RotatingKVCache

    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import single_model_ladder
    from mlxswitch.models.sources import load_model

    loaded = load_model(str(tiny_pair[0]))
    prompt = "Hello there, how are you today?"

    def answer(max_kv_size):
        session = ChatSession(
            single_model_ladder(loaded),
            RouterConfig(up=()),
            GenerationSettings(max_tokens=24, max_kv_size=max_kv_size),
        )
        return session, [e.id for e in session.ask(prompt).tokens]

    session, bounded = answer(16)
    cache = session.ladder.groups[0].cache
    assert all(isinstance(c, RotatingKVCache) and c.max_size == 16 and c.size() == 16 for c in cache)
    # The same tokens as mlx-lm's own greedy loop over the same rotating cache (its default keep=4) …
    ids = mx.array(session.render([{"role": "user", "content": prompt}]))
    reference = [RotatingKVCache(max_size=16, keep=4) for _ in loaded.model.layers]
    steps = generate_step(ids, loaded.model, prompt_cache=reference, max_tokens=len(bounded))
    assert bounded == [int(token) for token, _ in steps]
    # … and not those of an unbounded cache: the bound is not a no-op.
    assert bounded != answer(None)[1]


def test_max_kv_size_on_a_switching_ladder_is_refused_before_loading():
    # The models do not exist: a check after loading would fail on them (exit 4) instead.
    result = invoke(
        ["chat", "--small", "/nonexistent/a", "--large", "/nonexistent/b", "--max-kv-size", "16"], "Hello\n"
    )
    assert result.exit_code == 2
    assert one_error_line(result) == (
        "error: --max-kv-size works with one tier only: switching between small and large trims the "
        "KV cache, which a rotating cache past its limit cannot do; use one model (--model M)"
    )


def test_a_rotating_cache_rebuilt_between_turns_says_so(tiny_pair):
    from mlxswitch.cli.ui import status_line
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import single_model_ladder
    from mlxswitch.models.sources import load_model

    session = ChatSession(
        single_model_ladder(load_model(str(tiny_pair[0]))),
        RouterConfig(up=()),
        GenerationSettings(max_tokens=20, max_kv_size=16),
    )
    first = session.ask("Hello there, how are you today?")
    assert first.refed_tokens == 0 and first.prefilled_tokens == first.prompt_tokens
    second = session.ask("Name a colour.")
    # Past its limit the cache cannot drop the previous answer's tail: the whole conversation is
    # fed again, and the figures and the status line say so.
    assert second.refed_tokens > 0 and second.prefilled_tokens == second.prompt_tokens
    assert second.stats()["refed_tokens"] == second.refed_tokens
    assert f"KV cache rebuilt: {second.refed_tokens} earlier tokens fed again" in status_line(second).plain


# -- zero-token answers --------------------------------------------------------------------------


def test_an_answer_ended_at_once_says_why_without_timings(tiny_pair):
    from mlxswitch.cli.ui import status_line
    from mlxswitch.decoding.session import ChatSession, GenerationSettings
    from mlxswitch.decoding.tiers import single_model_ladder
    from mlxswitch.models.sources import load_model

    loaded = load_model(str(tiny_pair[0]))
    session = ChatSession(single_model_ladder(loaded), RouterConfig(up=()), GenerationSettings(max_tokens=4))
    first = session.ask("Hello").tokens[0].id
    loaded.tokenizer.eos_token_ids = set(loaded.tokenizer.eos_token_ids) | {first}  # it now ends at once
    session.reset()
    empty = session.ask("Hello")
    assert (empty.generated, empty.finish_reason, empty.text) == (0, "stop", "")
    assert empty.stats()["first_token_s"] is None and empty.stats()["tok_per_s"] is None
    line = status_line(empty).plain
    assert line.startswith("0 tokens · the model ended its answer at once (end of sequence) · prompt ")
    assert "first token" not in line and "tok/s" not in line
