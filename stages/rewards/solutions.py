"""Finding the solution in what a model wrote, as a person would, and the code in a prompt.

The rule for a completion (`find_solution`):

1. Its Python blocks are the fenced blocks tagged `python`, `python3`, `py`, `py3` or not tagged at all, in
   order; a last fence that never closes (a truncated answer) runs to the end. Blocks in other languages
   (```bash, ```json, ```text, ```output) are never code to run. A completion without any fence is one
   block, the whole text.
2. Programs (stdin/stdout problems): the last Python block that reads its input (`input(`, `sys.stdin`,
   `open(0)`, `fileinput`), else the last Python block.
3. Functions: the blocks that define (at module level: `def`, `class`, an assignment or an import) a
   name the tests need (the entry point, or the names the tests use without defining them), then the
   blocks defining what those use (a helper in another block), in the completion's order. Blocks that
   only use the solution (a usage example, prints, asserts of the model's own) are left out: a plain
   harness would not run the model's examples either. When no block defines a needed name, the last
   Python block.
4. A continuation of a code prompt (as base models write, and HumanEval's own harness judges): when
   the chosen code defines no needed name but the prompt's code does (a stub: signature and docstring),
   the solution is the prompt's code followed by the completion as written (an indented body), if that
   compiles.

The prompt's code (`prompt_code`): the prompt itself when it compiles; else its last fenced Python block
that compiles; else, for prose around unfenced code (a chat message, or a prompt with the chat template
already applied), the longest run of lines that compiles from the first line that starts a definition
(`def`, `class`, `import`, `from ... import`, a decorator).
"""

from __future__ import annotations

import ast
import functools
import re
import textwrap
from typing import Any

_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*?\r?\n(.*?)^[ \t]*```[ \t]*$", re.DOTALL | re.MULTILINE)
_OPEN_FENCE = re.compile(r"^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*?\r?\n(.*)\Z", re.DOTALL | re.MULTILINE)
PYTHON_TAGS = {"", "python", "python3", "py", "py3"}
_READS_STDIN = re.compile(r"\binput\s*\(|sys\.stdin|\bopen\(\s*0\s*[,)]|\bfileinput\b")
_STARTS_CODE = re.compile(r"^(def |async def |class |import |from \S+ import |@)")


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(tag, code) of every fenced block, in order; a last unclosed fence runs to the end."""
    blocks, end = [], 0
    for match in _FENCE.finditer(text):
        blocks.append((match.group(1).lower(), match.group(2)))
        end = match.end()
    unclosed = _OPEN_FENCE.search(text, end)
    if unclosed:
        blocks.append((unclosed.group(1).lower(), unclosed.group(2)))
    return blocks


def python_blocks(text: str) -> list[str]:
    """The completion's Python code, block by block (rule 1)."""
    blocks = fenced_blocks(text)
    if not blocks:
        return [text]
    return [code for tag, code in blocks if tag in PYTHON_TAGS]


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
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    used |= {n.value.id for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
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
    return used - own


def find_solution(text: str, *, needs: set[str] | None = None, prompt_code: str | None = None, programs: bool = False) -> str:
    """The code to judge in a completion (see the module doc for the rule)."""
    blocks = python_blocks(text)
    if not blocks:
        return ""
    if programs:
        reading = [b for b in blocks if _READS_STDIN.search(b)]
        return textwrap.dedent((reading or blocks)[-1])
    needs = set(needs or ())
    kept = _defining(blocks, needs) if needs else []
    if kept:
        return "\n".join(textwrap.dedent(blocks[i]).rstrip() + "\n" for i in kept)
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
        text = "\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role", "user") in ("user", "system"))
    else:
        return None
    return _prompt_code(text) if text.strip() else None


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
