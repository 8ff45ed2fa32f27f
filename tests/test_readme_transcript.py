"""The README's first-run block is a transcript of what `regimen run` prints, trimmed only by marked elisions (`…`):
each of its lines has the shape of a line the run prints (the patterns below), and a real run (the tiny recipe)
prints a line of each shape the README shows. A README line the run could not print, or a shape the run no longer
prints, fails here."""

from __future__ import annotations

import re

import pytest
from conftest import ROOT, TINY, run_cli

STAGE = r"(sft|distill|reward-dry-run|grpo-smoke|grpo|eval)"
NUM = r"[-+]?(?:\d+(?:\.\d+)?(?:e[-+]?\d+)?|nan|inf)"
SHAPES = {
    "experiment": r"^experiment \S+ in store \S+$",
    "data": r"^data: \d+ training rows \(.*\); held-out set v\d+, \d+ prompts \(.*\)$",
    "starts": rf"^{STAGE} \(cycle \d+(, round \d+)?\) \.\.\.$",
    "ended": rf"^{STAGE} v\d+ (ran|reused) in \d+\.\ds(?: \(after waiting \d+\.\ds for the machine's compute slot\))?"
    rf"(?:: [a-z_/]+={NUM}(?:, [a-z_/]+={NUM})*)?$",
    "champion": r"^champion: .+$",
    "wall": r"^wall time \d+\.\ds; stages \d+\.\ds(?:; waited \d+\.\ds for this machine's compute slot)?; fixed cost "
    r"-?\d+\.\ds \(wall minus the stages' own time(?: and the wait)?\)$",
    "verdict": r"^verdict: [a-z-]+ — .+$",
}
TABLE = re.compile(r"^[\s┏┃┡│└━┳╇┴─┼┓┩┘┛]|regimen run\s*$")


def readme_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("## What the first run prints")
    block = text[start:].split("```", 2)[1]
    return [line for line in block.splitlines() if line.strip()]


def kind(line: str) -> str | None:
    return next((k for k, pattern in SHAPES.items() if re.match(pattern, line)), None)


def test_every_line_of_the_readme_transcript_has_a_shape_the_run_prints():
    lines = readme_block()
    assert len(lines) >= 8
    unknown = [line for line in lines if not line.startswith("…") and not TABLE.match(line) and kind(line) is None]
    assert unknown == [], unknown
    kinds = {kind(line) for line in lines} - {None}
    assert {"starts", "ended", "verdict", "wall"} <= kinds  # a transcript, not a summary


@pytest.mark.slow
def test_a_real_run_prints_each_shape_the_readme_shows(tmp_path, capsys):
    code, out, err = run_cli(["run", str(TINY), "--store", str(tmp_path / "store")], capsys)
    assert code == 0, err[-2000:]
    printed = {kind(line.rstrip()) for line in (out + err).splitlines()} - {None}
    shown = {kind(line) for line in readme_block()} - {None}
    assert shown <= printed, (shown - printed, out[-3000:])
