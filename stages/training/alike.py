"""All-alike groups out of GRPO's loss (`curriculum.skip_all_alike: true`).

A group whose attempts all scored alike teaches nothing, and with a KL penalty (`beta > 0`) it is worse: its KL term
still pulls the policy back toward the reference with no reward signal beside it (huggingface/trl PR #5640, closed
unmerged). Under TRL's default aggregation (`sum_then_normalize`) its advantages are 0, so only the KL term and the
loss's normalisation are left; under `normalize_then_sum` its advantages are not 0 (the batch's normalisation shifts
them). Here such a group's samples are taken out of the batch before TRL computes the loss: no advantage term, no KL
term, and the normalisation counts only the tokens that remain (`num_items_in_batch` lowered by the tokens taken out,
for the token-level losses; the per-sequence losses average over the samples that remain).

"Alike" follows the aggregation: `sum_then_normalize` compares each attempt's weighted total (as TRL's
`frac_reward_zero_std` does); `normalize_then_sum` compares each reward's values, since a group whose totals agree
while its rewards differ still has non-zero advantages.

Why a listener and a key rather than TRL's own tensors: TRL scores the whole generation batch in order (the reward
functions see groups whole), then shuffles it and splits it into `steps_per_generation` slices before
`compute_loss`, which is the public method a subclass may override; what reaches `compute_loss` carries no group
index. So the listener keeps each scored sample's completion token ids (TRL passes `completion_ids` to rewards)
with its group's verdict, and `compute_loss` looks each sample up by the same ids (its `completion_ids` where
`completion_mask` is 1). A completion that occurs both in an alike group and in a varied one is kept (it can teach).
TRL's private `_generate_and_score_completions` would give the group index directly; it is not overridden here.
"""

from __future__ import annotations

import math
from typing import Any

from regimen.stages.rewards.scoring import trained_totals


def _same(xs: list[float | None]) -> bool:
    finite = [round(float(x), 9) for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return len(set(finite)) <= 1


class AllAlike:
    """What the trainer's `compute_loss` asks (`drop`), filled by the rewards' listener (`listener`) batch by batch."""

    def __init__(self, weights: list[float], group: int, aggregation: str = "sum_then_normalize"):
        self.weights, self.group, self.aggregation = list(weights), max(int(group), 1), aggregation
        self.verdict: dict[tuple[int, ...], bool] = {}  # completion ids -> alike (False wins a conflict)
        self.tokens_out = 0  # of the generation batch: tokens of the samples taken out
        self.counts = {"groups": 0, "alike": 0}  # over the run: groups scored, all-alike among them

    def alike(self, values: list[list[float | None]], start: int) -> bool:
        """Whether the group at `start` scored alike (`values`: one column per reward, in the weights' order)."""
        end = start + self.group
        if self.aggregation == "normalize_then_sum":
            return all(_same(col[start:end]) for col in values)
        return _same(trained_totals([list(col[start:end]) for col in values], self.weights))  # scoring's rule

    def listener(self):
        """For `Recorder.listen`: each whole scored batch, its groups judged."""

        def heard(kwargs: dict[str, Any], values: list[list[float | None]]) -> None:
            ids = kwargs.get("completion_ids")
            self.verdict, self.tokens_out = {}, 0
            if not ids:
                return
            for start in range(0, len(ids) - self.group + 1, self.group):
                alike = self.alike(values, start)
                self.counts["groups"] += 1
                self.counts["alike"] += int(alike)
                for i in range(start, start + self.group):
                    key = tuple(int(t) for t in ids[i])
                    self.verdict[key] = self.verdict.get(key, True) and alike
            self.tokens_out = sum(
                len(ids[i]) for i in range(len(ids)) if self.verdict.get(tuple(int(t) for t in ids[i]), False)
            )
            if callable(log := kwargs.get("log_metric")):  # TRL's own logging hook for rewards: in the training log
                out = sum(self.verdict.get(tuple(int(t) for t in c), False) for c in ids)
                log("groups/samples_out_of_loss", out / len(ids))

        return heard

    def keep(self, completion_ids, completion_mask) -> list[bool]:
        """Per sample of a slice: False where its group scored alike."""
        rows = zip(completion_ids.tolist(), completion_mask.tolist())
        return [not self.verdict.get(tuple(t for t, m in zip(ids, mask) if m), False) for ids, mask in rows]

    def drop(self, inputs: dict[str, Any]) -> dict[str, Any]:
        """`inputs` (one slice of the generation batch, as TRL hands it to `compute_loss`) without the samples of
        all-alike groups, and `num_items_in_batch` lowered by the generation batch's tokens taken out. A slice whose
        samples all go keeps its rows with an empty `completion_mask`: a loss of 0 with no gradient."""
        import torch

        if not self.verdict:
            return inputs
        keep = self.keep(inputs["completion_ids"], inputs["completion_mask"])
        if all(keep):
            out = dict(inputs)
        elif not any(keep):
            out = {**inputs, "completion_mask": torch.zeros_like(inputs["completion_mask"])}
        else:
            index = torch.tensor(keep, device=inputs["completion_ids"].device)
            size = len(keep)
            out = {
                k: v[index] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.size(0) == size else v
                for k, v in inputs.items()
            }
        total = inputs.get("num_items_in_batch")
        if isinstance(total, torch.Tensor):
            out["num_items_in_batch"] = (total - self.tokens_out).clamp(min=1)
        return out
