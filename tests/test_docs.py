"""The front door and the docs site (issue 41): a README of at most 150 lines whose every link resolves, docs pages
whose internal links resolve, and reference pages generated from the code that say what the code says."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # code blocks are not links
    return [m for m in LINK.findall(text) if not m.startswith(("http://", "https://", "mailto:", "#"))]


def test_the_readme_is_at_most_150_lines_and_every_link_resolves():
    readme = ROOT / "README.md"
    assert len(readme.read_text().splitlines()) <= 150
    broken = [link for link in _links(readme) if not (ROOT / link.split("#")[0]).exists()]
    assert broken == []


def test_every_docs_page_link_resolves():
    broken = []
    for page in DOCS.rglob("*.md"):
        for link in _links(page):
            if not (page.parent / link.split("#")[0]).resolve().exists():
                broken.append(f"{page.relative_to(ROOT)}: {link}")
    assert broken == []


# what a recipe snippet in the docs may lean on without it existing here: a user's own files and modules
PLACEHOLDER = re.compile(r"data_files '[^']+' does not exist|No module named 'mypkg'")


def _yaml_snippets() -> list[tuple[str, str]]:
    pages = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
    return [
        (f"{page.relative_to(ROOT)}#{i}", block)
        for page in pages
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", page.read_text(), flags=re.S))
    ]


@pytest.mark.parametrize("where, block", _yaml_snippets(), ids=lambda v: v if "#" in str(v) else "")
def test_every_recipe_snippet_in_the_docs_is_a_recipe_the_schema_accepts(where, block):
    """A snippet's sections, laid over the default recipe, validate: a renamed or misspelt field in the docs fails
    here (only a user's own files and modules may be missing)."""
    import yaml

    from regimen.stages.core.errors import InputError
    from regimen.stages.recipe import read_yaml, recipe_from_dict

    snippet = yaml.safe_load(block)
    assert isinstance(snippet, dict), where
    try:
        recipe_from_dict({**read_yaml(ROOT / "configs" / "default.yaml"), **snippet}, where)
    except InputError as exc:  # every problem it names is a placeholder's (a misspelt field beside one fails)
        problems = str(exc).split(": ", 1)[-1].split("; ")
        assert all(PLACEHOLDER.search(p) for p in problems), f"{where}: {exc}"


def test_the_committed_reference_is_what_the_code_generates():
    """Generated at every `mkdocs build` and committed (README links into it): a stale page is a failure here."""
    import gen_reference

    out = DOCS / "_check"
    try:
        generated = gen_reference.generate(out)
        stale = [p.relative_to(out) for p in generated if (DOCS / p.relative_to(out)).read_text() != p.read_text()]
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    assert stale == [], f"regenerate: python docs/gen_reference.py ({stale})"


def test_the_recipe_reference_lists_every_field_the_schema_accepts():
    import gen_reference

    page = (DOCS / "reference" / "recipe.md").read_text()
    fields = [f for section in gen_reference.recipe_fields().values() for f in section]
    assert len(fields) > 150
    missing = [f for f in fields if f"`{f}`" not in page]
    assert missing == []


def test_the_cli_reference_lists_every_command():
    import gen_reference

    page = (DOCS / "reference" / "cli.md").read_text()
    commands = gen_reference.cli_commands()
    assert {"run", "check", "status", "gc", "reindex", "reward-check", "pool setup", "heldout refresh"} <= set(commands)
    assert [c for c in commands if f"## `regimen {c}`" not in page] == []


def test_every_benchmark_row_is_on_its_page_whole():
    """A benchmark's page shows each value of each row in full: in the table, or as a note below it (a long note
    was cut at 80 characters once, and what the cut left read as the run's finding)."""
    import gen_reference

    pages = gen_reference.benchmark_pages()
    for path in sorted((ROOT / "bench" / "results").glob("*.jsonl")):
        page = pages[f"benchmarks/{path.stem}.md"]
        for line in path.read_text().splitlines():
            for value in json.loads(line).values() if line.strip() else ():
                if not isinstance(value, (dict, list)):
                    text = " ".join(str(value).split())
                    assert text.replace("|", "\\|") in page or text in page, (path.name, text[:120])


@pytest.mark.slow
def test_mkdocs_builds_the_site_strictly(tmp_path):
    import subprocess

    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "recipe" / "index.html").is_file()
