"""Finding the solution in what a model wrote, as a person would, and the code in a prompt.

The rule for a completion (`find_solution`):

0. Line endings are made `\n` first (CRLF or a lone CR anywhere in the text, as models trained on
   Windows text write them).
1. Its Python blocks are the fenced blocks (``` or ~~~ fences, three or more, closed by a fence of the
   same character at least as long, as CommonMark reads them) tagged `python`, `python3`, `py`, `py3` or
   not tagged at all, in order; a last fence that never closes (a truncated answer) runs to the end.
   Blocks in other languages (```bash, ```json, ```text, ```output) are never code to run. A completion
   without any fence is one block, the whole text, when it compiles; else its code between prose
   paragraphs: each longest run of lines that compiles from a line that starts a statement (`def`,
   `class`, an import, an assignment, a call, `for`/`while`/`if`/...), the prose lines left out.
2. Programs (stdin/stdout problems): the last Python block that reads its input (`input(`, `sys.stdin`,
   `open(0)`, `fileinput`), else the last Python block; a block that feeds sample input to the program
   (`sys.stdin = io.StringIO(...)`, a replaced `input`) and runs it is a usage example, never the
   program. Definitions the program uses from other blocks (a `def solve` above the block that reads
   the input) are put before it, without those blocks' other statements; a later block that only
   redefines the program's functions ("the fix: `solve` should ...") replaces them in it.
3. Functions: the blocks that define (at module level: `def`, `class`, an assignment or an import) a
   name the tests need (the entry point, or the names the tests use without defining them), then the
   blocks defining what those use (a helper in another block), in the completion's order. Blocks that
   only use the solution (a usage example, prints, asserts of the model's own) are left out: a plain
   harness would not run the model's examples either. When no block defines a needed name, the last
   Python block. A block whose definitions a later block redefines ("here is the corrected version")
   is an earlier attempt: the later definition is the answer, and of the earlier block only the
   definitions and imports the answer may still use are kept (its own examples, prints and asserts,
   which may fail on the attempt it corrects, are not run).
4. A continuation of a code prompt (as base models write, and HumanEval's own harness judges): when
   the chosen code defines no needed name but the prompt's code does (a stub: signature and docstring),
   the solution is the prompt's code followed by the completion as written (an indented body), if that
   compiles.

The prompt's code (`prompt_code`): the prompt itself when it compiles; else its last fenced Python block
that compiles; else, for prose around unfenced code (a chat message, or a prompt with the chat template
already applied), the longest run of lines that compiles from the first line that starts a definition
(`def`, `class`, `import`, `from ... import`, a decorator).

The fences are read line by line here rather than by a Markdown parser (markdown-it-py comes with rich):
a model's answer is often not well-formed Markdown, and a CommonMark parser reads some of what models
write otherwise than a person does (a fence indented by four spaces is an indented code block to it, an
unclosed fence in a list item ends with the item).
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from typing import Any

_OPENING = re.compile(r"^[ \t]*(`{3,}|~{3,})[ \t]*([\w+#.-]*)[^\n]*$")
PYTHON_TAGS = {"", "python", "python3", "py", "py3"}
_READS_STDIN = re.compile(r"\binput\s*\(|sys\.stdin|\bopen\(\s*0\s*[,)]|\bfileinput\b")
_FEEDS_STDIN = re.compile(
    r"\bsys\.stdin\s*=(?!=)|\bredirect_stdin\b|^\s*(builtins\.)?input\s*=(?!=)|\bsys\.stdin\.write\b|mock\.patch\([^)]*input",
    re.MULTILINE,
)
_STARTS_CODE = re.compile(r"^(def |async def |class |import |from \S+ import |@)")
_STARTS_STATEMENT = re.compile(
    r"^(def|async|class|import|from|for|while|if|with|try|print|assert)\b"
    r"|^@\w|^[a-z_][\w.]*(\[[^\]]*\])?(\s*,\s*[a-z_][\w.]*)*\s*([-+*/%|&^]|//|\*\*|<<|>>)?=(?!=)|^[a-z_][\w.]*\("
)
_KEYWORD_LINE = re.compile(r"^(return|raise|pass|break|continue|else|elif|except|finally|yield|del|nonlocal|global)\b")
_COMPILE_BUDGET = 2000
"""Compilations spent at most looking for code between prose in one completion."""


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n") if "\r" in text else text


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, code) of every fenced block (``` or ~~~), in order; a last unclosed fence runs to the end."""
    lines = _newlines(text).split("\n")
    blocks, i = [], 0
    while i < len(lines):
        opening = _OPENING.match(lines[i])
        if not opening or (opening.group(1)[0] == "`" and "`" in lines[i][opening.end(1) :]):
            i += 1
            continue
        fence = opening.group(1)
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        body = lines[i + 1 : j]
        blocks.append((opening.group(2).lower(), "\n".join(body) + ("\n" if body and j < len(lines) else "")))
        i = j + 1
    return blocks


def python_blocks(text: str) -> list[str]:
    """The completion's Python code, block by block (rule 1)."""
    text = _newlines(text)
    blocks = fenced_blocks(text)
    if not blocks:
        return [text] if _compiles(text) or not text.strip() else (code_between_prose(text) or [text])
    return [code for tag, code in blocks if tag in PYTHON_TAGS]


def code_between_prose(text: str) -> list[str]:
    """The runs of code in unfenced text (rule 1): from each line that starts a statement, the longest
    run of lines that compiles; the prose around them left out. None ([]) when a line of code is left
    outside every run: that is broken code, not prose, and a plain harness would fail it whole."""
    lines = _newlines(text).split("\n")
    runs, start, budget = [], 0, _COMPILE_BUDGET
    covered: set[int] = set()
    while start < len(lines) and budget > 0:
        if not _STARTS_STATEMENT.match(lines[start]):
            start += 1
            continue
        end = len(lines)
        while end > start and budget > 0:
            budget -= 1
            chunk = "\n".join(lines[start:end]) + "\n"
            error = _syntax_error_line(chunk)
            if error is None:
                break
            end = start + error - 1 if 0 < error <= end - start else end - 1
        if end > start and budget > 0:
            runs.append(textwrap.dedent("\n".join(lines[start:end]).rstrip("\n") + "\n"))
            covered.update(range(start, end))
            start = end
        else:
            start += 1
    if any(
        i not in covered and (_STARTS_STATEMENT.match(line.lstrip()) or _KEYWORD_LINE.match(line.lstrip()))
        for i, line in enumerate(lines)
    ):
        return []  # a line of code is left over: broken code, not code between prose (judged whole, as `exec` would)
    return runs


@functools.lru_cache(maxsize=4096)
def _names(code: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """(names bound at module level, names used anywhere) of `code`; None when it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    bound: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.For, ast.With)):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                    bound.add(sub.id)
        elif isinstance(node, (ast.If, ast.Try)):  # `try: import x` / `if ...: def f` still define at module level
            for sub in ast.walk(node):
                if isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    bound.add(sub.name)
                elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                    bound.update((a.asname or a.name).split(".")[0] for a in sub.names)
    used: set[str] = set()
    for n in ast.walk(tree):  # one walk: names read, and the names whose attributes are read
        if type(n) is ast.Name:
            if type(n.ctx) is ast.Load:
                used.add(n.id)
        elif type(n) is ast.Attribute and type(n.value) is ast.Name:
            used.add(n.value.id)
    return frozenset(bound), frozenset(used)


def needed_names(tests: list[str], entry_point: str | None, setup: str | None) -> set[str]:
    """What the tests need from a solution: the entry point, or the names they use without defining them
    (nor their trusted set-up code)."""
    if entry_point:
        return {entry_point}
    used: set[str] = set()
    own: set[str] = set()
    for code in [*tests, setup or ""]:
        names = _names(code)
        if names is not None:
            own |= names[0]
            used |= names[1]
    if setup and (names := _names(setup)) is not None:
        own |= names[0]
    return (used - own) | set().union(*(_imported_from_solution(t) for t in tests), set())


@functools.lru_cache(maxsize=4096)
def _imported_from_solution(code: str) -> frozenset[str]:
    """The names a test file takes from the solution as a module (`from solution import f`, `solution.f`)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    names = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "solution" and not n.level
        for a in n.names
        if a.name != "*"
    }
    names |= {
        n.attr
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "solution"
    }
    return frozenset(names)


def find_solution(
    text: str, *, needs: set[str] | None = None, prompt_code: str | None = None, programs: bool = False
) -> str:
    """The code to judge in a completion (see the module doc for the rule)."""
    blocks = python_blocks(text)
    if not blocks:
        return ""
    if programs:
        return _program(blocks)
    needs = set(needs or ())
    kept = _defining(blocks, needs) if needs else []
    if kept:
        return _joined(blocks, kept)
    chosen = blocks[-1]
    if prompt_code and needs:
        defined = _names(prompt_code)
        if defined is not None and defined[0] & needs:
            joined = prompt_code.rstrip("\n") + "\n" + chosen if not chosen.startswith("\n") else prompt_code + chosen
            if _names(joined) is not None:
                return joined
    return textwrap.dedent(chosen)


def _defining(blocks: list[str], needs: set[str]) -> list[int]:
    """Indices of the blocks defining a needed name, and of those defining what they use, in order."""
    names = [_names(textwrap.dedent(b)) for b in blocks]
    kept = {i for i, n in enumerate(names) if n is not None and n[0] & needs}
    if not kept:
        return []
    changed = True
    while changed:
        changed = False
        wanted = set().union(*(names[i][1] for i in kept)) - set().union(*(names[i][0] for i in kept))  # type: ignore[index]
        for i, n in enumerate(names):
            if i not in kept and n is not None and n[0] & wanted:
                kept.add(i)
                changed = True
    return sorted(kept)


def _program(blocks: list[str]) -> str:
    """The program among the blocks (rule 2), after the definitions it uses from other blocks."""
    runs = [textwrap.dedent(b) for b in blocks if not _FEEDS_STDIN.search(b)] or [textwrap.dedent(b) for b in blocks]
    reading = [i for i, b in enumerate(runs) if _READS_STDIN.search(b)]
    chosen = (reading or [len(runs) - 1])[-1]
    names = _names(runs[chosen])
    if names is None:
        return runs[chosen]
    missing = set(names[1]) - set(names[0]) - _BUILTINS
    helpers = []
    for i, block in enumerate(runs):
        other = _names(block)
        if i != chosen and other is not None and other[0] & missing:
            helpers.append(_definitions_only(block, set(names[1])))
    program = runs[chosen]
    for later in runs[chosen + 1 :]:  # "the fix": a later block that only redefines the program's functions
        program = _corrected(program, later)
    return "".join(h.rstrip() + "\n\n" for h in helpers if h.strip()) + program


def _corrected(program: str, later: str) -> str:
    """`program` with each function or class that `later` redefines replaced by `later`'s definition, when
    `later` holds definitions and imports only (a corrected function after the program, rule 2)."""
    try:
        tree, fix = ast.parse(program), ast.parse(later)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return program
    if not fix.body or not all(
        isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom))
        for n in fix.body
    ):
        return program
    fixes = {n.name: n for n in fix.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    lines, fix_lines = program.split("\n"), later.split("\n")

    def span(node: ast.stmt) -> tuple[int, int]:
        return min(
            [node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]
        ) - 1, node.end_lineno or node.lineno

    replaced = [
        (span(n), n.name)
        for n in tree.body
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name in fixes
    ]
    if not replaced:
        return program
    imports = [fix_lines[span(n)[0] : span(n)[1]] for n in fix.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    for (start, end), name in sorted(replaced, reverse=True):
        a, b = span(fixes[name])
        lines[start:end] = fix_lines[a:b]
    return "".join("\n".join(i) + "\n" for i in imports) + "\n".join(lines)


_BUILTINS = frozenset(dir(__import__("builtins")))


def _joined(blocks: list[str], kept: list[int]) -> str:
    """The kept blocks in order; an earlier attempt (a block a later kept block redefines) reduced to the
    definitions the answer may still use (rule 3)."""
    codes = [textwrap.dedent(blocks[i]) for i in kept]
    names = [_names(code) for code in codes]
    used = set().union(*(n[1] for n in names if n is not None))
    out = []
    for k, code in enumerate(codes):
        later = set().union(*(n[0] for n in names[k + 1 :] if n is not None), set())
        own = names[k]
        redefined = _defined_functions(code) & later if own is not None else frozenset()
        kept_code = _definitions_only(code, used, redefined) if redefined else code
        if kept_code.strip():
            out.append(kept_code.rstrip() + "\n")
    return "\n".join(out)


@functools.lru_cache(maxsize=4096)
def _defined_functions(code: str) -> frozenset[str]:
    """The functions and classes `code` defines at module level."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    return frozenset(n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))


def _definitions_only(code: str, used: set[str], dropped: frozenset[str] = frozenset()) -> str:
    """`code`'s definitions (but those in `dropped`), imports, and assignments of names in `used`, without
    its other statements (examples, prints, asserts, a run of its program)."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    lines = code.split("\n")
    kept = []
    for node in tree.body:
        keep = isinstance(node, (ast.Import, ast.ImportFrom)) or (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name not in dropped
        )
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            keep = bool(targets & used)
        if keep:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            kept.append("\n".join(lines[first - 1 : node.end_lineno]))
    return "\n".join(kept) + "\n" if kept else ""


@functools.lru_cache(maxsize=1024)
def _prompt_code(text: str) -> str | None:
    if _compiles(text):
        return text
    for tag, code in reversed(fenced_blocks(text)):
        if tag in PYTHON_TAGS and code.strip() and _compiles(code):
            return code
    lines = text.splitlines()
    for start, line in enumerate(lines):
        if not _STARTS_CODE.match(line):
            continue
        end = len(lines)
        while end > start:
            chunk = "\n".join(lines[start:end]) + "\n"
            error = _syntax_error_line(chunk)
            if error is None:
                return chunk
            end = start + error - 1 if 0 < error <= end - start else end - 1
    return None


def prompt_code(prompt: Any) -> str | None:
    """The Python code of a prompt (see the module doc): a string, or a conversation's user and system
    messages; None when it holds none."""
    if isinstance(prompt, str):
        text = prompt
    elif isinstance(prompt, (list, tuple)):
        text = "\n".join(
            str(m.get("content", ""))
            for m in prompt
            if isinstance(m, dict) and m.get("role", "user") in ("user", "system")
        )
    else:
        return None
    return _prompt_code(_newlines(text)) if text.strip() else None


def _compiles(code: str) -> bool:
    return bool(code.strip()) and _syntax_error_line(code) is None


def _syntax_error_line(code: str) -> int | None:
    """None when `code` compiles, else the line of its first syntax error (0 when unknown)."""
    try:
        compile(code, "<prompt>", "exec", ast.PyCF_ONLY_AST)
        return None
    except SyntaxError as exc:
        return exc.lineno or 0
    except (ValueError, RecursionError, MemoryError):
        return 0
