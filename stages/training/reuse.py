"""The screen's answers reused as the first attempts of the group (SPEED-RL's reuse, `curriculum.screen_reuse`).

Without reuse, a screened prompt costs its screening answers on top of its group's, and its group is new draws that
can still come out all alike. With it, the answers that got a candidate through the screen (which differ, or it would
have been skipped) become `screen_samples` of its group's `num_generations` attempts, and only the rest are generated
when TRL asks; every admitted group therefore teaches, and an admitted prompt costs no answer more than plain GRPO's.

On TRL's public surface: GRPO's generation is replaced through `rollout_func` (a `GRPOTrainer` argument; TRL calls it
with the prompts of the generation batch, each repeated `num_generations` times, and the trainer). `Answers` is that
function: it tokenizes the prompts as TRL does (`processing_class(text=...)` for text, `apply_chat_template` with the
trainer's `chat_template` and `chat_template_kwargs` for conversations), takes the kept answers of each prompt, and
samples the rest with the trainer's own `generation_config` (TRL's sampling settings, `generation_kwargs` included),
cut after the first end-of-sequence token as TRL cuts them. The screen samples its answers the same way, so a group's
attempts, kept and new, come from one recipe. It returns no sampling log-probabilities: without vLLM, TRL reads them
nowhere (they feed only vLLM's importance-sampling correction).

Where it does not run (`possible`): with `environment:` (TRL runs its tool loop on what `rollout_func` returns, and an
episode's answers are not token lists to hand back), or with `use_vllm` / `use_transformers_continuous_batching` (the
group's other attempts would come from another engine). There the screen's answers are spent on top of the group's,
as before, and the manifest's `sampler.reason` says so.

Kept answers are up to `MAX_AGE` optimizer steps old when they enter a group (the dataloader fetches a batch ahead,
and the candidates one screening call admits wait in a queue): like any asynchronous GRPO, such attempts are slightly
off-policy, and TRL (with `num_iterations` 1) treats them as the current policy's. Older ones are dropped, their
group generated whole; their ages are counted (`summary`). Kept answers are saved with the screen's state in each
checkpoint, so the candidates a resume restores to the screen's queue find theirs.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

MAX_AGE = 4  # optimizer steps a kept answer may be old when it enters its group


def possible(recipe) -> tuple[bool, str]:
    """(whether the screen's answers can be reused here, why not when not)."""
    if not recipe.curriculum.screen_reuse:
        return False, "curriculum.screen_reuse is off"
    if recipe.environment is not None:
        return False, "environment: TRL's tool loop runs on what rollout_func returns"
    for engine in ("use_vllm", "use_transformers_continuous_batching"):
        if recipe.grpo_value(engine):
            return False, f"grpo.{engine}: the group's other attempts would come from another engine"
    return True, ""


def key(prompt: Any) -> str:
    return prompt if isinstance(prompt, str) else json.dumps(prompt, sort_keys=True, default=str)


class Answers:
    """The kept answers, and TRL's `rollout_func` that hands them back (see the module doc). `trainer` is bound when
    the trainer is built (the screen samples through it before TRL first calls this)."""

    def __init__(self, batch_size: int = 256):
        self.trainer = None
        self.batch_size = max(1, int(batch_size))
        self.kept: dict[str, deque[tuple[int, list[list[int]]]]] = {}
        self.counts = {"reused": 0, "generated": 0, "dropped_old": 0, "age_sum": 0}

    # --- sampling as TRL samples -------------------------------------------------------------------------------------
    def tokenize(self, prompts: list[Any]) -> list[list[int]]:
        t = self.trainer
        tok = t.processing_class
        if isinstance(prompts[0], str):
            return [list(ids) for ids in tok(text=prompts)["input_ids"]]
        out = tok.apply_chat_template(
            conversation=prompts,
            chat_template=t.chat_template,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **t.chat_template_kwargs,
        )
        return [list(ids) for ids in out["input_ids"]]

    def sample(self, model, prompt_ids: list[list[int]]) -> list[list[int]]:
        """One completion per entry of `prompt_ids` (token ids, cut after the first end-of-sequence token)."""
        import torch

        t = self.trainer
        cfg = t.generation_config
        pad = t.processing_class.pad_token_id
        eos = cfg.eos_token_id if isinstance(cfg.eos_token_id, list) else [cfg.eos_token_id]
        device = next(model.parameters()).device
        was_training = model.training
        model.eval()  # dropout off, and no gradient checkpointing while sampling
        out: list[list[int]] = []
        try:
            with torch.inference_mode():
                for i in range(0, len(prompt_ids), self.batch_size):
                    chunk = prompt_ids[i : i + self.batch_size]
                    width = max(len(p) for p in chunk)
                    ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk], device=device)
                    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk], device=device)
                    gen = model.generate(input_ids=ids, attention_mask=mask, generation_config=cfg)[:, width:]
                    for row in gen.tolist():
                        cut = next((j for j, x in enumerate(row) if x in eos), None)
                        out.append(row if cut is None else row[: cut + 1])
        finally:
            model.train(was_training)
        return out

    # --- what the screen keeps ---------------------------------------------------------------------------------------
    def keep(self, prompt: Any, answers: list[list[int]], step: int) -> None:
        self.kept.setdefault(key(prompt), deque()).append((step, answers))
        if len(self.kept) > 4096:  # answers of rows a resume left behind, never asked for: dropped once too old
            for k in [k for k, q in self.kept.items() if step - q[-1][0] > MAX_AGE]:
                del self.kept[k]

    def state(self) -> list[list[Any]]:
        """The kept answers, for the screen's checkpoint state (the queue's candidates find theirs after a resume)."""
        return [[k, step, answers] for k, q in self.kept.items() for step, answers in q]

    def load(self, state: list[list[Any]]) -> None:
        """Replaces the kept answers with `state`'s; a malformed state raises and leaves them as they were."""
        kept: dict[str, deque[tuple[int, list[list[int]]]]] = {}
        for k, step, answers in state:
            kept.setdefault(str(k), deque()).append((int(step), [[int(t) for t in a] for a in answers]))
        self.kept = kept

    def take(self, prompt: Any, step: int, limit: int) -> list[list[int]]:
        """The kept answers of `prompt` (the oldest first kept, at most `limit`), or [] when none is young enough."""
        k = key(prompt)
        queue = self.kept.get(k)
        while queue:
            kept_at, answers = queue.popleft()
            if not queue:
                self.kept.pop(k, None)
            age = max(0, step - kept_at)
            if age > MAX_AGE:
                self.counts["dropped_old"] += 1
                continue
            answers = answers[:limit]
            self.counts["reused"] += len(answers)
            self.counts["age_sum"] += age * len(answers)
            return answers
        return []

    # --- TRL's rollout_func ------------------------------------------------------------------------------------------
    def __call__(self, prompts: list[Any], trainer) -> dict[str, Any]:
        self.trainer = trainer
        g = int(trainer.num_generations if trainer.model.training else trainer.num_generations_eval)
        step = int(trainer.state.global_step)
        keys = [key(p) for p in prompts]
        whole = len(prompts) % g == 0 and all(len(set(keys[i : i + g])) == 1 for i in range(0, len(keys), g))
        groups = range(0, len(prompts), g) if whole else range(len(prompts))
        size = g if whole else 1
        firsts = [prompts[i] for i in groups]
        ids = self.tokenize(firsts)
        reused = [self.take(p, step, size) if whole else [] for p in firsts]
        todo = [ids[j] for j in range(len(firsts)) for _ in range(size - len(reused[j]))]
        fresh = iter(self.sample(trainer.model, todo)) if todo else iter(())
        self.counts["generated"] += len(todo)
        prompt_ids, completion_ids = [], []
        for j in range(len(firsts)):
            for c in reused[j] + [next(fresh) for _ in range(size - len(reused[j]))]:
                prompt_ids.append(ids[j])
                completion_ids.append(c)
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    def summary(self) -> dict[str, Any]:
        n = self.counts["reused"]
        return {
            "reused": n,
            "generated": self.counts["generated"],
            "dropped_old": self.counts["dropped_old"],
            "mean_age": round(self.counts["age_sum"] / n, 3) if n else None,
        }
