"""All-alike groups out of GRPO's loss (`curriculum.skip_all_alike`, `stages/training/alike.py`): on a policy that
already differs from the reference (KL > 0), a batch holding an all-alike group gives the same gradient as the batch
without it, under TRL's default aggregation and under `normalize_then_sum`; without the option it does not (the KL
term of the alike group, and its advantages under normalize_then_sum, move the policy)."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY

from regimen.stages.recipe import load_recipe

PROMPT = "12+7="
VARIED = ["19", "18"]  # one right, one wrong: a group that teaches
ALIKE = ["5", "5"]  # the same wrong answer twice: nothing to learn from


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    from regimen.stages.training.model import build_tiny_model

    recipe = load_recipe(TINY, check_trl=False)
    return str(build_tiny_model(recipe.model.tiny.model_dump(), tmp_path_factory.mktemp("policy") / "model"))


def trainer_for(policy, tmp_path, *, skip: bool, aggregation: str = "sum_then_normalize"):
    from regimen.stages.training import trajectories
    from regimen.stages.training.grpo_trainer import build_trainer

    over = {
        "grpo.num_generations": 2,
        "grpo.per_device_train_batch_size": 4,
        "grpo.beta": 0.5,
        "grpo.multi_objective_aggregation": aggregation,
        "curriculum.skip_all_alike": skip,
    }
    recipe = load_recipe(TINY, overrides=over)
    trainer, _ = build_trainer(recipe, policy, tmp_path / "out", trajectories.Recorder(), alike=skip)
    trainer.current_gradient_accumulation_steps = 1
    return trainer, trainer.processing_class


def batch(tokenizer, completions: list[str], model, reference: dict[str, torch.Tensor]):
    """TRL's inputs to `compute_loss` for `completions` of one prompt; the reference's log-probabilities from
    `reference` (weights), so the policy's KL to it is above 0."""
    prompt = tokenizer([PROMPT] * len(completions), return_tensors="pt", add_special_tokens=False)
    ids = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    width = max(len(i) for i in ids)
    completion_ids = torch.tensor([i + [tokenizer.pad_token_id] * (width - len(i)) for i in ids])
    mask = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    current = {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(reference)
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([prompt["input_ids"], completion_ids], 1),
            attention_mask=torch.cat([prompt["attention_mask"], mask], 1),
        ).logits[:, prompt["input_ids"].size(1) - 1 : -1]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)
    model.load_state_dict(current)
    return {
        "prompt_ids": prompt["input_ids"],
        "prompt_mask": prompt["attention_mask"],
        "completion_ids": completion_ids,
        "completion_mask": mask,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }, ids


def gradient(trainer, inputs, advantages) -> torch.Tensor:
    trainer.model.train()
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, {**inputs, "advantages": torch.tensor(advantages)})
    loss.backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


def scored(trainer, ids, values: list[list[float]]):
    """What TRL's reward call tells the listeners: the completions' token ids and each reward's values."""
    if trainer.out_of_loss is not None:
        trainer.out_of_loss.listener()({"completion_ids": list(ids)}, values)


@pytest.mark.parametrize("aggregation", ["sum_then_normalize", "normalize_then_sum"])
@pytest.mark.parametrize("skip", [True, False])
def test_an_all_alike_group_gives_no_gradient_kl_included(policy, tmp_path, skip, aggregation):
    trainer, tokenizer = trainer_for(policy, tmp_path, skip=skip, aggregation=aggregation)
    model = trainer.model
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():  # the policy has moved away from the reference: KL > 0
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    both, ids = batch(tokenizer, VARIED + ALIKE, model, reference)
    alone, ids_alone = batch(tokenizer, VARIED, model, reference)
    # rewards: answer (1 / 0 for the varied group, 0 / 0 for the alike one) and format (1 everywhere)
    values = [[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]
    # advantages as each aggregation gives them: 0 for the alike group under sum_then_normalize; under
    # normalize_then_sum the batch's normalisation shifts every sample, the alike group's included
    adv_both = [1.0, -1.0, 0.0, 0.0] if aggregation == "sum_then_normalize" else [1.2, -0.9, -0.15, -0.15]
    adv_alone = [1.0, -1.0] if aggregation == "sum_then_normalize" else [1.2, -0.9]
    scored(trainer, ids, values)
    with_alike = gradient(trainer, both, adv_both)
    scored(trainer, ids_alone, [v[:2] for v in values])
    without = gradient(trainer, alone, adv_alone)
    assert with_alike.abs().sum() > 0
    if skip:
        torch.testing.assert_close(with_alike, without, rtol=1e-5, atol=1e-7)
    else:  # TRL as it is: the alike group's KL (and, normalize_then_sum, its advantages) move the policy
        assert not torch.allclose(with_alike, without, rtol=1e-5, atol=1e-7)


def test_a_slice_of_only_alike_samples_gives_a_zero_gradient(policy, tmp_path):
    trainer, tokenizer = trainer_for(policy, tmp_path, skip=True)
    model = trainer.model
    reference = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    inputs, ids = batch(tokenizer, ALIKE, model, reference)
    scored(trainer, ids, [[0.0, 0.0], [1.0, 1.0]])
    assert gradient(trainer, inputs, [0.0, 0.0]).abs().sum() == 0


def test_the_option_is_refused_under_accelerate_launch_in_one_line(tmp_path, capsys):
    from conftest import run_cli

    code, out, err = run_cli(
        [
            "check",
            str(TINY),
            "--set",
            "curriculum.skip_all_alike=true",
            "--set",
            "launcher=accelerate",
            "--set",
            "accelerate.num_processes=2",
        ],
        capsys,
    )
    assert code == 2 and "curriculum.skip_all_alike" in err and "one process" in err
    assert len(err.strip().splitlines()) == 1, err
