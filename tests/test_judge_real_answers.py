"""The judge agrees with a plain test harness on what real models write and what real code datasets hold.

Every item goes through the `unit_tests` reward as GRPO calls it (the completion as the model wrote it,
the row's columns), so what is tested is the whole path: finding the solution in the completion, the
row's format, the sandbox. Correct answers in the forms real instruct and base models write, and in the
formats real datasets use, score 1.0; wrong ones score 0, or are refused at the door with the row named.
The examples here are members of their families, not the examples the issue names. One batch.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from regimen.stages import sandbox
from regimen.stages.core.errors import InputError
from regimen.stages.rewards import get_reward
from regimen.stages.rewards.code import unit_tests_reward

ISOLATED, WHY = sandbox.isolation_status()
pytestmark = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")


def c(src: str) -> str:
    return textwrap.dedent(src).strip("\n") + "\n"


def fence(code: str, tag: str = "python") -> str:
    return f"```{tag}\n{c(code)}```"


GCD = "def gcd2(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n"
GCD_TESTS = ["assert gcd2(12, 18) == 6", "assert gcd2(7, 5) == 1"]
GCD_WRONG = "def gcd2(a, b):\n    return a * b\n"
SWAP = "def _swap(a, b):\n    return b, a % b\n"
GCD_WITH_SWAP = "def gcd2(a, b):\n    while b:\n        a, b = _swap(a, b)\n    return a\n"
HE_PROMPT = c('''
    def _norm(xs):
        return [x / max(xs) for x in xs]


    def scaled_sum(xs: list) -> float:
        """ Sum of xs after dividing each by the largest (a helper of the prompt's does the dividing).
        >>> scaled_sum([1, 2])
        1.5
        """
''')
HE_TEST = (
    "def check(candidate):\n    assert abs(candidate([1, 2]) - 1.5) < 1e-9\n"
    "    assert abs(candidate([2, 2, 4]) - 2.0) < 1e-9\n"
)


def row(**columns):
    return columns


# name: (prompt, completion, row columns, expected score)
CORRECT: dict[str, tuple] = {
    # --- the solution among other blocks -----------------------------------------------------------
    "usage_block_after": (
        "Write gcd2.",
        f"Sure!\n{fence(GCD)}\nExample:\n{fence('print(gcd2(4, 6))  # 2')}",
        row(tests=GCD_TESTS),
        1.0,
    ),
    "wrong_assert_in_usage_block": (
        "Write gcd2.",
        f"{fence(GCD)}\nCheck:\n{fence('assert gcd2(4, 6) == 3')}",
        row(tests=GCD_TESTS),
        1.0,
    ),
    "shell_block_after": (
        "Write gcd2.",
        f"{fence(GCD)}\nRun it with:\n{fence('python gcd.py', 'sh')}",
        row(tests=GCD_TESTS),
        1.0,
    ),
    "yaml_block_after": ("Write gcd2.", f"{fence(GCD)}\nConfig:\n{fence('key: 1', 'yaml')}", row(tests=GCD_TESTS), 1.0),
    "output_block_before": (
        "Write gcd2.",
        f"Expected output:\n{fence('6', 'output')}\n{fence(GCD)}",
        row(tests=GCD_TESTS),
        1.0,
    ),
    "helper_in_another_block": (
        "Write gcd2.",
        fence(SWAP) + "\n" + fence(GCD_WITH_SWAP) + "\n" + fence("print(gcd2(1, 2))"),
        row(tests=GCD_TESTS),
        1.0,
    ),
    "corrected_second_attempt": (
        "Write gcd2.",
        fence(GCD_WRONG) + "\nOops, fixed:\n" + fence(GCD),
        row(tests=GCD_TESTS),
        1.0,
    ),
    "unfenced_code": ("Write gcd2.", GCD, row(tests=GCD_TESTS), 1.0),
    "entry_point_and_usage": (
        "Write gcd2.",
        fence(GCD) + "\n" + fence("result = gcd2(8, 12)\nprint(result)"),
        row(tests=GCD_TESTS, entry_point="gcd2"),
        1.0,
    ),
    # --- continuing a code prompt ---------------------------------------------------------------------
    "body_only_continuation": (
        HE_PROMPT,
        "    m = max(xs)\n    return sum(x / m for x in xs)\n",
        row(test=HE_TEST, entry_point="scaled_sum"),
        1.0,
    ),
    "continuation_using_the_prompts_helper": (
        HE_PROMPT,
        "    return sum(_norm(xs))\n",
        row(test=HE_TEST, entry_point="scaled_sum"),
        1.0,
    ),
    # --- HumanEval rows as conversations --------------------------------------------------------------
    "prose_and_unfenced_code_in_a_chat": (
        [
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "Complete the function below.\n\n" + HE_PROMPT + "\nAnswer with code only."},
        ],
        fence("def scaled_sum(xs):\n    return sum(_norm(xs))\n"),
        row(test=HE_TEST, entry_point="scaled_sum"),
        1.0,
    ),
    "chat_template_already_applied": (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nFinish this:\n"
        + HE_PROMPT
        + "<|im_end|>\n<|im_start|>assistant\n",
        fence("def scaled_sum(xs):\n    return sum(_norm(xs))\n"),
        row(test=HE_TEST, entry_point="scaled_sum"),
        1.0,
    ),
    # --- values the tests compare ---------------------------------------------------------------------
    "fraction_mean": (
        "",
        fence("from fractions import Fraction\ndef mean(xs):\n    return Fraction(sum(xs), len(xs))\n"),
        row(
            tests=[
                "from fractions import Fraction\nassert mean([1, 2]) == Fraction(3, 2)",
                "assert mean([1, 1, 2]).denominator == 3",
            ]
        ),
        1.0,
    ),
    "decimal_money": (
        "",
        fence("from decimal import Decimal\ndef total(prices):\n    return sum(Decimal(p) for p in prices)\n"),
        row(
            tests=[
                "from decimal import Decimal\nassert total(['0.10', '0.20']) == Decimal('0.30')",
                "assert str(total(['1.5'])) == '1.5'",
            ]
        ),
        1.0,
    ),
    "dates": (
        "",
        fence(
            "import datetime\ndef next_day(d):\n    return d + datetime.timedelta(days=1)\ndef span(a, b):\n    return "
            "b - a\n"
        ),
        row(
            tests=[
                "import datetime\nassert next_day(datetime.date(2024, 2, 28)) == datetime.date(2024, 2, 29)",
                "import datetime\nassert span(datetime.datetime(2024, 1, 1), datetime.datetime(2024, 1, 2, "
                "6)).total_seconds() == 108000",
            ]
        ),
        1.0,
    ),
    "time_zone": (
        "",
        fence(
            "import datetime\nfrom zoneinfo import ZoneInfo\ndef noon_in(zone):\n    return datetime.datetime(2024, 7, "
            "1, 12, tzinfo=ZoneInfo(zone))\n"
        ),
        row(
            tests=[
                "assert noon_in('America/New_York').utcoffset().total_seconds() == -4 * 3600",
                "assert str(noon_in('Asia/Tokyo').tzinfo) == 'Asia/Tokyo'",
            ]
        ),
        1.0,
    ),
    "counter_and_most_common": (
        "",
        fence("from collections import Counter\ndef tally(words):\n    return Counter(words)\n"),
        row(tests=["assert tally('a b a'.split()).most_common(1) == [('a', 2)]", "assert tally([]) == {}"]),
        1.0,
    ),
    "deque_rotation": (
        "",
        fence("from collections import deque\ndef rotated(xs, k):\n    d = deque(xs)\n    d.rotate(k)\n    return d\n"),
        row(
            tests=[
                "from collections import deque\nassert rotated([1, 2, 3], 1) == deque([3, 1, 2])",
                "assert list(rotated([1, 2], 2)) == [1, 2]",
            ]
        ),
        1.0,
    ),
    "namedtuple_fields": (
        "",
        fence(
            "from collections import namedtuple\nPoint = namedtuple('Point', 'x y')\ndef mid(a, b):\n    return "
            "Point((a.x + b.x) / 2, (a.y + b.y) / 2)\n"
        ),
        row(tests=["m = mid(Point(0, 0), Point(2, 4))\nassert m.x == 1 and m.y == 2 and m == (1, 2)"]),
        1.0,
    ),
    "ordered_and_default_dicts": (
        "",
        fence(
            "from collections import OrderedDict, defaultdict\ndef first_seen(xs):\n    return OrderedDict((x, True) "
            "for x in xs)\ndef groups(pairs):\n    g = defaultdict(list)\n    for k, v in pairs:\n        "
            "g[k].append(v)\n    return g\n"
        ),
        row(
            tests=[
                "assert list(first_seen('bab')) == ['b', 'a']",
                "g = groups([(1, 'a'), (1, 'b')])\nassert g[1] == ['a', 'b'] and g[2] == []",
            ]
        ),
        1.0,
    ),
    "iterators": (
        "",
        fence(
            "def squares(n):\n    return (i * i for i in range(n))\ndef evens(xs):\n    return filter(lambda x: x % 2 "
            "== 0, xs)\ndef pairs(d):\n    return d.items()\n"
        ),
        row(
            tests=[
                "assert list(squares(4)) == [0, 1, 4, 9]",
                "assert sum(evens(range(5))) == 6",
                "assert sorted(pairs({'b': 2, 'a': 1})) == [('a', 1), ('b', 2)]",
            ]
        ),
        1.0,
    ),
    # --- classes ----------------------------------------------------------------------------------------
    "leetcode_solution_class": (
        "",
        fence(
            "from typing import List\nclass Solution:\n    def maxProfit(self, prices: List[int]) -> int:\n        "
            "best, low = 0, float('inf')\n        for p in prices:\n            low = min(low, p)\n            best = "
            "max(best, p - low)\n        return best\n"
        ),
        row(tests=["assert Solution().maxProfit([7, 1, 5, 3, 6, 4]) == 5", "assert Solution().maxProfit([7, 6]) == 0"]),
        1.0,
    ),
    "design_class": (
        "",
        fence(
            "class Counter2:\n    def __init__(self):\n        self.n = 0\n    def hit(self):\n        self.n += 1\n   "
            "     return self.n\n    def __len__(self):\n        return self.n\n"
        ),
        row(tests=["k = Counter2()\nk.hit()\nassert k.hit() == 2 and len(k) == 2 and k.n == 2"]),
        1.0,
    ),
    "linked_list_built_by_the_test": (
        "",
        fence(
            "class ListNode:\n    def __init__(self, val=0, next=None):\n        self.val = val\n        self.next = "
            "next\ndef reverse(head):\n    prev = None\n    while head:\n        head.next, prev, head = prev, head, "
            "head.next\n    return prev\n"
        ),
        row(
            tests=[
                "head = ListNode(1, ListNode(2, ListNode(3)))\nnode, vals = reverse(head), []\nwhile node:\n    "
                "vals.append(node.val)\n    node = node.next\nassert vals == [3, 2, 1]"
            ]
        ),
        1.0,
    ),
    # --- what a plain harness allows -----------------------------------------------------------------
    "deep_recursion": (
        "",
        fence("def depth(n):\n    return 0 if n == 0 else 1 + depth(n - 1)\n"),
        row(tests=["assert depth(980) == 980", "assert depth(996) == 996"]),
        1.0,
    ),
    "process_pool": (
        "",
        fence(
            "from concurrent.futures import ProcessPoolExecutor\ndef cube(x):\n    return x ** 3\ndef cubes(xs):\n    "
            "with ProcessPoolExecutor(2) as ex:\n        return list(ex.map(cube, xs))\n"
        ),
        row(tests=["assert cubes([1, 2, 3]) == [1, 8, 27]"]),
        1.0,
    ),
    "file_the_test_writes": (
        "",
        fence("def count_lines(path):\n    with open(path) as f:\n        return sum(1 for _ in f)\n"),
        row(tests=["with open('in.txt', 'w') as f:\n    f.write('a\\nb\\n')\nassert count_lines('in.txt') == 2"]),
        1.0,
    ),
    "file_the_solution_writes": (
        "",
        fence("def save(path, text):\n    with open(path, 'w') as f:\n        f.write(text)\n"),
        row(tests=["save('out.txt', 'hi')\nwith open('out.txt') as f:\n    assert f.read() == 'hi'"]),
        1.0,
    ),
    "printed_output_captured": (
        "",
        fence("def greet(name):\n    print(f'hello {name}')\n"),
        row(
            tests=[
                "import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n    "
                "greet('bob')\nassert buf.getvalue() == 'hello bob\\n'"
            ]
        ),
        1.0,
    ),
    "stdin_set_by_the_test": (
        "",
        fence("def read_two():\n    return int(input()) + int(input())\n"),
        row(tests=["import io, sys\nsys.stdin = io.StringIO('3\\n4\\n')\nassert read_two() == 7"]),
        1.0,
    ),
    # --- test formats ---------------------------------------------------------------------------------
    "unittest_right": (
        "",
        fence("def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"),
        row(
            tests=[
                "import unittest\nclass TestClamp(unittest.TestCase):\n    def test_low(self):\n        "
                "self.assertEqual(clamp(-5, 0, 9), 0)\n    def test_high(self):\n        self.assertEqual(clamp(50, 0, "
                "9), 9)\nif __name__ == '__main__':\n    unittest.main()\n"
            ]
        ),
        1.0,
    ),
    "pytest_right": (
        "",
        fence("def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n"),
        row(
            tests=[
                "def test_clamp():\n    assert clamp(5, 0, 3) == 3\n\nclass TestMore:\n    def test_inside(self):\n    "
                "    assert clamp(2, 0, 3) == 2\n"
            ]
        ),
        1.0,
    ),
    "builtin_named_function_right": (
        "",
        fence("def sum(xs):\n    total = 0\n    for x in xs:\n        total += x * 2\n    return total\n"),
        row(test_list=["assert sum([1, 2]) == 6"]),
        1.0,
    ),
    # --- stdin/stdout ---------------------------------------------------------------------------------
    "apps_stdio": (
        "",
        fence("n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs) - n)\n"),
        row(input_output=json.dumps({"inputs": ["2\n3 4\n", "1\n10\n"], "outputs": ["5\n", "9\n"]})),
        1.0,
    ),
    "apps_stdio_reads_everything": (
        "",
        fence("import sys\ndata = sys.stdin.read().split()\nprint(max(map(int, data)))\n"),
        row(input_output={"inputs": ["1 5 2\n", "7\n"], "outputs": ["5", "7\n\n"]}),
        1.0,
    ),
    "taco_call_based_with_a_class": (
        "",
        fence("class Solution:\n    def addDigits(self, num):\n        return 0 if num == 0 else 1 + (num - 1) % 9\n"),
        row(input_output=json.dumps({"fn_name": "addDigits", "inputs": [[38], [0]], "outputs": [[2], [0]]})),
        1.0,
    ),
    "taco_call_based_function": (
        "",
        fence("def solve(a, b):\n    return [a + b, a * b]\n"),
        row(input_output=json.dumps({"fn_name": "solve", "inputs": [[2, 3]], "outputs": [[5, 6]]})),
        1.0,
    ),
    "openr1_verification_info": (
        "",
        fence("s = input().strip()\nprint(s[::-1])\n"),
        row(
            verification_info={
                "language": "python",
                "test_cases": [
                    {"input": "abc\n", "output": "cba\n", "type": "stdin_stdout"},
                    {"input": "x\n", "output": "x", "type": "stdin_stdout"},
                ],
            }
        ),
        1.0,
    ),
    "codecontests_tests": (
        "",
        fence("t = int(input())\nfor _ in range(t):\n    a, b = map(int, input().split())\n    print(a * b)\n"),
        row(
            public_tests={"input": ["2\n2 3\n4 5\n"], "output": ["6\n20\n"]},
            private_tests={"input": ["1\n0 9\n"], "output": ["0\n"]},
            generated_tests={"input": [], "output": []},
        ),
        1.0,
    ),
    "program_after_prose_and_a_usage_block": (
        "",
        "Read n and print its square:\n"
        + fence("n = int(input())\nprint(n * n)\n")
        + "\nFor input 3 it prints:\n"
        + fence("9", "text"),
        row(input_output={"inputs": ["3\n", "12\n"], "outputs": ["9\n", "144\n"]}),
        1.0,
    ),
}

WRONG: dict[str, tuple] = {
    "unittest_behind_main_guard_wrong": (
        "",
        fence("def clamp(x, lo, hi):\n    return x\n"),
        CORRECT["unittest_right"][2],
        0.0,
    ),
    "pytest_functions_never_called_wrong": (
        "",
        fence("def clamp(x, lo, hi):\n    return x\n"),
        CORRECT["pytest_right"][2],
        0.0,
    ),
    "builtin_named_function_wrong": (
        "",
        fence("def sum(xs):\n    return 0\n"),
        row(test_list=["assert sum([1, 2]) == 6", "assert sum([]) == 0 and sum([5]) == 10"]),
        0.0,
    ),
    "builtin_named_function_absent": (
        "",
        fence("total = 1\n"),
        row(test_list=["assert len('abc') == 3 and len([]) == 0"]),
        0.0,
    ),
    "stdio_wrong": (
        "",
        fence("n = int(input())\nxs = list(map(int, input().split()))\nprint(sum(xs))\n"),
        CORRECT["apps_stdio"][2],
        0.0,
    ),
    "call_based_wrong": (
        "",
        fence("class Solution:\n    def addDigits(self, num):\n        return num % 10\n"),
        CORRECT["taco_call_based_with_a_class"][2],
        0.5,
    ),
    "continuation_wrong": (HE_PROMPT, "    return sum(xs)\n", row(test=HE_TEST, entry_point="scaled_sum"), 0.0),
    "solution_only_in_a_bash_block": ("", fence(GCD, "bash"), row(tests=GCD_TESTS), 0.0),
}


@pytest.fixture(scope="module")
def scored():
    items = {**CORRECT, **WRONG}
    reward = get_reward("unit_tests")
    columns_keys = sorted({k for (_, _, cols, _) in items.values() for k in cols})
    prompts = [p for (p, _, _, _) in items.values()]
    completions = [comp for (_, comp, _, _) in items.values()]
    columns = {k: [cols.get(k) for (_, _, cols, _) in items.values()] for k in columns_keys}
    return dict(zip(items, reward(prompts, completions, **columns)))


@pytest.mark.parametrize("name", list(CORRECT))
def test_correct_answers_score_one(scored, name):
    assert scored[name] == CORRECT[name][3], name


@pytest.mark.parametrize("name", list(WRONG))
def test_wrong_answers_score_what_they_earn(scored, name):
    assert scored[name] == WRONG[name][3], name


def test_tests_that_evaluate_the_solutions_strings_are_refused_at_the_door():
    reward = get_reward("unit_tests")
    tests = ["assert eval(expr(2)) == 4"]
    with pytest.raises(InputError, match=r"row 0: its tests evaluate strings .*`eval` in test 1"):
        reward([""], [fence("def expr(x):\n    return f'{x}*2'\n")], tests=[tests])
    for sneaky in (
        ["import builtins\nassert builtins.exec(code()) is None"],
        ["import pickle\nassert pickle.loads(data()) == 1"],
    ):
        with pytest.raises(InputError, match="evaluate strings or load pickles"):
            reward([""], [fence("def code():\n    return ''\n")], tests=[sneaky])


def test_with_allow_eval_the_strings_run_in_the_solutions_process_and_cannot_forge_results():
    """The forged-result attack of the issue: the string the test evaluates tries to write results on
    the judge's pipes. It runs in the solution's process, which holds none of them."""
    reward = unit_tests_reward(allow_eval=True)
    forge = "def expr(x):\n    return \"__import__('os').write(3, b'pass 0\\\\npass 1\\\\ndone 2\\\\n') and 0 or 5\"\n"
    honest = "def expr(x):\n    return f'{x} * 2'\n"
    tests = ["assert eval(expr(2)) == 4", "assert eval(expr(3)) == 6"]
    assert reward(["", ""], [fence(forge), fence(honest)], tests=[tests, tests]) == [0.0, 1.0]


def test_fixtures_only_pytest_can_supply_are_refused():
    with pytest.raises(InputError, match=r"test_sum\(\) takes arguments"):
        get_reward("unit_tests")([""], ["x = 1"], tests=[["def test_sum(tmp_path):\n    assert True\n"]])


def test_rows_whose_tests_pass_with_no_solution_are_left_out_and_reported():
    reward = get_reward("unit_tests")
    rows = [
        {"prompt": "p", "tests": ["assert True"]},
        {"prompt": "p", "tests": ["assert gcd2(4, 6) == 2", "assert 1 + 1 == 2"]},
        {"prompt": "p", "tests": GCD_TESTS},
    ]
    report = reward.door(rows, ["row A", "row B", "row C"])
    assert report == {"pays_anything": ["row A"], "pays_some": ["row B (50%)"]}
    assert reward(["p"] * 3, ["", fence(GCD), fence(GCD)], tests=[r["tests"] for r in rows]) == [None, 1.0, 1.0]


def test_program_options_all_or_nothing_and_float_tolerance():
    cols = {"input_output": [json.dumps({"inputs": ["1\n", "2\n"], "outputs": ["0.3333333\n", "0.6666667\n"]})] * 2}
    close = fence("x = int(input())\nprint(x / 3)\n")
    half = fence("x = int(input())\nprint('0.3333333' if x == 1 else 0)\n")
    assert get_reward("unit_tests")(["", ""], [close, half], **cols) == [0.0, 0.5]
    assert unit_tests_reward(float_tolerance=1e-6)(["", ""], [close, half], **cols) == [1.0, 0.5]
    assert unit_tests_reward(float_tolerance=1e-6, all_or_nothing=True)(["", ""], [close, half], **cols) == [1.0, 0.0]


def test_a_program_over_its_case_time_fails_that_case_only():
    cols = {"input_output": [json.dumps({"inputs": ["1\n", "0\n"], "outputs": ["1\n", "0\n"]})]}
    slow = fence("x = int(input())\nwhile x:\n    pass\nprint(x)\n")
    assert unit_tests_reward(case_timeout_s=0.5)([""], [slow], **cols) == [0.5]
