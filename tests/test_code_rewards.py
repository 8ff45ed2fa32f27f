"""Code rewards: code extraction, the gameable code_block, unit_tests through the sandbox, and the
shipped problem set (loaded by the code task; every reference solution passes its own tests; a wrong
one does not)."""

from __future__ import annotations

import json

import pytest

from regimen.stages import sandbox
from regimen.stages.core.errors import InputError
from regimen.stages.rewards import code as code_rewards
from regimen.stages.rewards import get_reward, is_gameable, known_rewards
from regimen.stages.rewards.code import (
    UnitTestsReward,
    extract_code,
    has_code_block,
    humaneval_snippet,
    mbpp_snippets,
    unit_tests_reward,
)
from regimen.stages.tasks.code import PROBLEMS_PATH, load_code_problems

ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")


def fenced(code: str, lang: str = "python") -> str:
    return f"Here you go:\n```{lang}\n{code}```\nDone."


def test_extract_code_takes_the_last_python_block():
    text = "First try:\n```python\nx = 1\n```\nBetter:\n```python\nx = 2\n```\n"
    assert extract_code(text) == "x = 2\n"
    assert extract_code(fenced("y = 3\n", "py")) == "y = 3\n"
    assert extract_code(fenced("y = 4\n", "Python3")) == "y = 4\n"
    assert extract_code(fenced("y = 5\n", "")) == "y = 5\n"
    # another language's block is not code to run, ever (not even as a fallback)
    assert extract_code("```bash\nrm -rf /\n```") == ""
    assert extract_code("```python\nz = 1\n```\n```bash\nls\n```") == "z = 1\n"
    assert extract_code("def f():\n    return 1\n") == "def f():\n    return 1\n"
    # a truncated answer: the unclosed last block runs to the end
    assert extract_code("```python\na = 1\n```\nand\n```python\nb = 2\n") == "b = 2\n"
    # an indented fence (inside a list item) is dedented
    assert extract_code("1. code:\n   ```python\n   def f():\n       return 1\n   ```\n") == "def f():\n    return 1\n"


def test_code_block_is_gameable_on_purpose():
    fn = get_reward("code_block")
    assert is_gameable(fn)
    assert "GAMEABLE ON PURPOSE" in fn.__doc__
    chat = [{"role": "assistant", "content": fenced("return garbage\n")}]
    assert fn([], [fenced("nonsense(\n"), "no code here", chat, "```python\nunclosed"]) == [1.0, 0.0, 1.0, 0.0]
    assert has_code_block("```\nx\n```") and not has_code_block("```js\nx\n```")
    assert {"unit_tests", "code_block"} <= set(known_rewards())
    assert not is_gameable(get_reward("unit_tests"))


def test_test_format_helpers():
    snippet = humaneval_snippet("def check(candidate):\n    assert candidate(2) == 4\n", "double")
    assert snippet.endswith("check(double)\n")
    with pytest.raises(InputError):
        humaneval_snippet("def check(c): pass", "not valid!")
    assert mbpp_snippets(["assert f(1) == 2"], "x = 1", ["import math"]) == ["import math\nx = 1\nassert f(1) == 2"]
    assert mbpp_snippets(["assert f(1) == 2"]) == ["assert f(1) == 2"]
    assert code_rewards.row_tests(0, {"tests": ['["assert True", "assert 1"]']}) == ["assert True", "assert 1"]
    assert code_rewards.row_tests(0, {"tests": ["assert True"]}) == ["assert True"]
    assert code_rewards.row_tests(0, {"tests": [[]]}) is None
    assert code_rewards.row_tests(0, {"answer": ["4"]}) is None
    with pytest.raises(InputError, match="row 0"):
        code_rewards.row_tests(0, {"tests": [[1, 2]]})


@needs_isolation
def test_unit_tests_scores_exact_fractions():
    reward = get_reward("unit_tests")
    add = "def add(a, b):\n    return a + b if a else 99\n"
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 0) == 0"]
    completions = [
        fenced(add),  # 2 of 3
        [{"role": "assistant", "content": fenced("def add(a, b):\n    return a + b\n")}],  # chat, 3 of 3
        "def add(a, b):\n    return a - b\n",  # no fence: the whole text; only add(0, 0) passes, 1 of 3
        fenced("import sys\nsys.exit(0)\n"),  # early exit: 0
        "no tests for this row",
        "nor this one",
    ]
    scores = reward([""] * 6, completions, tests=[tests, tests, tests, tests, None, []])
    assert [None if s is None else round(s, 3) for s in scores] == [0.667, 1.0, 0.333, 0.0, None, None]


@needs_isolation
def test_unit_tests_reads_mbpp_and_humaneval_columns():
    reward = get_reward("unit_tests")
    mbpp = reward(
        [""], [fenced("def sq(x):\n    return x * x\n")], test_list=[["assert sq(3) == 9", "assert sq(-2) == 4"]]
    )
    assert mbpp == [1.0]
    check = "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
    he = reward(
        [""] * 2,
        [fenced("def sq(x):\n    return x * x\n"), fenced("def sq(x):\n    return x + x\n")],
        test=[check, check],
        entry_point=["sq", "sq"],
    )
    assert he == [1.0, 0.0]


def test_unit_tests_semantics_without_running_code(monkeypatch):
    """An infrastructure failure is None (logged), not 0; missing isolation is a clear InputError."""
    infra = sandbox.SandboxResult(passed=0, total=2, error="server died", status="infra")
    aborted = sandbox.SandboxResult(passed=0, total=2, error="timed out", status="aborted")
    monkeypatch.setattr(sandbox, "run_batch", lambda items, **kw: [infra, aborted][: len(items)])
    reward = unit_tests_reward()
    assert reward(["", ""], ["a", "b"], tests=[["assert 1", "assert 1"]] * 2) == [None, 0.0]

    def unavailable(items, **kw):
        raise sandbox.SandboxUnavailable(sandbox._unavailable_message("no namespaces here"))

    monkeypatch.setattr(sandbox, "run_batch", unavailable)
    with pytest.raises(InputError, match="allow_unisolated"):
        reward([""], ["x"], tests=[["assert 1"]])


def test_problem_set_is_well_formed():
    problems = load_code_problems()
    assert 30 <= len(problems) <= 40
    for p in problems:
        assert set(p) == {"prompt", "answer", "tests", "entry_point"}
        assert f"def {p['entry_point']}(" in p["answer"]
        assert f"`{p['entry_point']}(" in p["prompt"]
        assert len(p["tests"]) >= 2
    assert len({p["entry_point"] for p in problems}) == len(problems)


@needs_isolation
def test_reference_solutions_pass_and_wrong_ones_fail():
    problems = load_code_problems()
    reward = get_reward("unit_tests")
    tests = [p["tests"] for p in problems]
    right = reward([p["prompt"] for p in problems], [fenced(p["answer"]) for p in problems], tests=tests)
    assert right == [1.0] * len(problems), [p["entry_point"] for p, s in zip(problems, right) if s != 1.0]
    wrong = reward(
        [""] * len(problems),
        [fenced(f"def {p['entry_point']}(*args, **kwargs):\n    return None\n") for p in problems],
        tests=tests,
    )
    assert all(s is not None and s < 1.0 for s in wrong), [
        p["entry_point"] for p, s in zip(problems, wrong) if s == 1.0
    ]


def test_load_code_problems_names_line_and_field(tmp_path):
    good = json.dumps({"prompt": "p", "tests": ["assert True"]})
    for bad, field in (
        (json.dumps({"prompt": "p", "tests": []}), "tests"),
        (json.dumps({"prompt": "", "tests": ["assert 1"]}), "prompt"),
        (json.dumps({"prompt": "p", "tests": ["assert 1"], "answer": 3}), "answer"),
    ):
        path = tmp_path / "problems.jsonl"
        path.write_text(good + "\n" + bad + "\n")
        with pytest.raises(InputError, match=f"problems.jsonl:2: field '{field}'"):
            load_code_problems(path)
    assert PROBLEMS_PATH.is_file()


def test_the_reward_is_a_class_whose_steps_are_methods_and_the_factory_keeps_its_name():
    """Issue 28: `unit_tests_reward(...)` (what the registry and recipes call) builds a `UnitTestsReward`
    whose baseline, batch and scoring are methods; the problem loading lives with the code task."""
    import inspect

    reward = get_reward("unit_tests", all_or_nothing=True, case_timeout_s=1.0)
    assert isinstance(reward, UnitTestsReward) and reward.__name__ == "unit_tests" and not is_gameable(reward)
    assert unit_tests_reward(name="pass_at_1").__name__ == "pass_at_1"
    assert all(callable(getattr(reward, step)) for step in ("jobs", "baseline", "batch", "score", "door"))
    assert not hasattr(code_rewards, "load_code_problems") and not hasattr(code_rewards, "PROBLEMS_PATH")
    longest = max(
        len(inspect.getsource(fn).splitlines()) for _, fn in inspect.getmembers(UnitTestsReward, inspect.isfunction)
    )
    assert longest <= 80
    ok = sandbox.SandboxResult(passed=2, total=4, error=None, status="ok")
    assert (reward.score(ok, 0), unit_tests_reward().score(ok, 0)) == (0.0, 0.5)
    assert reward.score(sandbox.SandboxResult(passed=0, total=1, error="boom", status="infra"), 0) is None
