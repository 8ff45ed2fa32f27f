"""A stage's fingerprint, and the version of the code that can change its result.

fingerprint = sha256 of: the stage's name, its part of the resolved recipe, its inputs' digests (never
local paths), how it is launched, and `code_version(stage)`. A completed, intact version with the same
fingerprint is reused; that is how a rerun, a UI retry or a nightly run resumes.

`code_version(stage)` is a digest of what the code *does*, not where it lives: the set of the stage's
module and every module of `regimen.stages` it imports, transitively (imports are read with `ast`,
including those inside functions, plus module names written as strings such as `_BUILTIN_MODULES`), the
package `__init__` of each, the files a module lists in `CODE_FILES`, and the versions of the libraries
that compute results (TRL, transformers, torch, peft, accelerate, datasets). Each module enters as its
syntax tree (`code_digest`): without docstrings, line numbers or comments, and with the names of our own
modules in its imports and module strings blanked out, and its imports as one sorted set wherever they
stand; the closure enters as the sorted list of those digests, keyed by nothing else. So reformatting a
file, editing a comment or a docstring, moving an import to the top of the file or into a function,
moving a helper module to another folder or renaming it reruns nothing, while a change to what a function
computes reruns every stage whose closure holds it. (A module whose tree is empty, an `__init__` with only a docstring,
is left out: a move that adds such a package changes nothing either.) Left out on purpose, because they
cannot change what a stage computes:
- presentation (`regimen.flows`: tables, plots, report, status), which stages never import;
- the contract, errors, registry, runner, store and this module (they move results, not make them);
- the recipe module: its effect on a stage enters the fingerprint as the resolved section itself.
So a typo fixed in a plot reruns nothing, and an edit to `grpo.py` reruns GRPO and what consumes it.

Written here rather than taken from `modulefinder`: that one imports nothing but also follows every
third-party import (torch, transformers: seconds per stage) and does not see imports inside functions.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
import json
import platform
import re
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

PACKAGE = "regimen.stages"
NOT_RESULT = (
    "regimen.stages.core",
    "regimen.stages.registry",
    "regimen.stages.run.runner",
    "regimen.stages.store",
    "regimen.stages.recipe",
)
LIBRARIES = ("trl", "transformers", "torch", "peft", "accelerate", "datasets")
_MODULE_STRING = re.compile(r"^regimen\.stages(\.\w+)+$")


def digest(payload: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def _excluded(name: str) -> bool:
    return any(name == x or name.startswith(x + ".") for x in NOT_RESULT)


@functools.cache
def _origin(name: str) -> str | None:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    return spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None


def _imports(name: str, path: str) -> tuple[set[str], list[str]]:
    """Modules of our package that `name` imports (statically), and the CODE_FILES it declares. Parsed once
    per file content in a process (keyed by the file's size and mtime: an edited file is parsed again), as
    six stages' closures share most of their files and parsing is most of a code version's cost."""
    st = Path(path).stat()
    ours, files = _parsed_imports(name, path, st.st_mtime_ns, st.st_size)
    return set(ours), list(files)


@functools.lru_cache(maxsize=1024)
def _parsed_imports(name: str, path: str, mtime_ns: int, size: int) -> tuple[frozenset[str], tuple[str, ...]]:
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), path)
    is_pkg = path.endswith("__init__.py")
    package = name if is_pkg else name.rpartition(".")[0]
    found: set[str] = set()
    files: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)  # `from pkg import submodule`
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            found.add(node.value)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "CODE_FILES" for t in node.targets
        ):
            files += list(ast.literal_eval(node.value))
    ours = frozenset(m for m in found if m.startswith(PACKAGE + ".") and _origin(m))
    return ours, tuple(str(Path(path).parent / f) for f in files)


def closure(module: str) -> list[str]:
    """The source files whose content can change what `module` computes (sorted)."""
    seen: set[str] = set()
    files: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        if name in seen or _excluded(name) or name == PACKAGE:
            continue
        seen.add(name)
        path = _origin(name)
        if path is None:
            continue
        files.add(path)
        parent = name.rpartition(".")[0]
        if parent.startswith(PACKAGE + "."):
            todo.append(parent)  # its __init__ runs on import
        deps, extra = _imports(name, path)
        files.update(extra)
        todo += sorted(deps)
    return sorted(files)


@functools.cache
def library_versions() -> dict[str, str]:
    out = {}
    for lib in LIBRARIES:
        try:
            out[lib] = version(lib)
        except PackageNotFoundError:
            out[lib] = "absent"
    return out


@functools.cache
def environment() -> dict[str, str]:
    """What a manifest records of the software that made it: Python and the libraries that compute results
    (the same versions enter every code version), plus Prefect and Regimen, which do not change results."""
    out = {"python": platform.python_version(), **library_versions()}
    for dist in ("prefect", "regimen-rl"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "absent"
    return out


def cpu_capability() -> str | None:
    """The CPU instruction set torch's kernels use here (`AVX512`, `AVX2`, `DEFAULT`; `ATEN_CPU_CAPABILITY`
    lowers it), or None without torch."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        return None


OURS = "<regimen module>"
"""What an import of one of our modules, or a module name written as a string, reads as in a code digest."""


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


class _Normalise(ast.NodeTransformer):
    """A module's tree as it enters a code digest: docstrings dropped, our modules' names blanked, annotations
    written as strings read as the expressions they name, and every import taken out of wherever it stands
    (module, class, function, `if` or `try` block) into `imports`, one name per import, which the digest
    holds as one sorted set. So the order of imports, how names are grouped into statements (what an import
    sorter changes) and whether an import sits at the top or inside the function that uses it (moving it
    there) leave no trace, while importing something else does."""

    def __init__(self) -> None:
        self.imports: set[str] = set()

    def generic_visit(self, node):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            if _is_docstring(node.body[0]):
                node.body = node.body[1:]
        for field in ("annotation", "returns"):
            value = getattr(node, field, None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                try:
                    setattr(node, field, ast.parse(value.value, mode="eval").body)
                except SyntaxError:
                    pass
        node = super().generic_visit(node)
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                setattr(node, field, [n for n in block if not self._took(n)])
        return node

    def _took(self, node: ast.stmt) -> bool:
        if isinstance(node, ast.Import):
            self.imports.update(ast.dump(ast.Import(names=[a])) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            self.imports.update(
                ast.dump(ast.ImportFrom(module=node.module, names=[a], level=node.level)) for a in node.names
            )
        else:
            return False
        return True

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            if alias.name == PACKAGE or alias.name.startswith(PACKAGE + "."):
                alias.name = OURS
        return node

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.level or (node.module or "").startswith(PACKAGE):
            node.module, node.level = OURS, 0
        return node

    def visit_Constant(self, node: ast.Constant):
        if isinstance(node.value, str) and _MODULE_STRING.match(node.value):
            return ast.Constant(OURS)
        return node


@functools.lru_cache(maxsize=1024)
def _code_digest(path: str, mtime_ns: int, size: int) -> str | None:
    text = Path(path).read_bytes()
    if not path.endswith(".py"):
        return hashlib.sha256(text).hexdigest()
    normalise = _Normalise()
    tree = normalise.visit(ast.parse(text, path))
    if not tree.body and not normalise.imports:
        return None
    h = hashlib.sha256(ast.dump(tree, annotate_fields=False, include_attributes=False).encode())
    h.update("\n".join(sorted(normalise.imports)).encode())
    return h.hexdigest()


def code_digest(path: str | Path) -> str | None:
    """What a source file computes, as a digest: a Python module's normalised syntax tree (None when it is
    empty: a package `__init__` holding only a docstring), any other file's bytes. Cached per file content
    in a process (keyed by size and mtime)."""
    st = Path(path).stat()
    return _code_digest(str(path), st.st_mtime_ns, st.st_size)


@functools.cache
def code_version(module: str) -> str:
    """A short digest of the code that can change `module`'s result (see the module doc)."""
    digests = sorted(d for path in closure(module) if (d := code_digest(path)) is not None)
    h = hashlib.sha256("\n".join(digests).encode())
    h.update(json.dumps(library_versions(), sort_keys=True).encode())
    return h.hexdigest()[:16]


def content_digest(manifest: dict[str, Any]) -> str | None:
    """What a version's model is, byte for byte: a digest of the sha256 its manifest records for each
    file under `model/` (None when it holds no model). A stage rerun after its version was damaged can
    produce other weights under the same fingerprint (non-deterministic kernels, another machine); a
    consumer's fingerprint includes this, so an evaluation is reused only for the weights it measured."""
    files = {rel: sha for rel, sha in (manifest.get("files") or {}).items() if rel.startswith("model/")}
    return digest(files)[:32] if files else None


def input_digests(inputs: dict[str, Any]) -> dict[str, Any]:
    """Inputs as they enter the fingerprint: references by fingerprint and content digest, never by
    local path."""
    out: dict[str, Any] = {}
    for key, value in inputs.items():
        if isinstance(value, dict) and "fingerprint" in value:
            out[key] = {"stage": value.get("stage"), "fingerprint": value["fingerprint"]}
            if value.get("content"):
                out[key]["content"] = value["content"]
        elif isinstance(value, list):
            out[key] = [input_digests(v) if isinstance(v, dict) else v for v in value]
        else:
            out[key] = value
    return out


@functools.lru_cache(maxsize=4096)
def _file_digest(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def file_digest(path: str | Path) -> str:
    """sha256 of a file's content, computed once per (path, size, mtime) in this process."""
    p = Path(path).resolve()
    st = p.stat()
    return _file_digest(str(p), st.st_size, st.st_mtime_ns)


def tree_digest(root: str | Path) -> str:
    """sha256 over every file under `root` (relative names and contents): a model folder's identity."""
    root = Path(root)
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(root).as_posix().encode() + b"\0" + file_digest(p).encode() + b"\0")
    return h.hexdigest()
