"""A code dataset's row as the sandbox's job, in whatever format the row itself uses, and the checks at
the door.

Each row is read in its own format, so one dataset may mix them (a column that is None or empty for a
row does not hide that row's own format):

- `tests`: Python snippets (a single string is one snippet; a string holding a JSON list is that list),
  with the row's `entry_point`, if any, as the function under test;
- `test_list` (MBPP): its asserts; `test_imports` and `test_setup_code` run once before them, as trusted
  set-up code;
- `test` + `entry_point` (HumanEval): one snippet that defines `check` and calls it on the entry point;
  the prompt's code (`solutions.prompt_code`) is the trusted set-up code, so helpers it defines (`poly`,
  `encode_cyclic`) are the dataset's, not the solution's;
- stdin/stdout problems, judged as programs, one run per case:
  - `input_output` (APPS, TACO): a JSON string or mapping with `inputs` and `outputs`; with `fn_name` the
    row is call-based instead (each input a list of arguments, compared as APPS's grader compares: the
    value, or the first item of an expected list, tuples as lists; a `Solution` class's method counts),
  - `verification_info` (open-r1, DeepCoder): `{language, test_cases: [{input, output, type}]}` with type
    `stdin_stdout` (or `function_call` with `fn_name`, inputs as JSON lists of arguments),
  - CodeContests: `public_tests`, `private_tests`, `generated_tests`, each `{input: [...], output: [...]}`.

A row with none of them has no opinion from `unit_tests` (None).

At the door (`door`), before anything trains, every row is checked: tests that evaluate strings
(`eval`, `exec`, `compile`, `pickle`/`marshal` loads) are refused unless the reward allows them
(`allow_eval`: those strings then run in the solution's process, never the judge's); pytest-style tests
that need fixtures are refused (they cannot run outside pytest); and rows whose tests pass with no
solution at all (an empty program) are reported: they pay anything. The reward leaves those out (None).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any

from regimen.stages import sandbox
from regimen.stages.errors import InputError
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
    prefix = "".join(f"{line}\n" for line in test_imports) + (f"{test_setup_code.rstrip()}\n" if test_setup_code and test_setup_code.strip() else "")
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
    raise InputError(f"unit_tests: row {row}: `{column}` must be a list of Python snippets (strings), got {type(value).__name__}")


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
            "assert _out == _exp or (isinstance(_exp, list) and len(_exp) > 0 and _out == _exp[0]), f'got {_out!r}'\n")
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
            return [(_text(c.get("input", "")), _text(c.get("output", ""))) for c in cases if isinstance(c, dict)] or None, None
        return None, str(info.get("fn_name") or next((c.get("fn_name") for c in cases if isinstance(c, dict) and c.get("fn_name")), "") or "")
    cases: list[tuple[str, str]] = []
    for name in ("public_tests", "private_tests", "generated_tests"):
        spec = _mapping(col(name), row, name)
        if spec:
            ins, outs = spec.get("input") or [], spec.get("output") or []
            cases += [(_text(i), _text(o)) for i, o in zip(ins, outs)]
    return cases or None, None


def row_job(row: int, columns: dict[str, Any], prompt: Any = None, *, case_timeout_s: float = 2.0, float_tolerance: float | None = None,
            max_cases: int | None = None) -> sandbox.Job | None:
    """What the judge needs for row `row` (its code left empty), from whichever format the row itself
    uses (see the module doc); None when it has no tests."""

    def col(name: str) -> Any:
        values = columns.get(name)
        return None if values is None else values[row]

    tests = _snippets(col("tests"), row, "tests")
    if tests:
        return sandbox.Job("", tests, _entry_point(col("entry_point"), row))
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
    cases, fn_name = program_cases(columns, row)
    if cases:
        cases = cases[:max_cases] if max_cases else cases
        return sandbox.Job("", [], None, None, "programs", cases, case_timeout_s, float_tolerance)
    if fn_name:
        spec = _mapping(col("input_output"), row, "input_output") or {}
        snippets = _call_snippets(fn_name, spec.get("inputs") or [], spec.get("outputs") or [], row)
        if not snippets:
            info = _mapping(col("verification_info"), row, "verification_info") or {}
            calls = [c for c in info.get("test_cases") or [] if isinstance(c, dict)]
            snippets = _call_snippets(fn_name, [c.get("input") for c in calls], [json.loads(c["output"]) if isinstance(c.get("output"), str) and _json(c["output"]) else c.get("output") for c in calls], row)
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
            if name in EVALUATING and not (name == "compile" and isinstance(node, ast.Attribute)):  # re.compile is not Python's compile
                return f"`{name}` in test {i + 1}, line {node.lineno}"
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if any(m.split(".")[0] in UNPICKLING for m in modules):
                    return f"an import of {modules[0]} in test {i + 1}, line {node.lineno}"
    return None
