"""A code dataset's row as the sandbox's job, in whatever format the row itself uses, and the checks at
the door.

Each row is read in its own format, so one dataset may mix them (a column that is None or empty for a
row does not hide that row's own format):

- `tests`: Python snippets (a single string is one snippet; a string holding a JSON list is that list),
  with the row's `entry_point`, if any, as the function under test; or, as DeepCoder publishes it, a JSON
  list of cases (`{input, output, testtype: stdin | functional}` with the row's `metadata.func_name`, or
  `{input, output, type: stdin_stdout | function_call, fn_name}`) or a JSON mapping `{inputs, outputs,
  fn_name}` (its TACO part), read as the formats below;
- `test` without an `entry_point` (KodCode): a pytest file (`from solution import f`, `def test_*`),
  one test per test function or `Test*` class, each after the file's other statements (its imports and
  helpers);
- `test_list` (MBPP): its asserts; `test_imports` and `test_setup_code` run once before them, as trusted
  set-up code;
- `test` + `entry_point` (HumanEval): one snippet that defines `check` and calls it on the entry point;
  the prompt's code (`solutions.prompt_code`) is the trusted set-up code, so helpers it defines (`poly`,
  `encode_cyclic`) are the dataset's, not the solution's;
- stdin/stdout problems, judged as programs, one run per case:
  - `input_output` (APPS, TACO): a JSON string or mapping with `inputs` and `outputs`, the numbers in a
    program's output compared with APPS's grader's float rule (`harness.same_output`) when the row is
    shaped as those datasets publish it (their `url` and `difficulty` beside it; a bare `input_output`
    column of a user's own is compared as written, or with the reward's `float_tolerance`; CodeContests'
    rows stay token-equal); with `fn_name` the row is call-based instead (each input a list of arguments, compared as
    APPS's grader compares: the value, or the first item of an expected list, tuples as lists; a `Solution` class's
    method counts),
  - `verification_info` (open-r1, DeepCoder): `{language, test_cases: [{input, output, type}]}` with type
    `stdin_stdout` (or `function_call` with `fn_name`, inputs as JSON lists of arguments),
  - CodeContests: `public_tests`, `private_tests`, `generated_tests`, each `{input: [...], output: [...]}`,
  - LiveCodeBench: `public_test_cases` and `private_test_cases` (JSON lists of `{input, output, testtype}`;
    the private ones also as published compressed: base64 of zlib of a pickled JSON string), with
    `metadata.func_name` for functional cases (called as LiveCodeBench calls them: each input line a
    JSON argument, the output JSON, a `Solution` class's method counting). The compressed form is read
    without unpickling: its opcodes are walked (`pickletools.genops`, which runs nothing) and only a
    pickle holding one plain string is accepted; anything else (a global, a reduce) is refused with
    the row named.

A row with none of them has no opinion from `unit_tests` (None).

At the door (`door`), before anything trains, every row is checked: tests that evaluate strings
(`eval`, `exec`, `compile`, `pickle`/`marshal` loads) are refused unless the reward allows them
(`allow_eval`: those strings then run in the solution's process, never the judge's); pytest-style tests
that need fixtures other than `capsys` are refused (they cannot run outside pytest; parametrized ones
run once per case); and rows whose tests pass with no
solution at all (an empty program) are reported: they pay anything. The reward leaves those out (None).
"""

from __future__ import annotations

import ast
import base64
import binascii
import functools
import json
import pickletools
import zlib
from collections.abc import Sequence
from typing import Any

from regimen.stages import sandbox
from regimen.stages.core.errors import InputError
from regimen.stages.rewards.solutions import prompt_code

IDENTIFIER = str.isidentifier
EVALUATING = {"eval", "exec", "compile", "__import__"}
UNPICKLING = {"pickle", "marshal", "shelve", "dill", "cloudpickle", "_pickle"}


def humaneval_snippet(test: str, entry_point: str) -> str:
    """HumanEval's `check(candidate)` test plus its entry point, as one snippet."""
    if not (entry_point or "").isidentifier():
        raise InputError(f"unit_tests: entry_point {entry_point!r} is not a Python identifier")
    return f"{test.rstrip()}\n\ncheck({entry_point})\n"


def mbpp_snippets(test_list: Sequence[str], test_setup_code: str = "", test_imports: Sequence[str] = ()) -> list[str]:
    """MBPP's `test_list` asserts as snippets; setup code and imports, if any, precede each one."""
    prefix = "".join(f"{line}\n" for line in test_imports) + (
        f"{test_setup_code.rstrip()}\n" if test_setup_code and test_setup_code.strip() else ""
    )
    return [prefix + t for t in test_list]


def _entry_point(value: Any, row: int) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise InputError(f"unit_tests: row {row}: entry_point {value!r} is not a Python identifier")
    return value


def _snippets(value: Any, row: int, column: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("["):
            try:
                parsed = json.loads(stripped)
            except ValueError:
                parsed = None
            if isinstance(parsed, list):
                value = parsed
        if isinstance(value, str):
            return [value] if stripped else None
    if isinstance(value, (list, tuple)) and all(isinstance(t, str) for t in value):
        return list(value) or None
    raise InputError(
        f"unit_tests: row {row}: `{column}` must be a list of Python snippets (strings), got {type(value).__name__}"
    )


def _mapping(value: Any, row: int, column: str) -> dict | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise InputError(f"unit_tests: row {row}: `{column}` is not valid JSON ({exc.msg})") from None
    if not isinstance(value, dict):
        raise InputError(f"unit_tests: row {row}: `{column}` must be a mapping, got {type(value).__name__}")
    return value


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # TACO: lines of one input
        return "\n".join(value) + "\n"
    return json.dumps(value)


def pytest_file_snippets(test: str) -> list[str]:
    """A pytest file (KodCode's `test`) as snippets: one per test function or `Test*` class, each after the
    file's other top-level statements (imports, helpers); the whole file when it has one test or none."""
    try:
        tree = ast.parse(test)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return [test]
    lines = test.split("\n")

    def source(node: ast.stmt) -> str:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        return "\n".join(lines[first - 1 : node.end_lineno])

    def is_test(node: ast.stmt) -> bool:
        return (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name.startswith("test")
            or isinstance(node, ast.ClassDef)
            and node.name.startswith("Test")
        )

    tests = [node for node in tree.body if is_test(node)]
    if len(tests) <= 1:
        return [test]
    prelude = "\n".join(source(node) for node in tree.body if not is_test(node))
    return [f"{prelude}\n\n\n{source(node)}\n" for node in tests]


_PLAIN_STRING_OPS = {
    "PROTO",
    "FRAME",
    "SHORT_BINUNICODE",
    "BINUNICODE",
    "BINUNICODE8",
    "UNICODE",
    "MEMOIZE",
    "BINPUT",
    "LONG_BINPUT",
    "PUT",
    "STOP",
}
_MAX_DECOMPRESSED = 1 << 30


def _compressed_cases(value: str, row: int, column: str) -> Any:
    """LiveCodeBench's compressed test cases: base64(zlib(pickle(a JSON string))). The pickle is never
    loaded: its opcodes are walked, and only one plain string, with nothing else, is accepted. Decoded
    once per value in a process (GRPO reads a row at every step)."""
    try:
        return _decompressed(value)
    except InputError as exc:
        raise InputError(
            str(exc).replace("unit_tests: `", f"unit_tests: row {row}: `").replace("`?`", f"`{column}`")
        ) from None


@functools.lru_cache(maxsize=64)
def _decompressed(value: str) -> Any:
    where = "unit_tests: `?`"
    try:
        data = zlib.decompressobj().decompress(base64.b64decode(value.strip(), validate=True), _MAX_DECOMPRESSED)
    except (binascii.Error, ValueError, zlib.error):
        raise InputError(f"{where} is neither JSON nor LiveCodeBench's compressed form (base64 of zlib)") from None
    strings = []
    try:
        for opcode, arg, _ in pickletools.genops(data):
            if opcode.name not in _PLAIN_STRING_OPS:
                raise InputError(
                    f"{where}: its pickle holds {opcode.name}, not just a string; refused (never unpickled)"
                )
            if "UNICODE" in opcode.name:
                strings.append(arg)
    except ValueError as exc:
        raise InputError(f"{where}: its pickle is malformed ({exc})") from None
    if len(strings) != 1:
        raise InputError(f"{where}: its pickle holds {len(strings)} strings, not one; refused")
    try:
        return json.loads(strings[0])
    except ValueError as exc:
        raise InputError(f"{where}: the string in its pickle is not JSON ({exc.msg})") from None


def _case_list(value: Any, row: int, column: str, compressed: bool = False) -> list | dict | None:
    """A column of test cases (a JSON list of `{input, output, ...}` or a `{inputs, outputs}` mapping), or
    None when the column holds something else (Python snippets)."""
    if value is None or value == "" or value == []:
        return None
    if isinstance(value, str):
        stripped = value.strip()
        try:
            value = json.loads(stripped)
        except ValueError:
            if not compressed:
                return None
            value = _compressed_cases(stripped, row, column)
    if isinstance(value, dict) and "inputs" in value:
        return value
    if isinstance(value, (list, tuple)) and value and all(isinstance(c, dict) and "input" in c for c in value):
        return list(value)
    if compressed:
        raise InputError(f"unit_tests: row {row}: `{column}` must be a list of {{input, output, testtype}} cases")
    return None


def _func_name(metadata: Any) -> str:
    if isinstance(metadata, str):
        try:
            metadata = json.loads(metadata) if metadata.strip() else {}
        except ValueError:
            metadata = {}
    return str(metadata.get("func_name") or "") if isinstance(metadata, dict) else ""


def _cases_job(cases: list | dict, fn_name: str, row: int, options: dict) -> sandbox.Job | None:
    """A job from a list of cases (DeepCoder, LiveCodeBench) or a `{inputs, outputs, fn_name}` mapping."""
    if isinstance(cases, dict):
        inputs, outputs = cases.get("inputs") or [], cases.get("outputs") or []
        if len(inputs) != len(outputs):
            raise InputError(f"unit_tests: row {row}: the tests have {len(inputs)} inputs and {len(outputs)} outputs")
        fn_name = str(cases.get("fn_name") or fn_name or "")
        cases = [
            {"input": i, "output": o, "type": "functional" if fn_name else "stdin"} for i, o in zip(inputs, outputs)
        ]
    functional = [c for c in cases if str(c.get("testtype", c.get("type", "stdin"))) in ("functional", "function_call")]
    max_cases = options.get("max_cases")
    if not functional:
        pairs = [(_text(c.get("input", "")), _text(c.get("output", ""))) for c in cases]
        pairs = pairs[:max_cases] if max_cases else pairs
        return (
            sandbox.Job(
                "",
                [],
                None,
                None,
                "programs",
                pairs,
                options.get("case_timeout_s", 2.0),
                options.get("float_tolerance"),
            )
            if pairs
            else None
        )
    fn_name = (
        fn_name
        or next((str(c["fn_name"]) for c in functional if c.get("fn_name")), "")
        or _func_name(functional[0].get("metadata"))
    )
    if not fn_name:
        raise InputError(
            f"unit_tests: row {row}: functional test cases without a function name (metadata.func_name or fn_name)"
        )
    outputs = [json.loads(o) if isinstance(o, str) and _json(o) else o for o in (c.get("output") for c in functional)]
    snippets = _call_snippets(fn_name, [c.get("input") for c in functional], outputs, row)
    snippets = snippets[:max_cases] if max_cases else snippets
    return sandbox.Job("", snippets, None) if snippets else None


def _call_snippets(fn_name: str, inputs: list, outputs: list, row: int) -> list[str]:
    """Call-based cases (APPS/TACO `fn_name`) as test snippets, compared as APPS's grader compares."""
    if not fn_name.isidentifier():
        raise InputError(f"unit_tests: row {row}: fn_name {fn_name!r} is not a Python identifier")
    out = []
    for args, expected in zip(inputs, outputs):
        if isinstance(args, str):
            try:
                args = [json.loads(line) for line in args.splitlines() if line.strip()]
            except ValueError:
                args = [args]
        if not isinstance(args, list):
            args = [args]
        out.append(
            f"try:\n    _f = {fn_name}\nexcept NameError:\n    _f = Solution().{fn_name}\n"
            f"_out = _f(*{args!r})\n_exp = {expected!r}\n"
            "if isinstance(_out, tuple):\n    _out = list(_out)\n"
            "assert _out == _exp or (isinstance(_exp, list) and len(_exp) > 0 and _out == _exp[0]), f'got {_out!r}'\n"
        )
    return out


def program_cases(columns: dict[str, Any], row: int) -> tuple[list[tuple[str, str]] | None, str | None]:
    """(stdin/stdout cases, None) or (None, fn_name) for a call-based row, from the row's own format;
    (None, None) when the row has no such tests. Call-based rows also fill `columns["_calls"]`."""

    def col(name: str) -> Any:
        values = columns.get(name)
        return None if values is None else values[row]

    io_spec = _mapping(col("input_output"), row, "input_output")
    if io_spec is not None:
        inputs, outputs = io_spec.get("inputs") or [], io_spec.get("outputs") or []
        if len(inputs) != len(outputs):
            raise InputError(f"unit_tests: row {row}: input_output has {len(inputs)} inputs and {len(outputs)} outputs")
        if io_spec.get("fn_name"):
            return None, str(io_spec["fn_name"])
        return [(_text(i), _text(o)) for i, o in zip(inputs, outputs)] or None, None
    info = _mapping(col("verification_info"), row, "verification_info")
    if info is not None:
        cases = info.get("test_cases") or []
        if not isinstance(cases, list):
            raise InputError(f"unit_tests: row {row}: verification_info.test_cases must be a list")
        kinds = {str(c.get("type", "stdin_stdout")) for c in cases if isinstance(c, dict)}
        if kinds <= {"stdin_stdout", "stdin", "stdio"}:
            return [
                (_text(c.get("input", "")), _text(c.get("output", ""))) for c in cases if isinstance(c, dict)
            ] or None, None
        return None, str(
            info.get("fn_name")
            or next((c.get("fn_name") for c in cases if isinstance(c, dict) and c.get("fn_name")), "")
            or ""
        )
    cases: list[tuple[str, str]] = []
    for name in ("public_tests", "private_tests", "generated_tests"):
        spec = _mapping(col(name), row, name)
        if spec:
            ins, outs = spec.get("input") or [], spec.get("output") or []
            cases += [(_text(i), _text(o)) for i, o in zip(ins, outs)]
    return cases or None, None


def row_job(
    row: int,
    columns: dict[str, Any],
    prompt: Any = None,
    *,
    case_timeout_s: float = 2.0,
    float_tolerance: float | None = None,
    max_cases: int | None = None,
) -> sandbox.Job | None:
    """What the judge needs for row `row` (its code left empty), from whichever format the row itself
    uses (see the module doc); None when it has no tests."""

    def col(name: str) -> Any:
        values = columns.get(name)
        return None if values is None else values[row]

    options = dict(case_timeout_s=case_timeout_s, float_tolerance=float_tolerance, max_cases=max_cases)
    cases = _case_list(col("tests"), row, "tests")
    if cases is not None:  # DeepCoder
        return _cases_job(cases, _func_name(col("metadata")), row, options)
    tests = _snippets(col("tests"), row, "tests")
    if tests:
        return sandbox.Job("", tests, _entry_point(col("entry_point"), row))
    lcb = [
        c
        for name in ("public_test_cases", "private_test_cases")
        for c in _case_list(col(name), row, name, compressed=True) or []
    ]
    if lcb:  # LiveCodeBench
        return _cases_job(lcb, _func_name(col("metadata")), row, options)
    test_list = _snippets(col("test_list"), row, "test_list")
    if test_list:
        imports = col("test_imports") or []
        imports = [imports] if isinstance(imports, str) else list(imports)
        setup_code = col("test_setup_code") or ""
        setup = "".join(f"{line}\n" for line in imports) + (f"{setup_code.rstrip()}\n" if setup_code.strip() else "")
        return sandbox.Job("", test_list, None, setup or None)
    test, entry = col("test"), col("entry_point")
    if test and entry:
        return sandbox.Job("", [humaneval_snippet(test, entry)], entry, prompt_code(prompt))
    if isinstance(test, str) and test.strip():  # KodCode: a pytest file
        return sandbox.Job("", pytest_file_snippets(test), None)
    cases, fn_name = program_cases(columns, row)
    if cases:
        cases = cases[:max_cases] if max_cases else cases
        # a row as APPS and TACO publish it
        apps = col("input_output") is not None and bool(col("url")) and bool(col("difficulty"))
        return sandbox.Job(
            "", [], None, None, "programs", cases, case_timeout_s, float_tolerance, "apps" if apps else None
        )
    if fn_name:
        spec = _mapping(col("input_output"), row, "input_output") or {}
        snippets = _call_snippets(fn_name, spec.get("inputs") or [], spec.get("outputs") or [], row)
        if not snippets:
            info = _mapping(col("verification_info"), row, "verification_info") or {}
            calls = [c for c in info.get("test_cases") or [] if isinstance(c, dict)]
            snippets = _call_snippets(
                fn_name,
                [c.get("input") for c in calls],
                [
                    json.loads(c["output"])
                    if isinstance(c.get("output"), str) and _json(c["output"])
                    else c.get("output")
                    for c in calls
                ],
                row,
            )
        snippets = snippets[:max_cases] if max_cases else snippets
        return sandbox.Job("", snippets, None) if snippets else None
    return None


def _json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def evaluates(tests: list[str]) -> str | None:
    """What in the tests evaluates a string or unpickles bytes (`eval(...)`, `builtins.exec`,
    `import pickle`), or None."""
    for i, snippet in enumerate(tests):
        try:
            tree = ast.parse(snippet)
        except (SyntaxError, ValueError, RecursionError):
            continue
        for node in ast.walk(tree):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            # re.compile is not Python's compile
            if name in EVALUATING and not (name == "compile" and isinstance(node, ast.Attribute)):
                return f"`{name}` in test {i + 1}, line {node.lineno}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m.split(".")[0] in UNPICKLING for m in modules):
                    return f"an import of {modules[0]} in test {i + 1}, line {node.lineno}"
    return None
