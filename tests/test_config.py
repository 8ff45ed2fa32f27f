"""Bad recipes: exit 2, one message naming the field (or file, or line), nothing written."""

import json
import textwrap
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY, run_cli

from regimen.stages.core.errors import InputError
from regimen.stages.recipe import load_recipe, parse_set


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "recipe.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def tiny_with(tmp_path: Path, **sections) -> Path:
    data = yaml.safe_load(TINY.read_text())
    for key, value in sections.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    p = tmp_path / "recipe.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


BAD = {
    "yaml-syntax": ("experiment: x\nsft: {max_steps: 3\n", ["line", "YAML syntax"]),
    "empty": ("", ["empty"]),
    "unknown-section": ("experiment: x\ntrainer: {a: 1}\n", ["trainer", "unknown section"]),
    "unknown-field": ("grpo: {num_generatoins: 4}\n", ["grpo.num_generatoins", "not a field of TRL's GRPOConfig"]),
    "unknown-nested": ("cycle: {max_cycle: 2}\n", ["cycle.max_cycle", "allowed"]),
    "wrong-type": ("grpo: {learning_rate: fast}\n", ["grpo.learning_rate"]),
    "wrong-type-section": ("dry_run: {num_prompts: many}\n", ["dry_run.num_prompts"]),
    "num-generations": ("grpo: {num_generations: 1, per_device_train_batch_size: 8}\n", ["num_generations", ">= 2"]),
    "beta-negative": ("grpo: {beta: -0.1}\n", ["beta", "> 0"]),
    "beta-zero": ("grpo: {beta: 0.0}\n", ["beta", "> 0"]),
    "batch-divisible": (
        "grpo: {num_generations: 8, per_device_train_batch_size: 12}\n",
        ["divisible by num_generations", "12"],
    ),
    "model-path": ("model: {name_or_path: ./no/such/model}\n", ["model.name_or_path", "does not exist"]),
    "max-cycles": ("cycle: {max_cycles: 0}\n", ["cycle.max_cycles"]),
    "unknown-reward": ("rewards: [{name: nosuch}]\n", ["nosuch", "unknown reward"]),
    # numbers the door once let through, to fail after SFT and the dry run wrote versions (or never end)
    "beta-nan": ("grpo: {beta: .nan}\n", ["grpo.beta", "finite"]),
    "beta-inf": ("grpo: {beta: .inf}\n", ["grpo.beta", "finite"]),
    "beta-huge": ("grpo: {beta: 1.0e+308}\n", ["grpo.beta", "<= 10000"]),
    "lr-nan": ("grpo: {learning_rate: .nan}\n", ["grpo.learning_rate", "finite"]),
    "lr-inf": ("grpo: {learning_rate: -.inf}\n", ["grpo.learning_rate", "finite"]),
    "lr-huge": ("grpo: {learning_rate: 1.0e+308}\n", ["grpo.learning_rate", "<= 10"]),
    "temperature-zero": ("grpo: {temperature: 0}\n", ["grpo.temperature", "> 0"]),
    "temperature-negative": ("grpo: {temperature: -1.0}\n", ["grpo.temperature", "> 0"]),
    "seed-2-64": ("grpo: {seed: 18446744073709551616}\n", ["grpo.seed"]),
    "sft-seed-2-32": ("sft: {seed: 4294967296}\n", ["sft.seed", "<= 4.29497e+09"]),
    "max-cycles-1e9": ("cycle: {max_cycles: 1000000000}\n", ["cycle.max_cycles", "1000"]),
    "num-proc": ("sft: {dataset_num_proc: 64}\n", ["sft.dataset_num_proc", "compute slot"]),
    "workers": ("grpo: {dataloader_num_workers: 64}\n", ["grpo.dataloader_num_workers", "compute slot"]),
    "max-steps-1e12": ("grpo: {max_steps: 1000000000000}\n", ["grpo.max_steps"]),
    "limit-steps": (
        "limits: {max_steps: 5}\nsft: {max_steps: 5}\ngrpo: {max_steps: 6}\n",
        ["grpo.max_steps", "limits.max_steps", "5"],
    ),
    "limit-epochs": ("limits: {max_steps: 50}\nsft: {max_steps: -1}\n", ["sft.max_steps", "epochs"]),
    "limit-checkpoints": (
        "limits: {max_checkpoints: 3}\ngrpo: {save_total_limit: 10}\n",
        ["grpo.save_total_limit", "limits.max_checkpoints"],
    ),
    "dry-run-nan": ("dry_run: {min_mean_reward: .nan}\n", ["dry_run.min_mean_reward"]),
    # YAML that parsed into something else than was written, or into nothing Python can hold
    "section-twice": ("sft: {max_steps: 3}\nsft: {max_steps: 5}\n", ["line 2", "'sft' is written twice"]),
    "field-twice": ("grpo: {beta: 0.9, beta: 0.04}\n", ["line 1", "'beta' is written twice"]),
    "int-of-5000-digits": (f"sft: {{max_steps: {'9' * 5000}}}\n", ["4300 digits"]),
    "nested-5000-deep": ("sft: {foo: " + "[" * 5000 + "]" * 5000 + "}\n", ["nested too deeply"]),
    "nested-100-deep": ("sft: {foo: " + "[" * 100 + "]" * 100 + "}\n", ["nested deeper than 64"]),
    "bands-crossed": (
        "curriculum: {bands: {easy: 0.1, hard: 0.9}}\n",
        ["curriculum.bands", "hard (0.9) must be below"],
    ),
    "keep-twice": ("store: {url: somewhere, keep: {last: 2}}\nkeep: {last: 3}\n", ["store.keep and keep"]),
    "alias-of-itself": ("peft: &a {r: 8, lora_alpha: *a}\n", ["contains itself"]),
    "alias-bomb": (
        "x0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n"
        + "".join(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9))
        + "sft: {dataset_kwargs: {bomb: *a8}}\n",
        ["200,000 values"],
    ),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_recipe_is_exit_2_with_field_named_and_nothing_written(name, tmp_path, capsys):
    text, needles = BAD[name]
    recipe = write(tmp_path, text)
    store = tmp_path / "store"
    code, out, err = run_cli(["run", str(recipe), "--store", str(store)], capsys)
    assert code == 2, (out, err)
    for needle in needles:
        assert needle in err, (needle, err)
    assert "Traceback" not in err + out
    assert not store.exists()


def test_missing_file_and_malformed_set(tmp_path, capsys):
    code, _, err = run_cli(["run", str(tmp_path / "nope.yaml"), "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "does not exist" in err
    code, _, err = run_cli(["run", str(TINY), "--set", "grpo.beta", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "--set 'grpo.beta'" in err and "KEY=VALUE" in err
    code, _, err = run_cli(["run", str(TINY), "--set", "grpo.beta=-1", "--store", str(tmp_path / "s")], capsys)
    assert code == 2 and "beta" in err
    assert not (tmp_path / "s").exists()


def test_set_is_typed_by_the_schema():
    r = load_recipe(TINY, ["grpo.beta=0.05", "cycle.max_cycles=3", "grpo.use_vllm=false", "sft.learning_rate=1e-4"])
    assert r.grpo["beta"] == 0.05 and isinstance(r.grpo["beta"], float)
    assert r.cycle.max_cycles == 3
    assert r.grpo["use_vllm"] is False
    assert r.sft["learning_rate"] == 1e-4
    assert parse_set(["a.b=[1, 2]"]) == {"a.b": [1, 2]}


def test_batch_rule_counts_processes():
    # 16 completions suit groups of 8 on one process and on two (16x2=32), but 12 suits neither
    load_recipe(
        TINY,
        [
            "grpo.num_generations=8",
            "grpo.per_device_train_batch_size=16",
            "launcher=accelerate",
            "accelerate.num_processes=2",
        ],
    )
    with pytest.raises(InputError, match=r"grpo\.(per_device_train_batch_size|num_generations).*with 3 processes"):
        load_recipe(
            TINY,
            [
                "grpo.num_generations=8",
                "grpo.per_device_train_batch_size=4",
                "launcher=accelerate",
                "accelerate.num_processes=3",
            ],
        )


def test_check_prints_resolved_recipe_with_where_each_value_came_from(capsys):
    code, out, _ = run_cli(["check", str(TINY)], capsys)
    assert code == 0
    resolved = yaml.safe_load(out.rsplit("\n# ", 1)[0])
    # the object's value: TRL turns "none" into []
    assert resolved["grpo"]["beta"] == 0.04 and resolved["grpo"]["report_to"] == []
    assert resolved["experiment"] == "tiny-test"
    lines = out.splitlines()
    assert "  beta: 0.04  # recipe" in lines  # tiny.yaml sets it
    assert any(line.startswith("  report_to: []  # TRL default") for line in lines)
    from regimen.stages.recipe import load_recipe as load
    from regimen.stages.recipe import trl

    built = trl.config(load(TINY), "grpo")  # what `check` printed is read from the object training uses
    assert resolved["grpo"]["generation_batch_size"] == built.generation_batch_size == 16
    assert resolved["grpo"]["reward_weights"] == built.reward_weights == [1.0, 0.2]
    assert any(
        line.startswith("  reward_weights: [1.0, 0.2]  # Regimen, when the trainer is built: from rewards[].weight")
        for line in lines
    )
    assert any(line.startswith("  ddp_find_unused_parameters: false  # Regimen:") for line in lines)
    assert "  max_new_tokens: 4  # from grpo.max_completion_length" in lines


def test_a_recipe_with_only_model_and_data_trains_with_trl_defaults(tmp_path, capsys):
    """The tiny task's tuned values are in its recipes, not in the code: a bare recipe gets TRL's."""
    from trl import GRPOConfig, SFTConfig

    recipe = write(tmp_path, "model: {name_or_path: tiny}\ndata: {task: addition}\n")
    r = load_recipe(recipe)
    assert r.grpo_value("learning_rate") == GRPOConfig.learning_rate == 1e-6
    assert r.grpo_value("max_completion_length") == GRPOConfig.max_completion_length == 512
    assert r.sft_value("learning_rate") == SFTConfig.learning_rate
    assert r.sft_value("max_steps") == -1 and r.grpo_value("num_train_epochs") == 3.0
    assert r.grpo_value("beta") == 0.04  # Regimen's one documented difference: a KL penalty always
    assert r.max_new_tokens() == 512
    code, out, err = run_cli(["check", str(recipe)], capsys)  # the run would refuse it: so does check (issue 51)
    assert code == 2 and "model.tiny.max_position_embeddings=64 is too small" in err, (out, err)
    code, out, _ = run_cli(["check", str(recipe), "--set", "model.tiny.max_position_embeddings=544"], capsys)
    assert code == 0
    assert (
        "  learning_rate: 1.0e-06  # TRL default" in out.splitlines()
        or "  learning_rate: 1e-06  # TRL default" in out.splitlines()
    )
    assert "  max_completion_length: 512  # TRL default" in out.splitlines()
    assert any(line.startswith("  beta: 0.04  # Regimen:") for line in out.splitlines())


def test_default_and_shipped_configs_validate():
    for path in sorted((TINY.parent.parent / "configs").rglob("*.yaml")):
        if path.parent.name == "accelerate":
            continue
        load_recipe(path)


def test_save_total_limit_of_one_is_refused():
    with pytest.raises(InputError, match="save_total_limit must be at least 2"):
        load_recipe(TINY, ["grpo.save_total_limit=1"])
    load_recipe(TINY, ["grpo.save_total_limit=3"])


def test_no_means_the_string_no_for_trl_strategies(tmp_path):
    assert parse_set(["grpo.save_strategy=no", "x=true"]) == {"grpo.save_strategy": "no", "x": True}
    assert load_recipe(TINY, ["grpo.save_strategy=no"]).grpo["save_strategy"] == "no"
    # YAML's bare `no`
    assert load_recipe(tiny_with(tmp_path, sft={"save_strategy": False})).sft["save_strategy"] == "no"


def test_a_reward_renamed_with_as_survives_the_recipes_own_dump_and_its_explanation():
    """The launch spec (`accelerate launch`) and `regimen check` carry the recipe as a dict: a reward's `as:` must
    come back as `as` (the field is `as_` in Python), or every rank refuses the spec."""
    from regimen.stages.recipe import explain, load_recipe, recipe_from_dict

    recipe = load_recipe(ROOT / "configs" / "default.yaml", ["rewards=[{name: answer, as: acc}]"], check_trl=False)
    again = recipe_from_dict(recipe.model_dump(mode="json", by_alias=True), "launch spec")
    assert [r.key for r in again.rewards] == ["acc"]
    assert "as: acc" in explain(recipe)


def test_check_shows_every_value_regimen_sets_when_the_trainer_is_built(capsys):
    """save_total_limit (5 unless told; TRL keeps all), and with a curriculum the stream's two GRPO fields: each with
    Regimen as its source, as the stages set them (`recipe/trl.stage_time`), never `# TRL default`."""
    from conftest import run_cli

    code, out, _ = run_cli(["check", str(TINY), "--set", "curriculum.enabled=true"], capsys)
    assert code == 0
    lines = {line.split(":")[0].strip(): line for line in out.splitlines() if line.startswith("  ")}
    assert "save_total_limit: 5  # Regimen, when the trainer is built" in out
    assert "TRL default" not in lines["save_total_limit"]
    assert "shuffle_dataset: false  # Regimen" in out and "ignore_data_skip: true  # Regimen" in out
    code, out, _ = run_cli(["check", str(TINY)], capsys)
    assert "shuffle_dataset: false  # Regimen" not in out


def test_a_date_like_value_is_the_text_written_and_the_store_refuses_what_it_cannot_open(tmp_path):
    # YAML's dates are not a recipe's: `experiment: 2024-13-45` raised inside PyYAML's date constructor
    assert load_recipe(write(tmp_path, "experiment: 2024-12-07\n"), check_trl=False).experiment == "2024-12-07"
    assert parse_set(["experiment=2024-13-45"]) == {"experiment": "2024-13-45"}
    assert parse_set(['grpo.beta="x']) == {"grpo.beta": '"x'}  # not YAML at all: the text as written
    from regimen.stages.store import Store

    # a store no run could open: refused at the door, as `regimen check` refuses it, and by the store itself (`--store`)
    for url, says in (("foo://x", "no filesystem for foo://"), ("", "empty")):
        with pytest.raises(InputError, match=f"store: {says}"):
            load_recipe(write(tmp_path, f"store: '{url}'\n"), check_trl=False)
        with pytest.raises(InputError, match=says):
            Store(url)


@pytest.mark.parametrize(
    "body, says",
    [
        ("raise RuntimeError('boom at import\\nsecond line')", "RuntimeError: boom at import"),
        ("def f(:\n    pass", "SyntaxError"),
        ("import sys\nsys.exit(3)", "SystemExit: 3"),
    ],
)
def test_a_users_module_that_raises_while_it_loads_is_one_line_naming_the_field(
    body, says, tmp_path, capsys, monkeypatch
):
    name = f"broken_{abs(hash(body)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    store = tmp_path / "store"
    code, out, err = run_cli(
        ["run", str(TINY), "--store", str(store), "--set", f"rewards=[{{name: '{name}:f'}}]"], capsys
    )
    assert code == 2 and f"rewards: '{name}:f': importing {name} raised {says}" in err, (out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and not store.exists()
    env = ROOT / "configs" / "tiny-env.yaml"
    code, out, err = run_cli(["check", str(env), "--set", f"environment.name={name}:Env"], capsys)
    assert code == 2 and f"environment.name: '{name}:Env': importing {name} raised {says}" in err, (out, err)
    samples = tmp_path / "samples.jsonl"
    samples.write_text('{"completion": "4", "answer": "4"}\n')
    code, out, err = run_cli(["reward-check", "--samples", str(samples), "--reward", f"{name}:f"], capsys)
    assert code == 2 and f"--reward '{name}:f': importing {name} raised {says}" in err, (out, err)
    assert len(err.strip().splitlines()) == 1, err


def test_an_error_naming_a_file_prints_the_name_as_written(tmp_path, capsys):
    # rich's emoji codes: `my:fire:recipe.yaml` was printed with an emoji in place of `:fire:`
    code, _, err = run_cli(["check", str(tmp_path / "my:fire:recipe.yaml")], capsys)
    assert code == 2 and "my:fire:recipe.yaml: file does not exist" in err, err


@pytest.mark.slow
def test_a_run_refused_inside_the_flow_prints_one_line(tmp_path, no_shared_api):
    # a bad data row is found once the flow reads the data: Prefect's events worker used to print "Still processing
    # items: N items remaining..." before the error as the run ended (with its own temporary server, as a user has)
    import os
    import subprocess
    import sys

    rows = [json.dumps({"prompt": f"Q: 0+{i}=", "answer": str(i)}) for i in range(5)]
    (tmp_path / "train.jsonl").write_text("\n".join(rows[:3] + ['{"prompt": "x", '] + rows[3:]) + "\n")
    recipe = write(
        tmp_path,
        """
        experiment: bad-row
        model: {name_or_path: tiny, tiny: {hidden_size: 32, intermediate_size: 64, num_hidden_layers: 1,
                num_attention_heads: 2}}
        data: {task: jsonl, train_file: train.jsonl}
        teacher: {kind: none}
        """,
    )
    r = subprocess.run(
        [str(Path(sys.executable).parent / "regimen"), "run", str(recipe), "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: train.jsonl:4: invalid JSON (Expecting property name enclosed in double quotes at column 1)"
    ], r.stderr
