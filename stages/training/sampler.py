"""How GRPO picks its prompts: the one owner of that choice.

A sampler is what GRPO's training set is made of, and what must run beside it (`Sampler`):

- `dataset`: the rows TRL's sampler shuffles, or a curriculum's stream (an `IterableDataset` read in order; its state
  comes back from the checkpoint, so no batch is skipped on resume: `streams`);
- the listeners that hear every scored group (registered on the trajectories recorder when it is built): a
  curriculum's pacing, the pass-rate table;
- `callbacks`: what saves its state in each checkpoint and restores it on resume (run before `MarkComplete`, so the
  state is in a checkpoint once it is marked);
- `rates`: the per-prompt pass-rate table the version keeps (`pass_rates.jsonl`), and `summary()` for the manifest.

`choose(recipe)` holds the only "which sampler?" rule, with the reason the manifest records (`sampler` in the GRPO
version's manifest); `build` makes it. The task is loaded once by the stage and handed in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from regimen.stages.training import reuse
from regimen.stages.training.pass_rates import row_id

ROWS, PASS_RATES, LEVELS = "rows", "pass_rates", "levels"


def asked(recipe) -> str | None:
    """The curriculum the recipe asks for (`levels`, `pass_rates`), or None."""
    return LEVELS if recipe.curriculum.kind == "levels" else PASS_RATES if recipe.curriculum.enabled else None


def choose(recipe) -> tuple[str, str]:
    """(kind, reason): `levels` or `pass_rates` when the recipe's curriculum asks for one and can run here, else
    `rows`. A curriculum runs in one process only (under `accelerate launch` each rank would see a share of a group)
    and over a number of steps (its endless stream has no epochs)."""
    wanted = asked(recipe)
    if wanted is None:
        return ROWS, "no curriculum: TRL's sampler shuffles the training rows"
    if recipe.num_processes() != 1:
        return ROWS, (
            "curriculum off: it runs in one process only (under accelerate launch each rank sees a share of a group)"
        )
    if (recipe.grpo_value("max_steps") or -1) <= 0:
        return ROWS, "curriculum off: it needs grpo.max_steps (training by epochs has no end for its stream)"
    return wanted, f"curriculum ({wanted}): prompts drawn by {'level' if wanted == LEVELS else 'pass rate'}"


def streams(recipe) -> bool:
    """Whether GRPO's prompts come from a stream (a curriculum, or the screen), read in order: what `build` makes."""
    screen = recipe.curriculum.skip_all_alike and recipe.curriculum.screen_samples >= 2
    return choose(recipe)[0] != ROWS or bool(screen)


def reads_pass_rates(recipe) -> bool:
    """Whether GRPO starts from the dry run's (or the round before's) pass rates: the flow hands them in only then,
    so a recipe without the pass-rate curriculum keeps its GRPO fingerprint."""
    return bool(recipe.curriculum.enabled)


def config(recipe) -> dict[str, Any] | None:
    """The curriculum's settings as they enter GRPO's fingerprint (None when no curriculum runs and all-alike groups
    train as TRL trains them). `skip_all_alike` and its screen's settings enter only when it is on, so recipes without
    it keep their fingerprint."""
    skip = {"skip_all_alike", "screen_samples", "screen_batch", "screen_reuse"}
    cur = recipe.curriculum.model_dump(mode="json", exclude=skip) if choose(recipe)[0] != ROWS else None
    if recipe.curriculum.skip_all_alike:
        return {**(cur or {}), **recipe.curriculum.model_dump(mode="json", include=skip)}
    return cur


@dataclass
class Sampler:
    kind: str
    reason: str
    dataset: Any
    callbacks: list = field(default_factory=list)
    pacing: Any = None  # curriculum.Curriculum or levels.LevelsCurriculum
    rates: Any = None  # pass_rates.PassRates the version keeps, or None
    screen: Any = None  # screen.Screen in front of it (curriculum.skip_all_alike), or None
    rollout: Any = None  # reuse.Answers: TRL's rollout_func, which hands the screen's answers back to their groups

    @property
    def streams(self) -> bool:
        return self.pacing is not None or self.screen is not None

    wanted: bool = False  # a curriculum was asked for (whether or not it could run here): `asked(recipe)`

    def summary(self) -> dict[str, Any] | None:
        out = self.pacing.summary() if self.pacing is not None else None
        if self.screen is not None:
            out = {**(out or {}), "screen": self.screen.summary()}
        return out

    def manifest(self) -> dict[str, Any]:
        return {"kind": self.kind, "reason": self.reason, "screen": self.screen is not None}


def build(recipe, task, train_rows: list[dict[str, Any]], seen, recorder) -> Sampler:
    """The sampler `choose` names, over `train_rows` (the task's, as chats for an environment), starting from `seen`
    (pass rates read from the inputs), its listeners registered on `recorder` (TRL's scored groups); with
    `curriculum.skip_all_alike` (and `screen_samples` >= 2), the screen in front of it (`training/screen.py`)."""
    base = _build(recipe, task, train_rows, seen, recorder)
    base.wanted = asked(recipe) is not None
    if not (recipe.curriculum.skip_all_alike and recipe.curriculum.screen_samples >= 2):
        return base
    from regimen.stages.training import screen as screening

    # the curriculum's stream when one runs (its set-aside is the history; levels: what they generate), else the rows
    seed = int(recipe.grpo_value("seed") or 0)
    screen = screening.Screen(recipe, base.pacing if base.pacing is not None else screening.Rows(train_rows, seed))
    reason = f"{base.reason}; screened: {recipe.curriculum.screen_samples} answers a candidate, all-alike ones skipped"
    reusable, why_not = reuse.possible(recipe)
    if reusable:
        screen.answers = reuse.Answers(recipe.eval.batch_size)
        reason += "; its answers are the first attempts of the group"
    else:
        reason += f"; its answers are not reused ({why_not})"
    return Sampler(
        base.kind,
        reason,
        screening.dataset(screen),
        [*base.callbacks, screening.ScreenCallback(screen)],
        base.pacing,
        base.rates,
        screen,
        screen.answers,
        wanted=base.wanted,
    )


def _build(recipe, task, train_rows: list[dict[str, Any]], seen, recorder) -> Sampler:
    from regimen.stages.training import curriculum as pacing

    kind, reason = choose(recipe)
    weights = list(recipe.reward_weights().values())  # in the recipe's order, as TRL's reward_funcs
    names = list(recipe.reward_weights())
    group = int(recipe.grpo_value("num_generations"))
    seed = int(recipe.grpo_value("seed") or 0)
    if kind == LEVELS:
        from regimen.stages.tasks.registry import TASKS
        from regimen.stages.training import levels

        spec = TASKS[recipe.data.task]
        cur = levels.LevelsCurriculum(
            spec, recipe.data, recipe.curriculum.levels, seed, task.heldout, metric=recipe.eval.metric
        )
        recorder.listen(levels.listener(cur, names, weights, recipe.eval.metric), len(names))
        return Sampler(kind, reason, levels.dataset(cur), [levels.LevelsCallback(cur)], cur)
    if kind == PASS_RATES:
        cur = pacing.Curriculum(train_rows, recipe.curriculum, seed=seed, rates=seen)
        recorder.listen(pacing.listener(cur, weights, group), len(names))
        return Sampler(kind, reason, pacing.dataset(cur), [pacing.CurriculumCallback(cur)], cur, cur.rates)
    if recipe.num_processes() != 1:  # pass rates need whole groups: one process sees them
        return rows(train_rows, reason)
    recorder.listen(pacing.rates_listener(seen, weights, group, recorder), len(names))
    return Sampler(kind, reason, rows(train_rows, reason).dataset, [pacing.RatesCallback(seen)], rates=seen)


def rows(train_rows: list[dict[str, Any]], reason: str) -> Sampler:
    """The training rows as they are (TRL's sampler shuffles them), each with its `prompt_id`; nothing listens. The
    smoke test's sampler: a few steps that show reward variation, whatever the recipe's curriculum."""
    from datasets import Dataset

    return Sampler(ROWS, reason, Dataset.from_list([{**r, "prompt_id": row_id(r)} for r in train_rows]))
