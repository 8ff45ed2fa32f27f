"""The path a user with an instruct model takes, on a real-shaped model built here (Qwen3 architecture, a
BPE tokenizer with a chat template, saved like a hub snapshot) and a conversational dataset read through
`datasets.load_dataset` from a local parquet file: no SFT (teacher none) and SFT on conversations."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from regimen.stages import registry
from regimen.stages.store import Store

REAL = ROOT / "tests" / "real.yaml"


@pytest.fixture(scope="module")
def real_model(tmp_path_factory) -> Path:
    from regimen.stages.training.model import build_real_shaped_model

    return build_real_shaped_model(tmp_path_factory.mktemp("models") / "qwen3-tiny")


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    pairs = sorted({(rng.randint(0, 40), rng.randint(0, 40)) for _ in range(200)})[:60]
    table = pa.table(
        {
            "question": [f"What is {a}+{b}?" for a, b in pairs],
            "answer": [str(a + b) for a, b in pairs],
            "source": ["generated"] * len(pairs),
        }
    )
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    pq.write_table(table, path)
    return path


def overrides(model: Path, data: Path, **more) -> list[str]:
    return [f"model.name_or_path={model}", f"data.data_files={data}", *[f"{k}={v}" for k, v in more.items()]]


@pytest.mark.slow
def test_no_teacher_starts_at_the_dry_run_and_renders_the_chat_template(real_model, parquet, tmp_path):
    from regimen.flows.pipeline.cycle import regimen_cycle_recipe
    from regimen.stages.recipe import load_recipe

    recipe = load_recipe(REAL, overrides(real_model, parquet, store=str(tmp_path / "store")))
    results = regimen_cycle_recipe(recipe).results
    assert [(r["stage"], r.get("round")) for r in results] == [
        ("eval", 0),
        ("reward-dry-run", 0),
        ("grpo-smoke", 0),
        ("grpo", 1),
        ("eval", 1),
    ]
    st = Store(tmp_path / "store")
    for stage in ("reward-dry-run", "grpo-smoke", "grpo", "eval"):
        for m in st.versions("real-test", stage):
            assert m["status"] == "completed" and st.verify(m) == []
    assert st.versions("real-test", "sft") == []
    ev = st.latest("real-test", "eval")
    rows = [json.loads(line) for line in (st.local_path(ev) / "trajectories.jsonl").read_text().splitlines()]
    assert rows[0]["prompt"][0] == {"role": "system", "content": "Answer with the number only."}
    assert rows[0]["rendered_prompt"].startswith(
        "<|im_start|>system\nAnswer with the number only.<|im_end|>\n<|im_start|>user\nWhat is "
    )
    assert rows[0]["rendered_prompt"].endswith("<|im_start|>assistant\n")
    grpo = st.latest("real-test", "grpo")
    assert grpo["heldout_probe"] and grpo["heldout_probe"][0]["step"] == 0
    assert json.loads((Path(grpo["inputs"]["policy"]["model"]) / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]


@pytest.mark.slow
def test_an_oracle_teacher_runs_sft_on_conversations(real_model, parquet, tmp_path):
    from regimen.flows.pipeline.cycle import regimen_cycle_recipe
    from regimen.stages.recipe import load_recipe

    recipe = load_recipe(
        REAL, overrides(real_model, parquet, store=str(tmp_path / "store"), **{"teacher.kind": "oracle"})
    )
    results = regimen_cycle_recipe(recipe).results
    assert [r["stage"] for r in results] == list(registry.names_for(recipe))
    st = Store(tmp_path / "store")
    sft = st.latest("real-test", "sft")
    assert sft["metrics"]["traces_kept"] > 0 and sft["metrics"]["steps"] == 4
    traces = [
        json.loads(line)
        for line in (st.local_path(sft) / "trajectories.jsonl").read_text().splitlines()
        if '"trace"' in line
    ]
    assert isinstance(traces[0]["prompt"], list) and traces[0]["prompt"][1]["role"] == "user"


def test_bad_data_is_exit_2_naming_file_column_and_row_and_writes_nothing(real_model, parquet, tmp_path, capsys):
    store = tmp_path / "store"
    base = ["run", str(REAL), "--store", str(store), "--set", f"model.name_or_path={real_model}"]
    code, _, err = run_cli(
        base + ["--set", f"data.data_files={parquet}", "--set", "data.columns.prompt=qestion"], capsys
    )
    assert (
        code == 2 and "data.columns.prompt" in err and "'qestion'" in err and "question" in err and str(parquet) in err
    )
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"PAR1 not really parquet")
    code, _, err = run_cli(base + ["--set", f"data.data_files={broken}"], capsys)
    assert code == 2 and str(broken) in err and "Traceback" not in err
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "What is 1+1?", "answer": "2"}\n' * 3 + '{"question": null, "answer": "3"}\n')
    code, _, err = run_cli(base + ["--set", "data.path=json", "--set", f"data.data_files={rows}"], capsys)
    assert code == 2 and "row 4" in err and "'prompt' must be text" in err and str(rows) in err
    code, _, err = run_cli(
        base + ["--set", "data.path=json", "--set", f"data.data_files={tmp_path / 'missing.jsonl'}"], capsys
    )
    assert code == 2 and "missing.jsonl" in err and "does not exist" in err
    assert not store.exists()


def test_generation_outside_trl_goes_where_the_trainer_runs(monkeypatch, real_model):
    """The device choice, on what this machine has (CPU here), and with an accelerator present."""
    import torch

    from regimen.stages.recipe import load_recipe
    from regimen.stages.recipe import trl as targs
    from regimen.stages.training.model import load_policy

    recipe = load_recipe(
        REAL, [f"model.name_or_path={real_model}", f"data.data_files={ROOT / 'pyproject.toml'}"], check_trl=False
    )
    expected = (
        "cuda:0"
        if torch.cuda.is_available()
        else ("mps" if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available() else "cpu")
    )
    assert targs.device_for(recipe) == expected
    model, _ = load_policy(str(real_model), recipe)
    assert next(model.parameters()).device.type == expected.split(":")[0]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert targs.device_for(recipe) == "cuda:1"
    assert targs.accelerator() == "cuda"
    cpu_recipe = load_recipe(
        REAL,
        [f"model.name_or_path={real_model}", f"data.data_files={ROOT / 'pyproject.toml'}", "grpo.use_cpu=true"],
        check_trl=False,
    )
    assert targs.device_for(cpu_recipe) == "cpu"


def test_every_generating_stage_loads_the_policy_through_the_device_choice():
    """Dry run, evaluation and the teacher generate through `load_policy` (device + dtype); SFT's own
    held-out measurement moves its model to `device_for`; the probe uses the trainer's model."""
    import inspect

    from regimen.stages import dry_run, evaluate, sft
    from regimen.stages.training import teacher

    for module in (dry_run, evaluate, teacher):
        assert "load_policy(" in inspect.getsource(module), module.__name__
    assert "device_for(recipe)" in inspect.getsource(sft.run)
