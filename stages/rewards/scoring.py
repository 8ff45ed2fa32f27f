"""Scoring: the one place that says what a completion earns and whether it is correct.

Every caller scores through here: the dry run and the reward audit, the probe inside GRPO, the evaluation stage
(and SFT's held-out measurement, which is the same code), the teacher's filter, the pass rates, the curriculum and
the levels. Three rules, each written once:

- **values**: each reward's value per completion, called as TRL calls it (`score`: prompts, completions, and every
  dataset column but prompt/completion as a keyword; `columns` builds those keywords from rows);
- **the weighted total** (`weighted_total`): the weighted sum of the rewards that scored the sample; a reward whose
  value is None (no opinion; TRL turns it into NaN) or whose weight is 0 adds nothing, and a sample that no weighted
  reward scored has no total (NaN), so the dry run's statistics leave it out instead of counting it a failure.
  Where training's number is wanted (TRL's `nansum` gives such a sample 0.0), `as_trained` says so;
- **correct** (`Scorer.correct`): the task's verdict by `eval.metric`. `exact_match`: the `answer` reward's
  normalised match of the completion's first line (its text: a chat completion's assistant turns) with the row's
  `answer`; a row without a reference answer is wrong. A reward as the metric (the task's own scorer, e.g.
  `reasoning_gym`, or `unit_tests`): correct when it pays at least `PASS`; a row it has no opinion on is unscored
  (None) and left out of accuracy, where `unscored` counts it.

Before this module the held-out accuracy was `evaluate`'s exact_match on raw completions while the probe and each
row's verdict used the `answer` reward's match: a chat completion (a list of messages) could be right by one and
wrong by the other. The shipped `evaluate` module (`training/metrics/exact_match`) now delegates to `exact_correct`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from regimen.stages.rewards.registry import RewardFn, completion_text, from_specs, score
from regimen.stages.rewards.text import answer

PASS = 1.0
"""A metric reward's value at or above which the completion is correct."""


def passes(value: float | None) -> float | None:
    """1.0 when a metric's value says correct, 0.0 when not, None when it has no opinion (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    return float(value >= PASS)


def columns(rows: list[dict[str, Any]], extra: dict[str, list[Any]] | None = None, *, repeat: int = 1) -> dict:
    """The keyword columns a reward gets for `rows` (each repeated `repeat` times, for groups): every column but
    prompt and completion, as TRL passes them, plus `extra` (already one value per completion)."""
    if not rows:
        return dict(extra or {})
    out = {k: [r.get(k) for r in rows for _ in range(repeat)] for k in rows[0] if k not in ("prompt", "completion")}
    return {**out, **(extra or {})}


def completion_ids(tokenizer, completions: list[Any]) -> list[list[int]]:
    """`completion_ids` as a reward gets them outside training: each completion's text (an episode's assistant
    turns) tokenized by the policy's tokenizer, without special tokens (TRL's: the generated ids, its end token too)."""
    return [tokenizer(completion_text(c), add_special_tokens=False)["input_ids"] for c in completions]


def weighted_total(values: dict[str, list[float | None]], weights: dict[str, float]) -> list[float]:
    """Each sample's weighted total by the module's one rule (None, NaN and weight 0 add nothing; NaN where no
    weighted reward scored). `values` maps reward name to its values, in any order; `weights` by the same names."""
    names = [k for k in values if weights.get(k, 1.0) != 0]
    n = len(next(iter(values.values()))) if values else 0
    totals: list[float] = []
    for i in range(n):
        scored = [(values[k][i], weights.get(k, 1.0)) for k in names]
        scored = [(float(v), w) for v, w in scored if v is not None and math.isfinite(float(v))]
        totals.append(sum(v * w for v, w in scored) if scored else math.nan)
    return totals


def as_trained(totals: list[float]) -> list[float]:
    """Totals as GRPO trains on them: TRL's `nansum` gives a sample no reward scored 0.0."""
    return [0.0 if math.isnan(t) else t for t in totals]


def trained_totals(columns: list[list[float | None]], weights: list[float]) -> list[float]:
    """TRL's reward columns (one list per reward, in `weights`' order, None or NaN where a reward had no opinion) as the
    weighted totals GRPO trains on (`weighted_total`, then `as_trained`)."""
    named = {str(i): list(v) for i, v in enumerate(columns)}
    return as_trained(weighted_total(named, {str(i): w for i, w in enumerate(weights)}))


def exact_correct(completion: Any, reference: Any) -> float:
    """The exact-match verdict: 1.0 when the completion's first line equals the reference after the `answer`
    reward's normalisation, else 0.0 (a missing reference is never matched)."""
    return answer(None, [completion], answer=[reference])[0] or 0.0


@dataclass
class Scores:
    """A batch's scores: each reward's values, the weighted totals and the task's verdicts."""

    values: dict[str, list[float | None]]
    totals: list[float]
    correct: list[float | None]

    @property
    def judged(self) -> list[float]:
        return [c for c in self.correct if c is not None]

    @property
    def accuracy(self) -> float:
        """Correct among the judged rows (0.0 when none was judged)."""
        judged = self.judged
        return sum(judged) / len(judged) if judged else 0.0

    @property
    def unscored(self) -> int:
        return len(self.correct) - len(self.judged)


class Scorer:
    """A recipe's scoring: its rewards (one instance set per scorer, so a reward that keeps state is left as the
    caller's), their weights and its metric. `fns`: instances the caller already holds; `only`: the rewards (by report
    name) to score, the others left out."""

    def __init__(self, recipe, fns: dict[str, RewardFn] | None = None, *, only: list[str] | None = None):
        specs = recipe.rewards if only is None else [s for s in recipe.rewards if s.key in only]
        self.fns = from_specs(specs) if fns is None else fns
        self.weights = recipe.reward_weights()
        self.metric = recipe.eval.metric

    def values(
        self, prompts: list[Any], completions: list[Any], cols: dict[str, list[Any]]
    ) -> dict[str, list[float | None]]:
        return score(self.fns, prompts, completions, cols)

    def correct(
        self,
        completions: list[Any],
        cols: dict[str, list[Any]],
        values: dict[str, list[float | None]] | None = None,
        prompts: list[Any] | None = None,
    ) -> list[float | None]:
        """The task's verdict per completion (see the module doc); `values`: rewards already scored, so a metric
        that is a reward is not judged twice."""
        if self.metric == "exact_match":
            refs = cols.get("answer") or [None] * len(completions)
            return [exact_correct(c, r) for c, r in zip(completions, refs)]
        if values is None or self.metric not in values:
            fn = {self.metric: self.fns[self.metric]}
            values = score(fn, list(prompts or [None] * len(completions)), completions, cols)
        return [passes(v) for v in values[self.metric]]

    def __call__(self, prompts: list[Any], completions: list[Any], cols: dict[str, list[Any]]) -> Scores:
        values = self.values(prompts, completions, cols)
        totals = weighted_total(values, self.weights) if values else [math.nan] * len(completions)  # none scored
        return Scores(values, totals, self.correct(completions, cols, values, prompts))

    def verdict(self):
        """For the reward audit: `correct(completion, row, reference) -> bool` by this metric, on one completion.
        A scorer that raises does not call a text right."""

        def correct(completion: Any, row: dict[str, Any], reference: Any) -> bool:
            if self.metric == "exact_match":
                return exact_correct(completion, reference) >= PASS
            try:
                return self.correct([completion], columns([row]), prompts=[row["prompt"]])[0] == 1.0
            except Exception:  # noqa: BLE001 - the user's scorer on made-up text: no verdict is not a pass
                return False

        return correct
