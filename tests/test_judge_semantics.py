"""What honest code and honest tests can do across the judge's boundary: print, import the standard
library, recurse, raise, return any plain data, pass callables the solution calls back, use the three
dataset formats (also mixed in one batch); and what fails by design (a test's own non-callable objects
as arguments, non-plain results). One batch."""

from __future__ import annotations

import textwrap

import pytest

from regimen.stages import sandbox
from regimen.stages.rewards import get_reward
from regimen.stages.rewards.code import prompt_code, row_job, row_tests
from regimen.stages.sandbox import Job, SandboxConfig, run_batch

ISOLATED, WHY = sandbox.isolation_status()
needs_isolation = pytest.mark.skipif(not ISOLATED, reason=f"isolated sandbox unavailable: {WHY}")


def _code(src: str) -> str:
    return textwrap.dedent(src).strip() + "\n"


CASES: dict[str, tuple[Job, list[bool]]] = {
    "prints_and_recurses": (
        Job(
            _code("""
        import sys
        print('loading'); print('to stderr', file=sys.stderr)
        def fib(n):
            print('fib', n)
            return n if n < 2 else fib(n - 1) + fib(n - 2)
    """),
            ["assert fib(10) == 55", "assert fib(0) == 0"],
        ),
        [True, True],
    ),
    "stdlib_imports": (
        Job(
            _code("""
        import math, itertools
        from collections import Counter
        from functools import reduce
        from math import gcd
        def lcm_all(xs):
            return reduce(lambda a, b: a * b // gcd(a, b), xs)
    """),
            [
                "assert lcm_all([4, 6]) == 12",
                "assert math.sqrt(16) == 4 and gcd(4, 6) == 2",  # J's own modules; the solution's gcd, called in S
                "assert Counter('aab')['a'] == 2 and list(itertools.islice(itertools.count(), 2)) == [0, 1]",
            ],
        ),
        [True, True, True],
    ),
    "plain_results": (
        Job(
            _code("""
        def f(kind):
            return {
                'tuple': (1, 'a'), 'dict': {1: [2.5, None]}, 'set': {1, 2}, 'frozenset': frozenset({'x'}),
                'bytes': b'\\x00', 'none': None, 'nan': float('nan'), 'complex': 1 + 2j, 'big': 10 ** 40,
                'bool': True, 'neg_zero': -0.0, 'nested': [[[]]],
            }[kind]
    """),
            [
                "assert f('tuple') == (1, 'a') and type(f('tuple')) is tuple",
                "assert f('dict') == {1: [2.5, None]}",
                "assert f('set') == {1, 2} and f('frozenset') == frozenset({'x'})",
                "assert f('bytes') == b'\\x00' and f('none') is None",
                "import math\nassert math.isnan(f('nan')) and f('complex') == 1 + 2j and f('big') == 10 ** 40",
                "assert f('bool') is True and str(f('neg_zero')) == '-0.0' and f('nested') == [[[]]]",
            ],
        ),
        [True] * 6,
    ),
    "arguments_and_kwargs": (
        Job(
            "def f(a, *rest, key=None, **kw):\n    return [a, list(rest), key, sorted(kw)]\n",
            [
                "assert f(1, 2, 3, key='k', z=1, y=2) == [1, [2, 3], 'k', ['y', 'z']]",
                "assert f((1, 2)) == [(1, 2), [], None, []]",
            ],
        ),
        [True, True],
    ),
    "exceptions": (
        Job(
            _code("""
        class BadInput(ValueError):
            pass
        def f(x):
            if x < 0:
                raise BadInput('negative')
            if x == 0:
                raise KeyError('zero')
            return 1 / (x - 1)
    """),
            [
                "try:\n    f(-1)\nexcept ValueError as e:\n    assert 'negative' in str(e)\nelse:\n    raise "
                "AssertionError",
                "try:\n    f(0)\nexcept KeyError:\n    pass\nelse:\n    raise AssertionError",
                "try:\n    f(1)\nexcept ZeroDivisionError:\n    pass\nelse:\n    raise AssertionError",
                "assert f(3) == 0.5",
            ],
        ),
        [True, True, True, True],
    ),
    "solution_exception_class_not_builtin": (
        Job(
            "class Oops(Exception):\n    pass\ndef f():\n    raise Oops('x')\n",
            [
                "try:\n    f()\nexcept Exception as e:\n    assert type(e).__name__ == 'SolutionError' and 'Oops' in "
                "str(e)"
            ],
        ),
        [True],
    ),
    "top_level_data_without_entry_point": (
        Job("TABLE = {'a': 1}\nLIMIT = 3\n", ["assert TABLE == {'a': 1} and LIMIT == 3"]),
        [True],
    ),
    "builtin_names_stay_builtin": (
        Job(
            _code("""
        def abs(x):
            return 'not abs'
        def f(x):
            return abs(x)
    """),
            ["assert abs(-2) == 2", "assert f(-2) == 'not abs'"],
        ),
        [True, True],
    ),
    "entry_point_may_shadow_a_builtin": (
        Job("def max(xs):\n    return 'mine'\n", ["assert max([1, 2]) == 'mine'"], entry_point="max"),
        [True],
    ),
    "entry_point_missing": (Job("def other():\n    return 1\n", ["assert add(1, 2) == 3"], entry_point="add"), [False]),
    "entry_point_only": (
        Job(
            "def add(a, b):\n    return helper(a) + b\ndef helper(a):\n    return a\n",
            ["assert add(1, 2) == 3", "helper(1)"],
            entry_point="add",
        ),
        [True, False],
    ),
    "callable_argument_is_called_back_a_test_object_is_not_plain": (
        Job(
            "def apply(f, x):\n    return f(x)\ndef double(x):\n    return 2 * x\n",
            [
                "assert apply(lambda v: v + 1, 1) == 2",
                "assert double(2) == 4",
                "class Box:\n    pass\napply(len, Box())",
            ],
        ),
        [True, True, False],
    ),
    "objects_of_the_solutions_classes_are_proxies": (
        Job(
            "class P:\n    def __init__(self, v=0):\n        self.v = v\n    def get(self):\n        return "
            "self.v\ndef make():\n    return P(5)\ndef ok():\n    return 1\n",
            [
                "make()",
                "assert ok() == 1",
                "x = P(3)\nassert x.get() == 3 and x.v == 3",
                "assert make() != make() and make() == make() or True",
                "p = make()\nassert p == p and p != P(5)",
            ],
        ),
        [True, True, True, True, True],
    ),
    "arguments_changed_in_place_are_written_back": (
        Job(
            "def push(xs):\n    xs.append(1)\n    return len(xs)\n", ["xs = []\nassert push(xs) == 1\nassert xs == [1]"]
        ),
        [True],
    ),  # as a plain harness: issue 33
    "exit_midway_keeps_earlier_passes": (
        Job(
            "def f(x):\n    if x == 2:\n        raise SystemExit\n    return x\n",
            ["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"],
        ),
        [True, False, False],
    ),
    "setup_runs_first_and_wins": (
        Job(
            "def helper():\n    return 'solution'\ndef f():\n    return helper()\n",
            ["assert helper() == 'setup' and f() == 'solution' and CONSTANT == 7"],
            setup="def helper():\n    return 'setup'\nCONSTANT = 7\n",
        ),
        [True],
    ),
    "humaneval_format": (
        Job(
            "def poly(xs, x):\n    return 0\ndef find(xs):\n    return -xs[0] / xs[1]\n",
            ["def check(candidate):\n    assert abs(poly([1, 2], candidate([1, 2]))) < 1e-9\n\ncheck(find)\n"],
            entry_point="find",
            setup="def poly(xs, x):\n    return sum(c * x ** i for i, c in enumerate(xs))\ndef find(xs):\n    "
            "'''stub'''\n",
        ),
        [True],
    ),
    "standard_library_values_keep_their_type": (
        Job(
            _code("""
        import collections, enum
        P = collections.namedtuple('P', 'x y')
        class Level(enum.IntEnum):
            HIGH = 3
        def f(kind):
            return {
                'counter': collections.Counter('aab'), 'defaultdict': collections.defaultdict(list, {1: [2]}),
                'ordered': collections.OrderedDict(a=1), 'namedtuple': P(1, 2), 'intenum': Level.HIGH,
                'nested': {Level.HIGH: [P(3, 4)]},
            }[kind]
    """),
            [
                "import collections\nassert f('counter') == {'a': 2, 'b': 1} and type(f('counter')) is "
                "collections.Counter and f('counter').most_common(1) == [('a', 2)]",
                "assert f('defaultdict') == {1: [2]} and f('ordered') == {'a': 1}",
                "assert f('namedtuple') == (1, 2) and f('namedtuple').x == 1 and f('namedtuple').y == 2",
                "assert f('intenum') == 3 and type(f('intenum')) is int",
                "assert f('nested') == {3: [(3, 4)]}",
            ],
        ),
        [True] * 5,
    ),
    "prints_a_lot": (
        Job("def f():\n    for i in range(120_000):\n        print('x' * 99)\n    return 1\n", ["assert f() == 1"]),
        [True],
    ),
    "solution_imports_are_its_own": (
        Job(
            _code("""
        import math
        math.gcd = lambda a, b: 99
        from math import gcd
        import math as m
    """),
            ["assert gcd(4, 6) == 99", "assert math.gcd(4, 6) == 2", "m.sqrt(4)"],
        ),
        [True, True, False],
    ),
    "test_local_name_like_the_solutions": (
        Job(
            "def add(a, b):\n    return a + b\n",
            [
                "def check(candidate):\n    add = candidate\n    assert add(1, 2) == 3\n\ncheck(add)",
                "assert [add(x, x) for add_ in [1] for x in [2]] == [4]",
            ],
        ),
        [True, True],
    ),
    "test_prints_and_own_error": (
        Job("def f():\n    return 1\n", ["print('from the test')\nassert f() == 1", "raise SystemExit", "1 / 0"]),
        [True, False, False],
    ),
}


@pytest.fixture(scope="module")
def results():
    names = list(CASES)
    out = run_batch([CASES[n][0] for n in names], workers=2, config=SandboxConfig(timeout_s=3))
    return dict(zip(names, out))


@needs_isolation
@pytest.mark.parametrize("name", list(CASES))
def test_semantics(results, name):
    r = results[name]
    assert r.status == "ok", r
    assert r.tests == CASES[name][1], (r.test_errors, r.error, r.output[-500:])


@needs_isolation
def test_details(results):
    assert "loading" in results["prints_and_recurses"].output and "to stderr" in results["prints_and_recurses"].output
    assert "from the test" in results["test_prints_and_own_error"].output
    assert "not plain data" in results["callable_argument_is_called_back_a_test_object_is_not_plain"].test_errors[2]
    assert "NameError" in results["entry_point_missing"].test_errors[0]
    assert "ended early" in (results["exit_midway_keeps_earlier_passes"].error or "")


@needs_isolation
def test_details_of_the_new_cases(results):
    assert "more bytes of output discarded" in results["prints_a_lot"].output


def test_the_judge_binds_only_what_it_chooses():
    """What S reports about its names is a claim: J proxies every callable to S (so S's own object
    answers), never binds a function S says comes from elsewhere, binds a module only as J's own import
    of an allow-listed module of the same name, and with a declared entry point binds nothing else of
    the solution's but modules."""
    import math

    from regimen.stages.sandbox import judge, wire

    reported = [
        ("add", "import", ["operator", "add"]),  # a claim that `add` is the standard library's: not bound
        ("answer", "import", ["unittest.mock", "_ANY"]),
        ("helper", "call", None),
        ("math", "module", "math"),
        ("m", "module", "math"),  # an alias: not bound
        ("cmath", "module", "math"),  # a swap: not bound
        ("runner", "module", "unittest.__main__"),
        ("mock", "module", "unittest.mock"),  # not a module tests may use
        ("abs", "call", None),  # a builtin: never shadowed
        ("TABLE", "data", wire.encode({1: 2})),
    ]
    ns: dict = {}
    judge.bind_solution(ns, reported, judge._Channel(-1), None)
    assert sorted(ns) == ["TABLE", "helper", "math"]
    assert ns["math"] is math and ns["TABLE"] == {1: 2} and ns["helper"].__name__ == "helper"
    ns = {}
    judge.bind_solution(ns, reported + [("add", "call", None)], judge._Channel(-1), "add")
    assert sorted(ns) == ["add", "math"]
    ns = {}
    judge.bind_solution(ns, [("add", "import", ["operator", "add"])], judge._Channel(-1), "add")
    with pytest.raises(NameError):  # an entry point reported as anything but a callable of its own is missing
        ns["add"](1, 2)


def test_names_the_tests_bind_are_theirs():
    """A name a test snippet binds at module level, anywhere in it, is never the solution's, even in the
    snippets before the line that binds it runs; names local to its functions and comprehensions are."""
    from regimen.stages.sandbox.judge import test_names

    tests = [
        "assert add(1, 2) == 3\ndef expected(a, b):\n    return a + b",
        "from math import isclose\nimport os.path\nfor i, (j, k) in enumerate([]):\n    pass\nwith open(x) as fh:\n    "
        "pass",
        "def check(candidate):\n    add = candidate\n    global G\n\ncheck(add)",
        "[y for y in range(3)]\n[(z := 1) for w in []]\ntry:\n    pass\nexcept E as err:\n    pass\nclass K:\n    "
        "inner = 1\nf = lambda q: q",
        "match v:\n    case [a, *rest]:\n        pass\n    case {'k': b, **others}:\n        pass",
        "not python (",
    ]
    assert test_names(tests) == {
        "expected",
        "isclose",
        "os",
        "i",
        "j",
        "k",
        "fh",
        "check",
        "G",
        "z",
        "err",
        "K",
        "f",
        "a",
        "rest",
        "b",
        "others",
    }


@needs_isolation
def test_setup_that_fails_is_infra_not_a_score():
    r = run_batch(
        [Job("def f():\n    return 1\n", ["assert f() == 1"], setup="import not_a_module_anywhere\n")], workers=1
    )[0]
    assert r.status == "infra" and "set-up code failed" in r.error


def test_row_formats_are_read_per_row():
    he_prompt = "def inc(x):\n    '''Add one.'''\n"
    columns = {
        "tests": [["assert f(1) == 2"], None, None, [], None],
        "entry_point": ["f", None, "inc", None, None],
        "test_list": [None, ["assert g(1) == 3"], None, ["assert h(2) == 4"], None],
        "test_imports": [None, ["import math"], None, None, None],
        "test_setup_code": [None, "K = 2", None, "", None],
        "test": [None, None, "def check(candidate):\n    assert candidate(1) == 2\n", None, None],
    }
    prompts = ["p", "p", he_prompt, "p", "p"]
    jobs = [row_job(i, columns, prompts[i]) for i in range(5)]
    assert jobs[0] == Job("", ["assert f(1) == 2"], "f", None)
    assert jobs[1] == Job("", ["assert g(1) == 3"], None, "import math\nK = 2\n")
    assert jobs[2].entry_point == "inc" and jobs[2].setup == he_prompt and jobs[2].tests[0].endswith("check(inc)\n")
    assert jobs[3] == Job("", ["assert h(2) == 4"], None, None)  # an empty `tests` does not hide test_list
    assert jobs[4] is None
    assert row_tests(2, columns) == jobs[2].tests
    assert prompt_code("Complete this:\n```python\ndef inc(x):\n    pass\n```\n") == "def inc(x):\n    pass\n"
    # prose + code: the code
    assert prompt_code([{"role": "system", "content": "be brief"}, {"role": "user", "content": he_prompt}]) == he_prompt
    assert prompt_code([{"role": "user", "content": he_prompt}]) == he_prompt
    assert prompt_code("f(0)=3\nf(1)=5\n") is None


@needs_isolation
def test_mixed_formats_in_one_batch_all_score():
    """Today's regression: a HumanEval row next to rows of another format must not score None."""
    reward = get_reward("unit_tests")
    he_prompt = "def inc(x):\n    '''Add one.'''\n"
    check = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-1) == 0\n"
    completions = [
        "```python\ndef f(x):\n    return x + 1\n```",
        # K comes from MBPP's test_setup_code, in the judge only: a NameError
        "```python\ndef g(x):\n    return x + K\n```",
        "```python\ndef g(x):\n    return x + 2\n```",
        "```python\ndef inc(x):\n    return x + 1\n```",
        "```python\ndef inc(x):\n    return x\n```",
        "no tests here",
    ]
    scores = reward(
        ["p", "p", "p", he_prompt, he_prompt, "p"],
        completions,
        tests=[["assert f(1) == 2"], None, None, None, None, None],
        entry_point=["f", None, None, "inc", "inc", None],
        test_list=[
            None,
            ["assert g(1) == 3"],
            ["assert g(1) == 3", "assert math.floor(g(0.5)) == K"],
            None,
            None,
            None,
        ],
        test_imports=[None, [], ["import math"], None, None, None],
        test_setup_code=[None, "K = 2", "K = 2", None, None, None],
        test=[None, None, None, check, check, None],
    )
    assert scores == [1.0, 0.0, 1.0, 1.0, 0.0, None]
