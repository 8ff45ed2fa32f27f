"""TRL's pieces as TRL users write them (issue: rewards called as TRL calls them, conversational prompts): rewards
written as open-r1 writes them (reading `completion[0]["content"]`) run on a chat recipe through the door, the dry
run, the reward audit and the evaluation; every reward gets TRL 1.16's keywords; a reward given by path is named in
`eval.metric` as written (`:` or `.`); a task with its own scorer is measured by it without being listed."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import ROOT, run_flow

from regimen.stages.recipe import load_recipe
from regimen.stages.rewards import get_reward, score

RG = ROOT / "tests" / "rg-tiny.yaml"
sys.path.insert(0, str(ROOT / "tests"))

CHAT = {
    "data.system_prompt": "Answer in <answer></answer>.",
    "model.tiny": {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "max_position_embeddings": 256,
        "chat": True,
    },
    "rewards": [
        {"name": "open_r1_rewards:format_reward", "weight": 0.2},
        {"name": "open_r1_rewards:tag_count_reward", "weight": 0.1},
        {"name": "open_r1_rewards:accuracy_reward", "weight": 1.0},
        {"name": "reasoning_gym", "weight": 0.0},
    ],
    "eval.metric": "open_r1_rewards:accuracy_reward",
    "dry_run.gameable": "warn",
}


def test_rewards_get_trl_s_shapes_and_keywords():
    import open_r1_rewards as r1

    r1.SEEN.clear()
    chat = [{"role": "user", "content": "2+2?"}]
    fns = {"k": get_reward("open_r1_rewards:kwargs_seen"), "acc": get_reward("open_r1_rewards:accuracy_reward")}
    values = score(fns, [chat, chat], ["<answer>4</answer>", "<answer>5</answer>"], {"answer": ["4", "4"]})
    assert values["acc"] == [1.0, 0.0]
    [seen] = r1.SEEN
    assert seen["completion"] == [{"role": "assistant", "content": "<answer>4</answer>"}]
    assert seen["state_step"] == 0 and seen["log_extra"] and seen["log_metric"] and seen["columns"] == ["answer"]


def test_a_reward_by_path_is_named_in_eval_metric_either_way():
    colon = load_recipe(RG, {**CHAT}, check_trl=False)
    dotted = load_recipe(RG, {**CHAT, "eval.metric": "open_r1_rewards.accuracy_reward"}, check_trl=False)
    assert colon.eval.metric == dotted.eval.metric == "open_r1_rewards.accuracy_reward"


def test_a_task_with_its_own_scorer_is_measured_by_it_without_being_listed():
    r = load_recipe(RG, {"rewards": [{"name": "answer"}]}, check_trl=False)
    assert r.eval.metric == "reasoning_gym"
    assert [(s.name, s.weight) for s in r.rewards] == [("answer", 1.0), ("reasoning_gym", 0.0)]


@pytest.mark.slow
def test_open_r1_rewards_run_through_the_dry_run_the_audit_and_the_evaluation(tmp_path):
    over = {**CHAT, "cycle.stop_when_taught": False, "sft.max_steps": 150, "grpo.max_completion_length": 24}
    results = run_flow(RG, tmp_path, overrides=over)
    by = {r["stage"]: r for r in results}
    assert {"sft", "reward-dry-run", "grpo", "eval"} <= set(by), list(by)
    from regimen.stages.store import Store

    dry = Store(tmp_path).latest("rg-tiny", "reward-dry-run")
    audit = dry["reward_audit"]
    assert not audit.get("raised"), audit.get("raised")  # every reward could score the audit's made-up answers
    assert "rewards/open_r1_rewards.accuracy_reward/mean" in dry["metrics"]
    ev = by["eval"]["metrics"]
    assert "heldout_reward/open_r1_rewards.format_reward" in ev and 0.0 <= ev["heldout_accuracy"] <= 1.0


def game_recipe(tmp_path, **over):
    data = tmp_path / "game.jsonl"
    prompt = [{"role": "user", "content": "Play the guessing game."}]

    def trace(digit: int) -> list[dict]:  # a user's own trace in TRL's conversational format: it teaches the tool
        call = {"type": "function", "function": {"name": "guess", "arguments": {"digit": digit}}}
        return [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "guess", "content": "higher"},
            {"role": "assistant", "content": "done"},
        ]

    rows = [{"prompt": prompt, "completion": trace(i % 10)} for i in range(64)]  # one prompt, 64 episodes
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = {
        "data": {"task": "jsonl", "train_file": str(data), "heldout_fraction": 0.25},
        "environment": {"name": "trl_game_for_tests:GuessGame", "max_turns": 2},
        "teacher": {"kind": "oracle"},
        "sft.max_steps": 120,
        "rewards": [{"name": "trl_game_for_tests:reward_score"}],
        "eval.metric": "trl_game_for_tests:reward_score",
        **over,
    }
    return load_recipe(ROOT / "configs" / "tiny-env.yaml", overrides, check_trl=False), overrides


def test_an_environment_task_whose_prompt_repeats_holds_out_fresh_episodes_the_same_every_time(tmp_path):
    """TRL's 2048 example's data: one prompt, repeated; the environment makes each episode different. The held-out
    set is a share of the episodes, and an environment that draws from the global `random` gets the same held-out
    episodes every time (Regimen seeds the generators before each held-out reset)."""
    import random

    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training.episodes import reset_environments

    recipe, _ = game_recipe(tmp_path)
    task = load_task(recipe.data)
    assert len(task.heldout) == 16 and len(task.train) == 48  # episodes, not distinct prompts
    secrets = []
    for _ in range(2):
        random.seed()  # whatever the process's generator holds
        _, extra = reset_environments(recipe, task.heldout)
        secrets.append([env.secret for env in extra["environments"]])
    assert secrets[0] == secrets[1] and len(set(secrets[0])) > 1


@pytest.mark.slow
def test_trl_s_2048_shapes_run_through_the_gated_cycle(tmp_path):
    """The environment class and `reward_score(environments, **kwargs)` as TRL writes them, a dataset of one repeated
    prompt with the user's own tool-call traces: SFT on them, the door, the dry run's episodes, the smoke test, GRPO
    through TRL's environment_factory and the evaluation on held-out episodes, on tiny settings."""
    _, overrides = game_recipe(
        tmp_path,
        **{
            "grpo.max_steps": 2,
            "grpo.per_device_train_batch_size": 16,
            "grpo.save_steps": 2,
            "smoke.max_steps": 2,
            "probe.steps": 2,
            "probe.prompts": 8,
            "probe.train_prompts": 8,
            "dry_run": {"num_prompts": 4, "min_mean_reward": 0.0, "max_mean_reward": 10.0, "max_frac_zero_std": 1.0},
        },
    )
    results = run_flow(ROOT / "configs" / "tiny-env.yaml", tmp_path / "store", overrides=overrides)
    by = {r["stage"]: r for r in results}
    assert {"reward-dry-run", "grpo-smoke", "grpo", "eval"} <= set(by), list(by)
    assert by["eval"]["metrics"]["heldout_size"] == 16
    assert "heldout_reward/trl_game_for_tests.reward_score" in by["eval"]["metrics"]


def tool_traces(path, n: int, seed: int = 0):
    """A user's own multi-turn traces in TRL's conversational format (as TRL's docs write them): the assistant calls
    the `probe` tool of `trl_env_for_tests.HiddenLine`, the tool replies, the assistant answers."""
    import random

    rng = random.Random(seed)
    with open(path, "w") as fh:
        for i in range(n):
            a, b, x = rng.randint(1, 9), rng.randint(0, 9), rng.randint(0, 9)
            value = str(a * x + b)
            call = {"type": "function", "function": {"name": "probe", "arguments": {"x": x}}}
            row = {
                "prompt": [{"role": "user", "content": f"#{i:05d} f({x})=?"}],
                "completion": [
                    {"role": "assistant", "content": "", "tool_calls": [call]},
                    {"role": "tool", "name": "probe", "content": value},
                    {"role": "assistant", "content": value},
                ],
                "a": a,
                "b": b,
                "x": x,
                "answer": value,
            }
            fh.write(json.dumps(row) + "\n")


@pytest.mark.slow
def test_sft_from_a_users_tool_call_traces_teaches_the_tool_format(tmp_path):
    """SFT on conversational traces with tool calls and tool replies (the oracle teacher reads each row's `completion`
    as the messages it is, trained on the assistant's turns): before, the tiny model calls the tool on no held-out
    episode; after, on at least half of them, with calls that fit the tool's schema."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, execute
    from regimen.stages.store import Store
    from regimen.stages.tasks.registry import load_task
    from regimen.stages.training.heldout import heldout_eval
    from regimen.stages.training.model import load_policy
    from regimen.stages.training.policy import base_policy

    data = tmp_path / "traces.jsonl"
    tool_traces(data, 1200)
    overrides = {
        "environment": {"name": "trl_env_for_tests:HiddenLine", "max_turns": 2},
        "rewards": [{"name": "trl_env_for_tests:final_answer_is_f", "weight": 1.0, "as": "final_answer"}],
        "eval": {"metric": "final_answer", "batch_size": 64},
        "data": {"task": "jsonl", "train_file": str(data), "heldout_fraction": 0.05},
        "teacher": {"kind": "oracle"},
        "sft.max_steps": 250,
    }
    recipe = load_recipe(ROOT / "configs" / "tiny-env.yaml", overrides)
    store = Store(tmp_path / "store")
    base = base_policy(recipe, store)
    heldout = load_task(recipe.data).heldout
    model, tokenizer = load_policy(base["model"], recipe)
    before, _ = heldout_eval(model, tokenizer, recipe, heldout)
    sft = execute(StageCall("sft", recipe, {"policy": base}, experiment="tools"), store)
    after = sft.manifest["metrics"]
    lines = (sft.path / "trajectories.jsonl").read_text().splitlines()
    traces = [json.loads(line) for line in lines if json.loads(line).get("kind") == "trace"]
    assert traces and all(isinstance(t["completion"], list) for t in traces)  # messages, never a list's text
    print(f"tool_call_rate before SFT {before['tool_call_rate']:.2f}, after {after['tool_call_rate']:.2f}")
    assert before["tool_call_rate"] <= 0.1 and after["tool_call_rate"] >= 0.5, (before, after)
