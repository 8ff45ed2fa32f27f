"""The docs' reference pages, generated from the code so they cannot drift (run by `docs/hooks.py` at every
`mkdocs build`; `tests/test_docs.py` compares them with what they describe):

- `reference/recipe.md`: every recipe section and field from the pydantic schema (type, default, where the default
  comes from, bounds, description), each task's `data:` fields, Regimen's own defaults for TRL's sections;
- `reference/cli.md`: every command of `regimen` with its arguments and options, from typer;
- `reference/manifest.md`: a version's manifest and its index entry, from the store's schemas;
- `reference/exit-codes.md`: the exit codes, from Regimen's error classes;
- `reference/events.md`: the Prefect events Regimen emits, found in the code;
- `reference/layout.md`: the map of the house, every folder and module of `stages/` and `flows/` with the first
  sentence of its docstring, and the registries' names (stages, tasks, rewards, environments, trackers, recipe
  sections), so the tour's lists cannot go stale;
- `benchmarks/*.md`: each `bench/results/*.jsonl` as a table (every row's date, machine and commit as recorded).
"""

from __future__ import annotations

import ast
import json
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) if not typing.get_args(annotation) else None
    text = text or str(annotation).replace("typing.", "")
    for noise in ("regimen.stages.recipe.schema.", "regimen.stages.tasks.", "pydantic.main.", "NoneType"):
        text = text.replace(noise, "None" if noise == "NoneType" else "")
    return text.replace("|", "\\|")


def _bounds(field) -> str:
    out = []
    for m in field.metadata:
        for name, sign in (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤")):
            if getattr(m, name, None) is not None:
                out.append(f"{sign} {getattr(m, name)}")
        if getattr(m, "pattern", None):
            out.append(f"pattern `{m.pattern}`")
    return ", ".join(out)


def _plain(value: Any) -> Any:
    return value.model_dump(mode="json", by_alias=True) if hasattr(value, "model_dump") else str(value)


def _default(field) -> str:
    """The field's default as a short value. A section (a pydantic model) does not put its whole default in
    the column: its own table below gives each of its fields' defaults; a long list of sections says how many."""
    if field.is_required():
        return "required"
    try:
        value = field.get_default(call_default_factory=True)
    except TypeError:
        return "(computed)"
    if hasattr(value, "model_dump"):
        return "each field's default (its table below)"
    text = json.dumps(value, default=_plain)
    if len(text) > 60 and _models(field.annotation) and isinstance(value, list):
        names = [getattr(v, "name", None) for v in value]
        listed = ", ".join(str(n) for n in names) if all(names) else f"{len(value)} entries"
        return f"[{listed}] (an entry's fields: the table below)"
    return f"`{text}`"


def _models(annotation: Any) -> list[type]:
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    found = []
    for arg in typing.get_args(annotation):
        found += _models(arg)
    return found


def recipe_fields() -> dict[str, list[str]]:
    """Every field a recipe may set, by section (dotted names), as the schema defines them."""
    from regimen.stages.recipe.schema import Recipe
    from regimen.stages.tasks.registry import TASKS

    sections: dict[str, list[str]] = {}

    def walk(model, prefix: str) -> None:
        for name, field in model.model_fields.items():
            key = field.alias or name
            dotted = f"{prefix}{key}"
            sections.setdefault(prefix.rstrip(".") or "(top)", []).append(dotted)
            for sub in _models(field.annotation):
                if sub.__module__.startswith("regimen.stages.tasks"):
                    continue
                walk(sub, f"{dotted}.")

    walk(Recipe, "")
    for task in TASKS.values():
        for name, field in task.Options.model_fields.items():
            sections.setdefault(f"data (task: {task.NAME})", []).append(f"data.{field.alias or name}")
    return sections


def recipe_page() -> str:
    from regimen.stages.recipe import defaults
    from regimen.stages.recipe.schema import Recipe
    from regimen.stages.tasks.registry import TASKS

    lines = [
        "---",
        "hide:",
        "  - navigation",  # the tables take the page's width at 1280 px
        "---",
        "",
        "# Recipe reference",
        "",
        "Generated from the recipe's pydantic schema (`stages/recipe/schema.py`) at every build: every section and "
        "field a recipe may set, its type, its default (the schema's: a section's default is its own table), its "
        "bounds and what it "
        "does. `regimen check RECIPE` prints a recipe fully resolved, each value with its source.",
        "",
    ]

    def table(model, prefix: str, title: str) -> None:
        lines.extend([f"## `{title}`", "", " ".join((model.__doc__ or "").split()), ""])
        lines.extend(["| field | type | default | bounds | description |", "|---|---|---|---|---|"])
        nested = []
        for name, field in model.model_fields.items():
            key = field.alias or name
            desc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            lines.append(
                f"| `{prefix}{key}` | {_type(field.annotation)} | {_default(field)} | {_bounds(field)} | {desc} |"
            )
            for sub in _models(field.annotation):
                if not sub.__module__.startswith("regimen.stages.tasks"):
                    nested.append((sub, f"{prefix}{key}."))
        lines.append("")
        for sub, sub_prefix in nested:
            table(sub, sub_prefix, sub_prefix.rstrip("."))

    table(Recipe, "", "recipe (top level)")
    lines.extend(["## `data`: one task's fields", "", "`data.task` chooses the task; the rest are that task's."])
    for task in TASKS.values():
        lines.append("")
        table(task.Options, "data.", f"data (task: {task.NAME})")
    lines.extend(
        [
            "## `sft`, `grpo`, `distill`: TRL's own config fields",
            "",
            "These sections take the field names of TRL's `SFTConfig`, `GRPOConfig` and `DistillationConfig` and are "
            "checked against them (a typo is an error; TRL's own validation runs at the door). Defaults are TRL's; "
            "Regimen differs only here, each with its reason:",
            "",
            "| section | field | Regimen's default | why |",
            "|---|---|---|---|",
        ]
    )
    for section, values in defaults.REGIMEN_DEFAULTS.items():
        for key, (value, why) in values.items():
            lines.append(f"| `{section}` | `{key}` | `{json.dumps(value, default=str)}` | {why} |")
    return "\n".join(lines) + "\n"


def cli_commands() -> list[str]:
    import typer

    from regimen.flows.cli import app

    group = typer.main.get_command(app)
    names = []

    def walk(cmd, prefix: str) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            full = f"{prefix} {name}".strip()
            if getattr(sub, "commands", None):
                walk(sub, full)
            else:
                names.append(full)

    walk(group, "")
    return names


def cli_page() -> str:
    import typer

    from regimen.flows.cli import app

    group = typer.main.get_command(app)
    lines = ["# Command-line reference", "", "Generated from the `regimen` command itself (typer) at every build.", ""]

    def walk(cmd, prefix: str) -> None:
        for name, sub in sorted(getattr(cmd, "commands", {}).items()):
            full = f"{prefix} {name}".strip()
            if getattr(sub, "commands", None):
                walk(sub, full)
                continue
            lines.extend([f"## `regimen {full}`", "", (sub.help or "").strip(), ""])
            lines.extend(["| argument / option | type | default | help |", "|---|---|---|---|"])
            for p in sub.params:
                shown = ", ".join(f"`{o}`" for o in p.opts) if p.param_type_name == "option" else f"`{p.name.upper()}`"
                default = "required" if p.required else f"`{p.default}`"
                helptext = (getattr(p, "help", "") or "").replace("|", "\\|")
                kind = getattr(getattr(p, "type", None), "name", "") or ""
                lines.append(f"| {shown} | {kind} | {default} | {helptext} |")
            lines.append("")

    walk(group, "")
    return "\n".join(lines) + "\n"


def manifest_page() -> str:
    from regimen.stages.store import schemas
    from regimen.stages.store.index import LEFT_OUT

    lines = [
        "# Manifest and index reference",
        "",
        "Generated from the store's schemas (`stages/store/schemas.py`, `stages/store/index.py`).",
        "",
        "## `<store>/<experiment>/<stage>/v<N>/manifest.json`",
        "",
        "Fields the store reads back (checked strictly; unknown fields are kept, so a newer Regimen's manifests still "
        "read):",
        "",
        "| field | type | required |",
        "|---|---|---|",
    ]
    for name, field in schemas.Manifest.model_fields.items():
        lines.append(f"| `{name}` | {_type(field.annotation)} | {'yes' if field.is_required() else 'no'} |")
    lines.extend(
        [
            "",
            "## `<store>/<experiment>/<stage>/index.json`",
            "",
            "The stage's index: `schema`, `next` (the next version number), `versions` (one entry per completed "
            f"version: its manifest without {', '.join(f'`{k}`' for k in LEFT_OUT)}, plus `bytes`, `n_files`, "
            "`has_model`, `content`), `claims` (numbers a killed writer claimed, swept under the next lease).",
            "",
        ]
    )
    return "\n".join(lines) + "\n"


def exit_codes_page() -> str:
    from regimen.stages.core import errors

    lines = [
        "# Exit codes",
        "",
        "Generated from Regimen's error classes (`stages/core/errors.py`).",
        "",
        "| code | when |",
        "|---|---|",
        "| `0` | done (a run whose cycle stalled is done too: its verdict says so) |",
    ]
    for cls in (errors.InputError, errors.StageStopped, errors.StoreError):
        lines.append(f"| `{cls.exit_code}` | `{cls.__name__}`: {' '.join((cls.__doc__ or '').split())} |")
    lines.append(f"| `130`, `143` | `StageInterrupted`: {' '.join((errors.StageInterrupted.__doc__ or '').split())} |")
    return "\n".join(lines) + "\n"


def events() -> list[tuple[str, str]]:
    """(event name or template, module) of every `emit_event(event=...)` in flows/."""
    found = []
    for path in sorted((ROOT / "flows").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", "")) == "emit_event":
                for kw in node.keywords:
                    if kw.arg == "event":
                        text = ast.unparse(kw.value).strip("f'\"")
                        found.append((text, path.relative_to(ROOT).as_posix()))
    return found


def events_page() -> str:
    lines = [
        "# Events",
        "",
        "Prefect events Regimen emits, found in the code (`emit_event` calls) at every build; an "
        "operator's automations can react to them.",
        "",
        "| event | emitted in |",
        "|---|---|",
    ]
    lines += [f"| `{name}` | `{where}` |" for name, where in events()]
    return "\n".join(lines) + "\n"


NOTE_AT = 80
"""A benchmark row's cell longer than this many characters is a numbered note below the table."""


def _cell(value: Any, notes: list[str]) -> str:
    """A benchmark table's cell: the value, or `note N` with the whole value in `notes` (once)."""
    text = " ".join(str(value).split())
    if len(text) <= NOTE_AT:
        return text.replace("|", "\\|")
    if text not in notes:  # rows of one run often share a note
        notes.append(text)
    return f"note {notes.index(text) + 1}"


def benchmark_pages() -> dict[str, str]:
    pages = {}
    for path in sorted((ROOT / "bench" / "results").glob("*.jsonl")):
        rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        flat = [{k: v for k, v in r.items() if not isinstance(v, (dict, list))} for r in rows]
        keys = list(dict.fromkeys(k for r in flat for k in r))
        first = [k for k in ("date", "machine", "commit") if k in keys]
        keys = first + [k for k in keys if k not in first]
        lines = [
            f"# Benchmark: {path.stem}",
            "",
            f"Rendered from `bench/results/{path.name}` at every build "
            f"({len(rows)} rows; each with the date, machine and commit it recorded where it has them).",
            "",
        ]
        lines += ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        notes: list[str] = []  # a cell longer than a table column reads well: whole, below the table
        for r in flat:
            lines.append("| " + " | ".join(_cell(r.get(k, ""), notes) for k in keys) + " |")
        if notes:
            lines += ["", "Notes (cells too long for the table, whole):", ""]
            lines += [f"{i}. {text}" for i, text in enumerate(notes, 1)]
        pages[f"benchmarks/{path.stem}.md"] = "\n".join(lines) + "\n"
    index = [
        "# Benchmarks",
        "",
        "Each benchmark under `bench/` measures speed, memory or growth as ratios against a "
        "baseline in the same run and appends its rows to `bench/results/*.jsonl` (committed). The pages below "
        "are rendered from those files at every build.",
        "",
    ]
    index += [f"- [{Path(rel).stem}]({Path(rel).name})" for rel in sorted(pages)]
    pages["benchmarks/index.md"] = "\n".join(index) + "\n"
    return pages


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring (its first line when there is no full stop in it)."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = " ".join(doc.split("\n\n")[0].split())
    cut = first.find(". ")
    text = first[: cut + 1] if cut != -1 else first
    return text.replace("|", "\\|")


_REGISTRIES = """
import json
from regimen.stages import registry
from regimen.stages.environments.registry import known
from regimen.stages.recipe.schema import Recipe
from regimen.stages.recipe.trackers import NAMES
from regimen.stages.rewards.registry import known_rewards
from regimen.stages.tasks.registry import TASKS

print(json.dumps({
    "stages": [[s.NAME, s.ROLE] for s in registry.ORDER],
    "tasks": list(TASKS),
    "rewards": known_rewards(),
    "environments": known(),
    "trackers": list(NAMES),
    "sections": [f.alias or n for n, f in Recipe.model_fields.items()],
}))
"""


def registries() -> dict[str, Any]:
    """The registries' names as a fresh process sees them: what ships, never what a test (or a user's code in
    this process) registered at run time."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _REGISTRIES], capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def layout_page() -> str:
    names = registries()
    lines = [
        "# Layout",
        "",
        "Generated from the code at every build (`docs/gen_reference.py`): every folder and module of `stages/` "
        "(plain Python, never imports Prefect) and `flows/` (Prefect, by concern), each with the first sentence of "
        "its docstring, then the registries. The rooms and what each may import: "
        "[Architecture](../explanation/architecture.md).",
        "",
        "## Registries",
        "",
        "| registry | names |",
        "|---|---|",
        "| stages, in order (role) | " + ", ".join(f"`{n}` ({role})" for n, role in names["stages"]) + " |",
        "| tasks (`data.task`) | " + ", ".join(f"`{n}`" for n in names["tasks"]) + " |",
        "| rewards (`rewards[].name`) | " + ", ".join(f"`{n}`" for n in names["rewards"]) + " |",
        "| environments (`environment.name`) | " + ", ".join(f"`{n}`" for n in names["environments"]) + " |",
        "| trackers (`tracking`) | " + ", ".join(f"`{n}`" for n in names["trackers"]) + " |",
        "| recipe sections | " + ", ".join(f"`{n}`" for n in names["sections"]) + " |",
        "",
    ]
    for top in ("stages", "flows"):
        base = ROOT / top
        lines += [f"## `{top}/`", "", "| module | what it is |", "|---|---|"]
        folders = sorted(
            {p.parent for p in base.rglob("*.py") if "__pycache__" not in p.parts and "metrics" not in p.parts}
        )
        for folder in folders:
            rel = folder.relative_to(ROOT).as_posix()
            init = folder / "__init__.py"
            if folder != base:
                lines.append(f"| **`{rel}/`** | {_summary(init) if init.exists() else ''} |")
            for module in sorted(folder.glob("*.py")):
                if module.name == "__init__.py" and (folder != base or not _summary(module)):
                    continue
                lines.append(f"| `{module.relative_to(ROOT).as_posix()}` | {_summary(module)} |")
        lines.append("")
    return "\n".join(lines)


def generate(docs: Path = DOCS) -> list[Path]:
    pages = {
        "reference/recipe.md": recipe_page(),
        "reference/cli.md": cli_page(),
        "reference/manifest.md": manifest_page(),
        "reference/exit-codes.md": exit_codes_page(),
        "reference/events.md": events_page(),
        "reference/layout.md": layout_page(),
        **benchmark_pages(),
    }
    written = []
    for rel, text in pages.items():
        target = docs / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
        written.append(target)
    return written


if __name__ == "__main__":
    for p in generate():
        print(p.relative_to(ROOT))
