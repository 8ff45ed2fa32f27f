"""`regimen reward-check` logic: table and JSON output, input errors that name file/line/field,
rewards from --reward or a recipe, gameable warnings, and thousands of samples quickly."""

from __future__ import annotations

import json
import time

import pytest

from regimen.flows.cli.reward_check import main
from regimen.stages import sandbox
from regimen.stages.core.errors import InputError

SAMPLES = [
    {"prompt": "Q: 2+2=", "completion": "4", "answer": "4"},
    {"prompt": "Q: 3*3=", "completion": "nine\nbecause", "answer": "9"},
    {"prompt": "Q: ?", "completion": [{"role": "assistant", "content": "12"}], "answer": None},
    {"prompt": "Q: 10/4=", "completion": "2.50", "answer": 2.5},
]


def summary_cells(out: str, name: str) -> list[str]:
    """The numbers of reward `name`'s row in the summary table (weight column skipped)."""
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("│").split("│")]
        if line.startswith("│") and len(cells) == 8 and cells[0] == name:
            return cells[2:]
    raise AssertionError(f"no summary row for {name!r} in:\n{out}")


def write(tmp_path, rows, name="samples.jsonl", raw=None):
    path = tmp_path / name
    path.write_text(raw if raw is not None else "".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return str(path)


def test_json_mode_prints_one_line_per_sample(tmp_path, capsys):
    path = write(tmp_path, SAMPLES)
    assert main(path, None, ["answer", "format"], True) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert len(lines) == len(SAMPLES)
    records = [json.loads(line) for line in lines]
    for sample, record in zip(SAMPLES, records):
        assert {k: record[k] for k in sample} == sample
    assert [r["rewards"]["answer"] for r in records] == [1.0, 0.0, None, 1.0]
    assert [r["rewards"]["format"] for r in records] == [1.0, 0.0, 1.0, 1.0]
    assert "WARNING" not in out and "WARNING" not in err


def test_table_mode_shows_rows_and_summary(tmp_path, capsys):
    path = write(tmp_path, SAMPLES)
    assert main(path, None, ["answer", "format"], False) == 0
    out = capsys.readouterr().out
    assert "summary" in out and "answer" in out and "format" in out
    # answer: three scored (1, 0, 1), one None -> mean 0.667, std 0.471
    assert summary_cells(out, "answer") == ["0.667", "0.471", "0.000", "1.000", "3", "1"]
    assert "Q: 2+2=" in out


def test_gameable_rewards_are_announced(tmp_path, capsys):
    path = write(tmp_path, SAMPLES)
    main(path, None, ["digits", "code_block"], False)
    out = capsys.readouterr().out
    assert "gameable" in out.lower() and "digits" in out and "code_block" in out
    main(path, None, ["code_block"], True)
    out, err = capsys.readouterr()
    assert "gameable" in err.lower() and "code_block" in err
    assert all(json.loads(line) for line in out.splitlines())  # stdout stays pure JSON lines


@pytest.mark.parametrize(
    "raw, message",
    [
        ("", "empty"),
        ("\n  \n", "empty"),
        ('{"completion": "4"}\n{"completion": \n', ":2: invalid JSON"),
        ('{"completion": "4"}\n[1, 2]\n', ":2: each line must be a JSON object"),
        ('{"completion": "4"}\n\n{"prompt": "p"}\n', ":3: missing field 'completion'"),
        ('{"completion": 4}\n', ":1: field 'completion' must be a string or a list of chat messages"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path, raw, message):
    path = write(tmp_path, [], raw=raw)
    with pytest.raises(InputError, match="samples.jsonl") as info:
        main(path, None, ["answer"], True)
    assert message in str(info.value)


def test_bad_arguments(tmp_path):
    path = write(tmp_path, SAMPLES)
    with pytest.raises(InputError, match="--reward"):
        main(path, None, [], False)
    with pytest.raises(InputError, match="unknown reward 'nope'"):
        main(path, None, ["nope"], False)
    with pytest.raises(InputError, match="cannot read"):
        main(str(tmp_path / "missing.jsonl"), None, ["answer"], False)


def _recipe(tmp_path) -> str:
    path = tmp_path / "recipe.yaml"
    path.write_text("rewards:\n  - {name: answer, weight: 1.0}\n  - {name: format, weight: 0.5, pattern: '\\d+'}\n")
    return str(path)


def test_rewards_from_a_recipe(tmp_path, capsys):
    recipe = _recipe(tmp_path)
    path = write(tmp_path, SAMPLES)
    main(path, recipe, [], True)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rewards"]["format"] for r in records] == [1.0, 0.0, 1.0, 0.0]  # the recipe's pattern
    main(path, recipe, [], False)
    out = capsys.readouterr().out
    assert "weighted total" in out and "total" in out
    # --reward wins, and borrows the recipe's options for a reward the recipe lists
    main(path, recipe, ["format"], True)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [list(r["rewards"]) for r in records] == [["format"]] * 4
    assert records[3]["rewards"]["format"] == 0.0


def test_a_bad_recipe_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rewards: [{name: nosuch}]\n")
    with pytest.raises(InputError, match="nosuch"):
        main(write(tmp_path, SAMPLES), str(bad), [], False)


@pytest.mark.skipif(not sandbox.isolation_status()[0], reason="isolated sandbox unavailable")
def test_unit_tests_through_reward_check(tmp_path, capsys):
    tests = ["assert add(1, 2) == 3", "assert add(2, 2) == 4", "assert add(0, 1) == 2"]
    rows = [
        {"prompt": "add", "completion": "```python\ndef add(a, b):\n    return a + b\n```", "tests": tests},
        {
            "prompt": "add",
            "completion": "```python\ndef add(a, b):\n    return 3 if a == 1 else 4\n```",
            "tests": tests,
        },
        {"prompt": "no tests", "completion": "hello"},
    ]
    main(write(tmp_path, rows), None, ["unit_tests", "code_block"], True)
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["rewards"]["unit_tests"] for r in records] == [pytest.approx(2 / 3), pytest.approx(2 / 3), None]
    assert [r["rewards"]["code_block"] for r in records] == [1.0, 1.0, 0.0]


def test_two_thousand_text_samples_are_quick(tmp_path, capsys):
    rows = []
    for i in range(2000):
        right = i % 4 != 0
        rows.append(
            {
                "prompt": f"Q: {i}+{i}=",
                "completion": str(2 * i) if right else f"{2 * i + 1}\nwait",
                "answer": str(2 * i),
            }
        )
    path = write(tmp_path, rows)
    started = time.monotonic()
    main(path, None, ["answer", "format", "digits"], True)
    json_s = time.monotonic() - started
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(records) == 2000
    answers = [r["rewards"]["answer"] for r in records]
    assert sum(answers) == 1500 and all(r["prompt"] == row["prompt"] for r, row in zip(records, rows))
    started = time.monotonic()
    main(path, None, ["answer", "format", "digits"], False)
    table_s = time.monotonic() - started
    out = capsys.readouterr().out
    assert "first 20 of 2000 samples" in out
    assert summary_cells(out, "answer") == ["0.750", "0.433", "0.000", "1.000", "2000", "0"]
    assert summary_cells(out, "digits (GAMEABLE)") == ["1.000", "0.000", "1.000", "1.000", "2000", "0"]
    assert json_s < 5 and table_s < 5, (json_s, table_s)


@pytest.mark.skipif(not sandbox.isolation_status()[0], reason="isolated sandbox unavailable")
def test_the_judge_through_regimen_reward_check(tmp_path, capsys):
    """`regimen reward-check --reward unit_tests`, as a new user tries the judge: correct answers in the
    forms models write score 1.0, a wrong one 0, a row that pays anything None with a note, and tests that
    evaluate the solution's strings are refused naming the file and line (exit 2)."""
    from conftest import run_cli

    usage = (
        "```python\ndef area(w, h):\n    return w * h\n```\nUsage:\n```python\nprint(area(2, 3))\n```\n"
        "```bash\npython area.py\n```"
    )
    rows = [
        {
            "prompt": "Area of a rectangle.",
            "completion": usage,
            "test_list": ["assert area(2, 3) == 6", "assert area(0, 9) == 0"],
        },
        {
            "prompt": "Sum the numbers.",
            "completion": "```python\nimport sys\nprint(sum(map(int, sys.stdin.read().split())))\n```",
            "input_output": json.dumps({"inputs": ["1 2\n", "5\n"], "outputs": ["3\n", "5\n"]}),
        },
        {
            "prompt": "Area of a rectangle.",
            "completion": "```python\ndef area(w, h):\n    return w + h\n```",
            "test_list": ["assert area(2, 3) == 6"],
        },
        {"prompt": "p", "completion": "x = 1", "tests": ["assert True"]},
    ]
    code, out, err = run_cli(
        ["reward-check", "--samples", write(tmp_path, rows), "--reward", "unit_tests", "--json"], capsys
    )
    assert code == 0, err
    assert [json.loads(line)["rewards"]["unit_tests"] for line in out.splitlines()] == [1.0, 1.0, 0.0, None]
    assert "pass their tests with no solution at all" in err and "samples.jsonl:4" in err
    evil = [
        {
            "prompt": "p",
            "completion": "```python\ndef expr():\n    return '1'\n```",
            "tests": ["assert eval(expr()) == 1"],
        }
    ]
    code, _, err = run_cli(
        ["reward-check", "--samples", write(tmp_path, evil, "evil.jsonl"), "--reward", "unit_tests"], capsys
    )
    assert code == 2 and "evil.jsonl:1" in err and "evaluate strings" in err and "Traceback" not in err
