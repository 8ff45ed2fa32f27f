"""The judge, round two (issue 33): correct answers it used to misread, each scored beside a plain harness.

Every item goes through the `unit_tests` reward as GRPO calls it (the completion as the model wrote it,
the row's columns as the dataset publishes them), and the same answer, as a person would take it from
the completion, goes through a plain harness: `exec` of the solution then of each test in a fresh
interpreter, or `python solution.py < input` per case. The two scores must be equal. Families:

1. finding the solution: a corrected second attempt whose first attempt's example fails, `~~~` fences,
   unfenced code between prose, CRLF line endings, a program followed by a sample run of it.
"""

from __future__ import annotations

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
_EXEC = ("import sys\nns = {'__name__': 'solution'}\nexec(compile(sys.argv[1], 'solution.py', 'exec'), ns)\n"
         f"exec(compile(sys.argv[2], 'test.py', 'exec'), ns)\nprint({_PASSED!r})\n")


def plain_harness(answer: str, columns: dict) -> float:
    """The score a plain harness gives `answer` (the code a person takes from the completion): per test,
    a fresh interpreter that execs the answer (as a module named `solution`) then the test in its
    namespace, passing when the test runs to its end; per stdin/stdout case, `python -c answer`
    with the input, output lines compared with trailing whitespace ignored."""
    tests = columns.get("tests") or columns.get("test_list") or []
    if tests:
        passed = sum(_PASSED in subprocess.run([sys.executable, "-c", _EXEC, answer, t], capture_output=True, text=True, timeout=60).stdout for t in tests)
        return passed / len(tests)
    spec = columns["input_output"]
    spec = json.loads(spec) if isinstance(spec, str) else spec
    passed = 0
    for given, expected in zip(spec["inputs"], spec["outputs"]):
        run = subprocess.run([sys.executable, "-c", answer], input=given, capture_output=True, text=True, timeout=60)
        lines = lambda s: [x.rstrip() for x in s.rstrip().split("\n")]  # noqa: E731
        passed += run.returncode == 0 and lines(run.stdout) == lines(expected)
    return passed / len(spec["inputs"])


def judge(items: dict[str, tuple]) -> dict[str, float | None]:
    """The `unit_tests` reward on every item at once: {name: score}."""
    keys = sorted({k for (_, _, cols) in items.values() for k in cols})
    columns = {k: [cols.get(k) for (_, _, cols) in items.values()] for k in keys}
    return dict(zip(items, get_reward("unit_tests")([""] * len(items), [comp for (comp, _, _) in items.values()], **columns)))


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
        f"```python\n{ROT_FIRST_TRY}```\nThat assert fails: I rotated the wrong way. Here is the corrected version:\n```python\n{ROT}```\n",
        ROT, {"tests": ROT_TESTS}),
    "corrected_version_keeps_the_first_blocks_helper": (
        "```python\nimport math\n\ndef _norm(k, n):\n    return k % n if n else 0\n\ndef rot(s, k):\n    return s[_norm(k, len(s)):]\n\nassert rot('ab', 1) == 'ba'\n```\n"
        "Fixed:\n```python\ndef rot(s, k):\n    k = _norm(k, len(s))\n    return s[-k:] + s[:-k] if k else s\n```\n",
        "def _norm(k, n):\n    return k % n if n else 0\n\ndef rot(s, k):\n    k = _norm(k, len(s))\n    return s[-k:] + s[:-k] if k else s\n",
        {"tests": ROT_TESTS}),
    "tilde_fences": (f"Here:\n~~~python\n{ROT}~~~\nand a usage:\n~~~\nprint(rot('xy', 1))\n~~~\n", ROT, {"tests": ROT_TESTS}),
    "long_backtick_fence_holding_a_short_one": (f"````python\n{ROT}s = '''\n```\n'''\n````\n", ROT + "s = '''\n```\n'''\n", {"tests": ROT_TESTS}),
    "unfenced_code_between_prose_paragraphs": (
        f"To rotate right, take the last k characters first.\n\n{ROT}\nThis handles k larger than the length. For example:\n\nprint(rot('abc', 1))\n\nprints cab.",
        ROT, {"tests": ROT_TESTS}),
    "crlf_line_endings": (f"Sure!\r\n```python\r\n{ROT.replace(chr(10), chr(13) + chr(10))}```\r\n", ROT, {"tests": ROT_TESTS}),
    "crlf_inside_a_block_only": (f"Sure!\n```python\n{ROT.replace(chr(10), chr(13) + chr(10))}```\n", ROT, {"tests": ROT_TESTS}),
    "program_then_a_sample_run_calling_main": (
        f"```python\n{SQUARES}```\nTrying it on the sample:\n```python\nimport io, sys\nsys.stdin = io.StringIO('3\\n')\nmain()\n```\n",
        SQUARES, SQUARES_ROW),
    "program_using_a_function_from_the_block_before": (
        "```python\ndef squares(n):\n    return [i * i for i in range(1, n + 1)]\n\nprint(squares(3))\n```\nNow the program:\n"
        "```python\nn = int(input())\nprint(*squares(n))\n```\n",
        "def squares(n):\n    return [i * i for i in range(1, n + 1)]\n\nn = int(input())\nprint(*squares(n))\n", SQUARES_ROW),
    "unfenced_program_between_prose": (
        "Read n, then print the squares.\n\nn = int(input())\nprint(*[i * i for i in range(1, n + 1)])\n\nThat is all.",
        "n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\n", SQUARES_ROW),
}
FINDING_WRONG: dict[str, tuple] = {
    # the earlier attempt is right, the "correction" is wrong: the later definition is still the answer
    "a_wrong_correction_is_the_answer": (f"```python\n{ROT}```\nActually:\n```python\n{ROT_FIRST_TRY}```\n",
                                         ROT_FIRST_TRY, {"tests": ROT_TESTS}),
    "a_wrong_program_then_a_sample_run": (
        "```python\nn = int(input())\nprint(n)\n```\nSample:\n```python\nimport sys, io\nsys.stdin = io.StringIO('3\\n')\nexec(open(__file__).read())\n```\n",
        "n = int(input())\nprint(n)\n", SQUARES_ROW),
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
    assert find_solution(FINDING["unfenced_program_between_prose"][0], programs=True) == FINDING["unfenced_program_between_prose"][1]
    # prose alone is no code; an unclosed ~~~ fence runs to the end
    assert find_solution("Sorry, I cannot help with that.", needs={"rot"}) == "Sorry, I cannot help with that."
    assert find_solution("~~~python\nx = 1\n", needs={"x"}) == "x = 1\n"


# --- family 2: the interpreter a plain harness has --------------------------------------------------------

INTERPRETER: dict[str, tuple] = {
    "program_ending_with_exit": ("n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\nexit()\n", SQUARES_ROW),
    "program_quitting_early_with_a_status_of_zero": (
        "def main():\n    n = int(input())\n    if n == 1:\n        print(1)\n        quit(0)\n    print(*[i * i for i in range(1, n + 1)])\n\nmain()\n", SQUARES_ROW),
    "program_exiting_with_a_status_of_one": ("n = int(input())\nprint(*[i * i for i in range(1, n + 1)])\nexit(1)\n", SQUARES_ROW),
    "program_exiting_with_a_message": ("n = int(input())\nprint(1)\nif n > 1:\n    exit('too big')\n", SQUARES_ROW),
    "function_whose_module_ends_with_exit": (f"{ROT}\nexit()\n", {"tests": ROT_TESTS}),
    "function_guarded_main_with_exit": (f"{ROT}\nif __name__ == '__main__':\n    print(rot('ab', 1))\n    exit()\n", {"tests": ROT_TESTS}),
}


@pytest.fixture(scope="module")
def interpreter_scores():
    return judge({name: (f"```python\n{code}```", code, cols) for name, (code, cols) in INTERPRETER.items()})


@needs_isolation
@pytest.mark.parametrize("name", list(INTERPRETER))
def test_the_interpreter_is_a_plain_harness(interpreter_scores, name):
    code, columns = INTERPRETER[name]
    assert interpreter_scores[name] == plain_harness(code, columns), name
