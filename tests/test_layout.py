"""The house: one top-level import name, no import cycles, stages that never import each other (nor the
runner, nor flows, nor Prefect), and per-stage code versions that ignore presentation code."""

from __future__ import annotations

import ast
import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

from regimen.stages import registry
from regimen.stages.core import fingerprint as fp

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = {"regimen.stages": ROOT / "stages", "regimen.flows": ROOT / "flows"}


def modules() -> dict[str, Path]:
    out = {}
    for prefix, folder in FOLDERS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if "metrics" in parts:  # a shipped metric module, loaded by path
                continue
            out[".".join([prefix, *parts])] = path
    return out


MODULES = modules()


def _targets(name: str, path: Path, node: ast.stmt) -> list[str]:
    """The modules an import statement loads (ours by full name; a library by its top-level name)."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
    return [n if n in MODULES else n.split(".")[0] for n in names]


def edges(name: str, path: Path) -> set[str]:
    """Modules of ours that `name` imports anywhere in its code (top level or inside functions)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.update(t for t in _targets(name, path, node) if t in MODULES)
    return found - {name}


GRAPH = {name: edges(name, path) for name, path in MODULES.items()}

# The house as rooms, lowest first: each room is one folder (every module under it) or, for the stages, the
# stage modules at the top of stages/ that the registry lists; and the rooms it may import. Imports point down
# only; a room not listed is not importable from here. ARCHITECTURE.md's table of rooms is generated from this
# (`python tests/test_layout.py` writes it; a test checks it is current).


class Room(NamedTuple):
    prefixes: list[str]
    allowed: list[str]
    where: str
    holds: str


PIECES = ["core", "decide", "store", "tasks", "rewards", "recipe", "training", "records"]
"""Rooms ARCHITECTURE.md's table names together as "the pieces"."""

ROOMS: dict[str, Room] = {
    "sandbox": Room(
        ["regimen.stages.sandbox"],
        [],
        "`stages/sandbox/`",
        "the judge's isolation (runs as `python -I -S`): slots, process trees, the wire",
    ),
    "core": Room(
        ["regimen.stages", "regimen.stages.core"],
        [],
        "`stages/core/` (and `stages/__init__.py`)",
        "the stage contract, Regimen's errors, fingerprints and code versions",
    ),
    "decide": Room(
        ["regimen.stages.decide"],
        [],
        "`stages/decide/`",
        "pure rules: the cycle's verdicts and the guard (`verdicts`), the promotion rule (`promotion`)",
    ),
    "store": Room(
        ["regimen.stages.store"],
        ["core"],
        "`stages/store/`",
        "versioned store on disk or in a bucket, safe writes, locks and leases, checkpoints' mirror",
    ),
    "tasks": Room(
        ["regimen.stages.tasks"],
        ["core"],
        "`stages/tasks/`",
        "a registry of tasks (addition, code, jsonl, hf, tool_probe)",
    ),
    "rewards": Room(
        ["regimen.stages.rewards"],
        ["core", "sandbox"],
        "`stages/rewards/`",
        "a registry of rewards; finding the solution; code datasets' formats",
    ),
    "environments": Room(
        ["regimen.stages.environments"], ["core", "rewards"], "`stages/environments/`", "multi-turn episodes with tools"
    ),
    "recipe": Room(
        ["regimen.stages.recipe"],
        ["core", "tasks", "rewards", "environments"],
        "`stages/recipe/`",
        "the recipe's schema, sources of each value, TRL's config objects",
    ),
    "training": Room(
        ["regimen.stages.training"],
        ["core", "decide", "store", "tasks", "rewards", "environments", "recipe"],
        "`stages/training/`",
        "models, checkpoints, sampling, teachers, the probe, trajectories, curriculum, limits",
    ),
    "records": Room(
        ["regimen.stages.records"],
        ["core", "store", "tasks"],
        "`stages/records/`",
        "an experiment's frozen held-out set and data versions",
    ),
    "stages": Room(
        [s.__name__ for s in registry.ORDER],
        ["core", "decide", "store", "tasks", "rewards", "recipe", "training"],
        "`stages/{sft,distill,dry_run,smoke,grpo,evaluate}.py`",
        "one stage each",
    ),
    "registry": Room(
        ["regimen.stages.registry"],
        ["core", "stages"],
        "`stages/registry.py`",
        "the one ordered list of stages and their roles",
    ),
    "run": Room(
        ["regimen.stages.run"],
        ["core", "store", "tasks", "rewards", "recipe", "training", "registry"],
        "`stages/run/`",
        "runner (reuse or run and commit), launcher, the ranks' entry, preflight",
    ),
    "flows": Room(
        ["regimen.flows"],
        [],
        "`flows/__init__.py`",
        "the flows package itself: the settings every Prefect process of ours starts with, nothing else",
    ),
    "present": Room(
        ["regimen.flows.present"],
        ["core", "decide", "store", "rewards", "recipe", "training", "records", "registry"],
        "`flows/present/`",
        "tables, plots, report, status, what reward-check shows, the terminal, what a round changed (trajectories)",
    ),
    "serving": Room(
        ["regimen.flows.serving"],
        ["core", "store", "recipe", "run"],
        "`flows/serving/`",
        "deployments (handed the flow they serve), the work pool, the UI's allow-list (`boundary`), the temporary "
        "Prefect server, the API's health (`orchestrator`)",
    ),
    "pipeline": Room(
        ["regimen.flows.pipeline"],
        [*PIECES, "registry", "run", "present", "serving"],
        "`flows/pipeline/`",
        "the Prefect flows: the cycle, the sweep, the champion's decision in the flow, publishing artifacts",
    ),
    "cli": Room(
        ["regimen.flows.cli"],
        [
            "core",
            "store",
            "tasks",
            "rewards",
            "recipe",
            "training",
            "records",
            "registry",
            "run",
            "present",
            "serving",
            "pipeline",
        ],
        "`flows/cli/`",
        "the `regimen` command: its shell (`app`) and one module per concern of commands",
    ),
}


def architecture_table() -> str:
    """ARCHITECTURE.md's table of rooms, from ROOMS."""
    lines = ["| room | where | what it holds | may import |", "|---|---|---|---|"]
    for name, r in ROOMS.items():
        allowed = list(r.allowed)
        if set(PIECES) <= set(allowed):
            allowed = ["the pieces", *[a for a in allowed if a not in PIECES]]
        may = ", ".join(allowed) if allowed else ("the standard library only" if name == "sandbox" else "—")
        lines.append(f"| {name} | {r.where} | {r.holds} | {may} |")
    return "\n".join(lines)


def room(module: str) -> str:
    found = [
        (len(p), name)
        for name, (prefixes, *_) in ROOMS.items()
        for p in prefixes
        if module == p or module.startswith(p + ".")
    ]
    assert found, f"{module} is in no room of tests/test_layout.py's ROOMS"
    return max(found)[1]


def test_the_import_graph_has_no_cycle():
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        path.append(n)
        for m in sorted(GRAPH[n]):
            if state.get(m) == 1:
                cycle = path[path.index(m) :] + [m]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if m not in state:
                visit(m)
        path.pop()
        state[n] = 2

    for n in sorted(GRAPH):
        if n not in state:
            visit(n)


def test_imports_point_down_only():
    """Every import of one of our modules goes to the importer's own room or to one its rule allows."""
    wrong = [
        f"{m} ({room(m)}) imports {d} ({room(d)})"
        for m, deps in sorted(GRAPH.items())
        for d in sorted(deps)
        if room(d) != room(m) and room(d) not in ROOMS[room(m)].allowed
    ]
    assert wrong == []


def test_the_rooms_rule_would_catch_an_import_pointing_up():
    """The rule is not vacuous: imports that would point up (each between two modules that exist) are refused."""
    for importer, imported in [
        ("regimen.stages.run.launch_entry", "regimen.flows.pipeline.cycle"),
        ("regimen.stages.recipe.trl", "regimen.stages.training.model"),
        ("regimen.stages.rewards.code", "regimen.stages.recipe"),
        ("regimen.stages.sandbox.pool", "regimen.stages.core.errors"),
        ("regimen.stages.decide.verdicts", "regimen.stages.store"),
        ("regimen.stages.records.datasets", "regimen.stages.training.model"),
        ("regimen.stages.grpo", "regimen.stages.registry"),
    ]:
        assert importer in MODULES and imported in MODULES, (importer, imported)
        assert room(imported) not in ROOMS[room(importer)].allowed, (importer, imported)


def test_every_room_is_one_folder_or_the_stage_files_and_every_allowance_is_used():
    """Rooms map to folders one to one (the stages room: the registry's stage files at the top of stages/),
    and a room's rule allows only rooms it imports today: an allowance nobody uses is removed, not kept."""
    for name, (prefixes, *_) in ROOMS.items():
        for prefix in prefixes:
            assert prefix in MODULES, (name, prefix)
            if name != "stages" and prefix != "regimen.stages":  # a folder, or a room that is one named file
                assert MODULES[prefix].name == "__init__.py" or len(prefixes) == 1, (name, prefix)
    for name in ROOMS["stages"].prefixes:
        assert MODULES[name].parent == ROOT / "stages", name
    used = {r: set() for r in ROOMS}
    for m, deps in GRAPH.items():
        used[room(m)].update(room(d) for d in deps if room(d) != room(m))
    unused = {r: sorted(set(allowed) - used[r]) for r, (_, allowed, *_) in ROOMS.items() if set(allowed) - used[r]}
    assert unused == {}


def test_the_sandbox_imports_only_the_standard_library():
    """It runs as `python -I -S server.py` (no site-packages): a third-party or Regimen import would fail there."""
    stdlib = set(sys.stdlib_module_names)
    for name, path in MODULES.items():
        if room(name) != "sandbox":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            siblings = {p.stem for p in (ROOT / "stages" / "sandbox").glob("*.py")}
            outside = [t for t in tops if t not in stdlib and t not in siblings and t != "pyseccomp"]
            assert not outside, (name, outside)


def test_the_sandbox_reads_in_small_pieces():
    """No sandbox module over 500 lines and no function over 80: the judge's isolation is read, reviewed
    and attacked as code, so it stays in pieces a person can hold in mind."""
    for name, path in MODULES.items():
        if room(name) != "sandbox":
            continue
        tree = ast.parse(path.read_text())
        assert len(path.read_text().splitlines()) <= 500, name
        long = [
            (n.name, n.end_lineno - n.lineno + 1)
            for n in ast.walk(tree)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.end_lineno - n.lineno + 1 > 80
        ]
        assert long == [], (name, long)


def test_stages_never_import_each_other_the_runner_flows_or_prefect():
    stage_modules = {s.__name__ for s in registry.ORDER}
    assert len(stage_modules) == 6  # sft, distill, the dry run, the smoke test, grpo, eval
    for name in stage_modules:
        deps = GRAPH[name]
        assert not deps & (stage_modules | {"regimen.stages.run.runner", "regimen.stages.registry"}), (name, deps)
    for name, path in MODULES.items():
        if name.startswith("regimen.stages"):
            assert not any(d.startswith("regimen.flows") for d in GRAPH[name]), name
            text = path.read_text()
            assert "import prefect" not in text and "from prefect" not in text, name


def test_one_registry_names_every_stage_and_every_task():
    from regimen.stages.tasks.registry import TASKS

    assert registry.NAMES[:6] == ("sft", "distill", "reward-dry-run", "grpo-smoke", "grpo", "eval")
    assert [registry.in_role(r)[:2] for r in ("teach", "gate", "train")] == [
        ("sft", "distill"),
        ("reward-dry-run", "grpo-smoke"),
        ("grpo",),
    ]
    assert registry.judge() == "eval"
    for stage in registry.ORDER:
        assert (
            isinstance(stage.TRAINS, bool)
            and stage.KEY_METRICS
            and callable(stage.run)
            and callable(stage.config_section)
        )
    assert set(TASKS) >= {"addition", "code", "jsonl", "hf"}
    for task in TASKS.values():
        assert (
            task.Options.model_fields["task"].default == task.NAME and callable(task.load) and callable(task.identity)
        )


def test_pyproject_lists_every_package_folder():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {n for n, p in MODULES.items() if p.name == "__init__.py"}
    assert listed == on_disk


@pytest.mark.slow
def test_the_built_wheel_has_one_top_level_name(tmp_path):
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    [wheel] = tmp_path.glob("regimen_rl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        top = [n for n in zf.namelist() if n.endswith("top_level.txt")]
        assert top and zf.read(top[0]).decode().split() == ["regimen"]
        names = zf.namelist()
    assert not any(n.startswith(("stages/", "flows/")) for n in names)
    assert "regimen/stages/tasks/problems/code_problems.jsonl" in names
    assert "regimen/stages/training/metrics/exact_match/exact_match.py" in names


def test_code_versions_cover_what_changes_results_and_nothing_that_presents():
    closures = {s.NAME: {Path(p).relative_to(ROOT).as_posix() for p in fp.closure(s.__name__)} for s in registry.ORDER}
    for name, files in closures.items():
        assert not any(f.startswith("flows/") for f in files), name
        assert "stages/run/runner.py" not in files and "stages/store/__init__.py" not in files, name
    assert "stages/grpo.py" in closures["grpo"]
    assert all("stages/grpo.py" not in closures[n] for n in ("sft", "reward-dry-run", "grpo-smoke", "eval"))
    assert (
        "stages/training/grpo_trainer.py" in closures["grpo-smoke"]
        and "stages/training/grpo_trainer.py" in closures["grpo"]
    )
    assert "stages/rewards/code.py" in closures["eval"]  # registered by import, so a change to it reruns scoring stages
    assert "stages/rewards/scoring.py" in closures["eval"] and "stages/rewards/scoring.py" in closures["grpo"]


def code_versions_of(copy: Path, monkeypatch) -> dict[str, str]:
    """Every stage's code version as it would be with `copy` (a copy of stages/, perhaps edited) installed
    as `regimen.stages`: module names resolve to the copy's files."""

    def origin(name: str) -> str | None:
        if name != "regimen.stages" and not name.startswith("regimen.stages."):
            return None
        base = copy.joinpath(*name.split(".")[2:])
        for path in (base.with_suffix(".py"), base / "__init__.py"):
            if path.is_file():
                return str(path)
        return None

    monkeypatch.setattr(fp, "_origin", origin)
    fp.code_version.cache_clear()
    try:
        return {s.NAME: fp.code_version(s.__name__) for s in registry.ORDER}
    finally:
        fp.code_version.cache_clear()


def test_a_move_a_rename_and_a_reformat_change_no_code_version_and_a_change_to_what_code_computes_does(
    tmp_path, monkeypatch
):
    """Code versions are keyed by what the code does, not where it lives (issue 41): the SFT's teacher helper
    moved to a new folder under another name (its importers' imports follow), grpo.py reformatted and its
    comments and docstrings gone, a presentation module edited: no stage's code version moves, so nothing
    reruns. A change to what a helper computes moves the code version of exactly the stages that import it."""
    import shutil

    real = {s.NAME: fp.code_version(s.__name__) for s in registry.ORDER}
    users = {s.NAME for s in registry.ORDER if any(p.endswith("training/teacher.py") for p in fp.closure(s.__name__))}
    copy = tmp_path / "stages"
    shutil.copytree(ROOT / "stages", copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert code_versions_of(copy, monkeypatch) == real  # the copy itself is the same code

    (copy / "teachers").mkdir()
    (copy / "teachers" / "__init__.py").write_text('"""Where teachers live now."""\n')
    (copy / "training" / "teacher.py").rename(copy / "teachers" / "traces_of_teachers.py")
    for path in copy.rglob("*.py"):
        text = path.read_text()
        if "regimen.stages.training.teacher" in text:
            path.write_text(
                text.replace("regimen.stages.training.teacher", "regimen.stages.teachers.traces_of_teachers")
            )
    grpo = copy / "grpo.py"
    tree = ast.parse(grpo.read_text())
    tree.body[0].value.value = "GRPO, reformatted by a tool and its docstring rewritten."
    grpo.write_text(ast.unparse(tree) + "\n# a comment\n")
    assert grpo.read_text() != (ROOT / "stages" / "grpo.py").read_text()
    hoisted = 0  # every import inside a function of SFT (torch, trl) moved to the top of its module (issue 47 item 7)
    sft = copy / "sft.py"
    tree = ast.parse(sft.read_text())
    for fn in [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)]:
        inner = [n for n in fn.body if isinstance(n, (ast.Import, ast.ImportFrom))]
        fn.body = [n for n in fn.body if n not in inner] or [ast.Pass()]
        tree.body[2:2] = inner  # after the docstring and `from __future__ import annotations`
        hoisted += len(inner)
    sft.write_text(ast.unparse(tree))
    assert hoisted > 0
    moved = code_versions_of(copy, monkeypatch)
    assert moved == real

    helper = copy / "teachers" / "traces_of_teachers.py"
    text = helper.read_text()
    tree = ast.parse(text)
    first = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef))
    first.body.insert(0, ast.parse("_unused = 1 + 1").body[0])  # what the function does, not how it is written
    helper.write_text(ast.unparse(tree))
    changed = code_versions_of(copy, monkeypatch)
    assert users == {"sft"}
    assert {n for n in real if changed[n] != real[n]} == users

    edited = copy / "grpo.py"
    edited.write_text(edited.read_text().replace("def ", "def _renamed_helper():\n    return 0\n\n\ndef ", 1))
    renamed = code_versions_of(copy, monkeypatch)
    assert {n for n, v in renamed.items() if v != changed[n]} == {"grpo"}
    # importing something else, wherever it stands, is a change
    edited.write_text(
        edited.read_text().replace("def _renamed_helper():\n", "def _renamed_helper():\n    import decimal\n")
    )
    assert {n for n, v in code_versions_of(copy, monkeypatch).items() if v != renamed[n]} == {"grpo"}


def test_every_import_of_our_modules_resolves_including_those_inside_functions():
    """Lazy imports run only when their function does; check them all now."""
    import importlib

    problems = []
    for name, path in MODULES.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("regimen."):
                continue
            module = importlib.import_module(base)
            for alias in node.names:
                if not hasattr(module, alias.name) and f"{base}.{alias.name}" not in MODULES:
                    problems.append(f"{name}: from {base} import {alias.name}")
    assert problems == []


def test_a_registry_the_flow_cannot_run_is_refused():
    import types

    def fake(name, role):
        return types.SimpleNamespace(NAME=name, ROLE=role)

    good = (fake("a", "teach"), fake("b", "train"), fake("c", "judge"))
    registry.check(good)
    for order, needle in [
        ((*good, fake("d", "judge")), "exactly one"),
        ((fake("a", "teach"), fake("c", "judge")), "'train'"),
        ((*good, fake("a", "gate")), "repeat"),
        ((*good, fake("d", "review")), "ROLE must be"),
    ]:
        with pytest.raises(ValueError, match=needle):
            registry.check(order)


def test_the_flows_and_what_presents_them_name_no_stage():
    """The flows, the CLI, the presentation, the runner and the policy lookup never name a stage: they
    read names and roles from the registry, so adding a stage touches its module and the registry only.
    (`flows/serving/boundary.py` names recipe sections, some of which share a stage's name.)"""
    names = set(registry.NAMES)
    paths = [p for p in (ROOT / "flows").rglob("*.py") if p.name != "boundary.py"]
    for path in [*paths, ROOT / "stages" / "run" / "runner.py", ROOT / "stages" / "training" / "policy.py"]:
        found = [
            n.value for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Constant) and n.value in names
        ]
        assert not found, (path.name, found)


@pytest.mark.slow
def test_a_stage_added_to_the_registry_alone_runs_where_its_role_says(tmp_path, monkeypatch):
    """A gate registered in the registry (and nowhere else) runs after the built-in gates, on the SFT
    policy, is versioned in the store like any stage, and is reused on a rerun."""
    import extra_gate_stage
    from conftest import TINY, run_flow

    from regimen.stages.store import Store

    # after sft, distill and the two built-in gates
    order = (*registry.ORDER[:4], extra_gate_stage, *registry.ORDER[4:])
    registry.check(order)
    monkeypatch.setattr(registry, "ORDER", order)
    monkeypatch.setattr(registry, "STAGES", {s.NAME: s for s in order})
    monkeypatch.setattr(registry, "NAMES", tuple(s.NAME for s in order))
    results = run_flow(TINY, tmp_path)
    assert [r["stage"] for r in results] == ["sft", "reward-dry-run", "grpo-smoke", "weights-gate", "grpo", "eval"]
    [m] = Store(tmp_path).versions("tiny-test", "weights-gate")
    assert m["metrics"]["weight_files"] >= 1 and m["inputs"]["policy"]["stage"] == "sft"
    assert (Store(tmp_path).local_path(m) / "weights.txt").read_text().endswith(".safetensors")
    again = run_flow(TINY, tmp_path)
    assert all(r["reused"] for r in again)


LIBRARIES = ("prefect", "transformers", "trl", "datasets", "accelerate", "peft", "torch")
# `obj._name` where obj is one of ours (not a library's), with why it is ours. Anything else that reaches
# for an underscored attribute is taken to be a library's private API, which changes without notice.
OURS = {
    ("stages/recipe/__init__.py", "recipe._raw"): "Recipe (stages/recipe/schema.py) keeps what the recipe itself set",
}
DOCUMENTED = {"_fields", "_asdict", "_replace", "_make", "_field_defaults"}
"""Names with an underscore that are documented public API (named tuples'), not anybody's privates."""
NO_PUBLIC_WAY: dict[tuple[str, str], str] = {}
"""Library privates we use because no public API does it, each with the reason (none today)."""


def test_no_private_attribute_of_a_library_is_used():
    """No module under stages/ or flows/ reads an underscored attribute of another object (`x._y`,
    `getattr(x, "_y")`), nor imports a private module or name of prefect, transformers, trl, datasets,
    accelerate, peft or torch, apart from the listed ones."""
    found = []
    for folder in ("stages", "flows"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Attribute)
                    and node.attr.startswith("_")
                    and not node.attr.startswith("__")
                    and node.attr not in DOCUMENTED
                ):
                    base = ast.unparse(node.value)
                    # os._exit: the standard library's documented name
                    stdlib = base.split(".")[0] in sys.stdlib_module_names
                    # the store's own modules read the parts behind its facade (retention.py)
                    store_own = rel.startswith("stages/store/") and node.attr in PARTS
                    ours = store_own or (rel, f"{base}.{node.attr}") in OURS
                    if base not in ("self", "cls") and not stdlib and not ours:
                        found.append(f"{rel}:{node.lineno}: {base}.{node.attr}")
                elif (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "setattr", "hasattr")
                    and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant)
                    and str(node.args[1].value).startswith("_")
                    and not str(node.args[1].value).startswith("__")
                    and node.args[1].value not in DOCUMENTED
                ):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node)}")
                elif isinstance(node, (ast.Import, ast.ImportFrom)):
                    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []
                    for module in modules:
                        if module.split(".")[0] in LIBRARIES and (
                            any(p.startswith("_") for p in module.split(".")) or any(n.startswith("_") for n in names)
                        ):
                            found.append(f"{rel}:{node.lineno}: import of a private part of {module}")
    assert [f for f in found if not any(f.startswith(k[0]) and k[1] in f for k in NO_PUBLIC_WAY)] == []


START, END = "<!-- rooms: generated from ROOMS in tests/test_layout.py -->", "<!-- rooms: end -->"


def write_architecture_table(path: Path = ROOT / "ARCHITECTURE.md") -> bool:
    """Put the table generated from ROOMS between ARCHITECTURE.md's markers; True when the file changed."""
    text = path.read_text()
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    new = f"{head}{START}\n{architecture_table()}\n{END}{tail}"
    if new != text:
        path.write_text(new)
    return new != text


def test_architecture_md_holds_the_table_generated_from_rooms():
    """One map: ARCHITECTURE.md's table of rooms is the one ROOMS generates (`python tests/test_layout.py`
    rewrites it), so the document cannot drift from the rule unnoticed."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    assert START in text and END in text
    shown = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert shown == architecture_table(), "ARCHITECTURE.md's rooms are stale: run python tests/test_layout.py"
    for name, room_ in ROOMS.items():  # every room's allowance names rooms that exist, in the order of the house
        assert all(list(ROOMS).index(a) < list(ROOMS).index(name) for a in room_.allowed), name


LONGEST = 80
"""Lines a function may have: a longer one is split into named steps."""
LONG_ALLOWED = {"stages/sandbox/syscalls.py"}
"""The sandbox's syscall tables: data laid out as code, read as a table rather than as steps."""


def long_functions(paths: list[Path]) -> list[str]:
    """`path:line name (n lines)` for every function or method over LONGEST lines in `paths`."""
    found = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and (n := node.end_lineno - node.lineno + 1) > LONGEST
            ):
                found.append(f"{path.name}:{node.lineno} {node.name} ({n} lines)")
    return found


def test_no_function_is_over_80_lines_outside_the_sandboxs_syscall_tables():
    paths = [
        p
        for folder in ("stages", "flows", "bench")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if p.relative_to(ROOT).as_posix() not in LONG_ALLOWED
    ]
    assert all((ROOT / p).is_file() for p in LONG_ALLOWED)  # the allowance names a file that exists
    assert long_functions(paths) == []


def test_the_rule_on_long_functions_would_catch_one(tmp_path):
    path = tmp_path / "long.py"
    path.write_text(
        "class A:\n    def fine(self):\n        return 1\n\n    def long(self):\n"
        + "        x = 1\n" * LONGEST
        + "        return x\n"
    )
    assert long_functions([path]) == ["long.py:5 long (82 lines)"]


def methods(cls: type) -> list[str]:
    """Every `def` in the class's body, private and nested ones included."""
    import inspect
    import textwrap

    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    return [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_stores_parts_each_have_under_20_methods_and_store_is_a_facade_holding_no_rule():
    """`Store` is the one surface over parts split by responsibility (versions, records, this machine's work
    folders and locks), and the handle a run works through; no part grows past 20 methods, and each of the
    facade's methods is one delegation (no branch, loop or handler: the rule lives in the part)."""
    import importlib
    import inspect
    import textwrap

    classes = []
    for path in sorted((ROOT / "stages" / "store").glob("*.py")):
        name = "regimen.stages.store" if path.stem == "__init__" else f"regimen.stages.store.{path.stem}"
        module = importlib.import_module(name)
        classes += [c for _, c in inspect.getmembers(module, inspect.isclass) if c.__module__ == name]
    counts = {c.__qualname__: len(methods(c)) for c in classes}
    assert {"Store", "Backend", "Catalog", "Ledger", "Workspace", "StageHandle"} <= set(counts)
    assert {name: n for name, n in counts.items() if n >= 20 and name != "Store"} == {}
    from regimen.stages.store import Store

    tree = ast.parse(textwrap.dedent(inspect.getsource(Store)))
    ruled = {
        f.name: type(n).__name__
        for f in tree.body[0].body
        if isinstance(f, ast.FunctionDef)
        for n in ast.walk(f)
        if isinstance(n, (ast.If, ast.For, ast.While, ast.Try, ast.IfExp, ast.comprehension, ast.Raise))
    }
    assert ruled == {}, f"Store's methods hold a rule of their own (move it into the part): {ruled}"


PARTS = {"catalog", "ledger", "workspace", "backend", "_catalog", "_ledger", "_workspace", "_backend"}
STORE_WHITE_BOX = {"test_store.py", "test_s3_store.py", "test_retention.py", "test_records.py"}  # the store's own


def reaches_into_the_store(path: Path) -> list[str]:
    """`x.catalog`, `x._ledger`, ... on anything: the parts behind `Store` and `StageHandle`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [f"{path}:{n.lineno} .{n.attr}" for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr in PARTS]


def test_nothing_outside_the_store_reaches_past_its_one_surface(tmp_path):
    files = [
        p
        for folder in ("flows", "stages", "bench", "tests")
        for p in (ROOT / folder).rglob("*.py")
        if "store" not in p.relative_to(ROOT).parts[:2] and p.name not in STORE_WHITE_BOX
    ]
    assert len(files) > 100
    found = [hit for p in files for hit in reaches_into_the_store(p)]
    assert found == [], found
    # the rule would catch a reach
    planted = tmp_path / "reach.py"
    planted.write_text("def f(store):\n    return store.ledger.read('e', 'champion.json')\n")
    assert reaches_into_the_store(planted) == [f"{planted}:2 .ledger"]


def test_under_xdist_a_file_runs_on_one_worker_and_the_ui_test_joins_the_operations_scenario(tmp_path):
    # the suite's own conftest (its scheduler hook) over three files of quick tests, on two workers: each
    # unit's tests run on one worker (its module fixtures built once); test_ui.py runs with test_operations.py
    import shutil

    tests = tmp_path / "tests"
    tests.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    body = "import os, time\n" + "".join(
        f"def test_{i}():\n    time.sleep(0.05)\n    print(os.environ['PYTEST_XDIST_WORKER'])\n" for i in range(6)
    )
    for name in ("test_operations.py", "test_ui.py", "test_other.py"):
        (tests / name).write_text(body)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-n",
            "2",
            "--dist",
            "loadscope",
            "--no-loadscope-reorder",
            "-v",
            "-p",
            "no:cacheprovider",
            "tests",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={k: v for k, v in os.environ.items() if k != "REGIMEN_TESTS_TIMELINE"},  # its quick tests: not the suite's
    )
    assert r.returncode == 0, r.stdout[-3000:]
    ran = {}
    for line in r.stdout.splitlines():  # "[gw0] [ 5%] PASSED tests/test_ui.py::test_0"
        parts = line.split()
        if len(parts) >= 4 and parts[0].startswith("[gw") and "PASSED" in parts:
            ran.setdefault(parts[-1].split("::")[0], set()).add(parts[0])
    assert set(ran) == {"tests/test_operations.py", "tests/test_ui.py", "tests/test_other.py"}, r.stdout[-3000:]
    assert all(len(workers) == 1 for workers in ran.values()), ran
    assert ran["tests/test_ui.py"] == ran["tests/test_operations.py"], ran


if __name__ == "__main__":
    print("ARCHITECTURE.md " + ("rewritten" if write_architecture_table() else "already current"))


# -- imports at the top (issue 47 item 7) ---------------------------------------------------------------

LIGHT = {"yaml", "pydantic"}  # `regimen --help` loads pydantic already; yaml costs a few ms
"""Third-party packages an import at the top may bring in where the module did not load them before."""


def _top_imports(path: Path) -> list[ast.stmt]:
    """Module-level imports, those in a top-level `try`/`if` included (not `if TYPE_CHECKING`)."""
    out: list[ast.stmt] = []

    def walk(body: list[ast.stmt]) -> None:
        for n in body:
            if isinstance(n, ast.If) and "TYPE_CHECKING" not in ast.unparse(n.test):
                walk(n.body)
                walk(n.orelse)
            elif isinstance(n, ast.Try):
                for block in (n.body, n.orelse, n.finalbody, *[h.body for h in n.handlers]):
                    walk(block)
            elif isinstance(n, (ast.Import, ast.ImportFrom)) and getattr(n, "module", None) != "__future__":
                out.append(n)

    walk(ast.parse(path.read_text()).body)
    return out


def _library(target: str) -> bool:
    return target not in MODULES and target not in sys.stdlib_module_names and target not in LIGHT


@functools.cache
def loads(name: str) -> frozenset[str]:
    """The libraries importing module `name` loads: its top-level imports and theirs, its packages' `__init__`s."""
    parts = name.split(".")
    todo = [name, *[".".join(parts[:i]) for i in range(2, len(parts))]]
    seen: set[str] = set()
    found: set[str] = set()
    while todo:
        m = todo.pop()
        if m in seen or m not in MODULES:
            continue
        seen.add(m)
        for node in _top_imports(MODULES[m]):
            for t in _targets(m, MODULES[m], node):
                if t in MODULES:
                    todo.append(t)
                elif _library(t):
                    found.add(t)
    return frozenset(found)


def imports_that_belong_at_the_top(name: str, path: Path) -> list[str]:
    """Imports standing in a function's body that load nothing the module does not load already: the
    standard library, LIGHT, a library the module imports at the top, or a module of ours that brings no
    library the importer's own imports do not. What may stay in a function: a heavy or optional library
    (torch, trl, prefect, fsspec, ...) or a module of ours that would bring one, a module of ours in a
    command of the CLI (`regimen --help` loads none of them), and anything inside a `try` or an `if` in the
    function (optional, or chosen at run time)."""
    have = loads(name)
    cli = name.startswith("regimen.flows.cli")  # a command loads its modules when it runs: `--help` loads none
    found = []
    for fn in ast.walk(ast.parse(path.read_text())):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in fn.body:
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            targets = _targets(name, path, node)
            heavier = [
                t
                for t in targets
                if (t in MODULES and (cli or not loads(t) <= have)) or (_library(t) and t not in have)
            ]
            if not heavier and name not in targets:
                where = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
                found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_imports_stand_at_the_top_unless_they_would_load_something_heavier():
    found = [
        hit
        for name, path in MODULES.items()
        if "sandbox" not in name  # runs as `python -I -S` from its own folder: imports of its siblings by name
        for hit in imports_that_belong_at_the_top(name, path)
    ]
    assert found == [], "imports to move to the top of their module:\n" + "\n".join(found)


def test_the_rule_on_imports_would_catch_one_in_a_function(tmp_path, monkeypatch):
    name = "regimen.stages.decide.verdicts"
    planted = tmp_path / "verdicts.py"
    planted.write_text(MODULES[name].read_text() + "\n\ndef planted():\n    import json\n\n    return json\n")
    monkeypatch.setitem(MODULES, name, planted)
    loads.cache_clear()
    try:
        hits = imports_that_belong_at_the_top(name, planted)
    finally:
        loads.cache_clear()
    assert hits == [f"{planted}:{len(planted.read_text().splitlines()) - 2}: import json"]


def test_the_command_line_help_and_check_load_no_training_or_orchestration_library(tmp_path):
    """`regimen --help` stays light after the imports moved to the top: no torch, trl, transformers,
    datasets or prefect. (`regimen check` does load TRL: it validates the recipe's TRL fields against TRL's
    own config classes, so that it refuses what the run refuses.)"""
    heavy = ("torch", "trl", "transformers", "datasets", "prefect")
    code = (
        "import sys\n"
        "sys.argv = ['regimen', '--help']\n"
        "from regimen.flows.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "LOADED []", r.stdout[-500:]
