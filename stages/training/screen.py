"""Skip what will not teach, before it is generated (`curriculum.skip_all_alike: true`): a screen in front of GRPO's
prompts.

A group whose attempts all score alike teaches nothing; on a large pool a prompt is almost never seen twice, so the
history the pass-rate curriculum keeps (GRESO's idea: what was all alike stays all alike) rarely knows a prompt
before it is drawn. The screen asks the current policy instead (SPEED-RL, arXiv 2506.09016): candidates are drawn
from the source (the curriculum's stream when it is on, whose set-aside is the history; else a seeded shuffle of the
rows, TRL's sampler's order), `screen_batch` at a time; each is answered `screen_samples` times with GRPO's sampling
settings (one batched `generate` call), scored by the recipe's rewards (`rewards/scoring.py`), and a candidate whose
screening answers all score alike is skipped; the others enter GRPO's batch, where TRL samples the full group. What
the screen saw also enters the curriculum (its `screened`): the pass-rate curriculum's history (a screened-out prompt
is set aside like an all-alike group), or the levels' controller (the screening answers count toward the pass rate at
their level, so a level whose prompts are all solved, and screened out, still says when to rise).
If a whole round of candidates is screened out `max_rounds` times in a row, the next candidate enters unscreened, so
a policy that solves (or fails) everything never stalls the trainer; such admissions are counted.

On TRL's public surface only: GRPO's training set is an `IterableDataset` whose generator consults the live policy
(handed over by a callback at `on_train_begin`). The answers that let a candidate in become the first attempts of its
group (SPEED does this; `curriculum.screen_reuse`, `training/reuse.py`, through TRL's `rollout_func`), so an admitted
group always teaches and only the rest of it is generated; without `environment:` or vLLM only, elsewhere the
screen's samples are spent on top of the group's. `rollout_func` cannot skip (it must answer every prompt TRL hands
it), which is why the skipping happens here, in the stream. The policy the screen asks is the one of the step before
(the dataloader fetches a batch ahead), or older for a candidate that waited in the queue.

Counted (the manifest's `curriculum.screen`, the training log's `screen/*` at each logging step): candidates
screened, skipped, admitted unscreened, the screening completions generated, and the wall time spent screening
(`seconds`: generating and scoring its answers, so its cost can be read against the GRPO stage's own), and with
reuse the answers handed back to their groups (`reuse`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from regimen.stages.rewards.scoring import Scorer, columns
from regimen.stages.training import streams
from regimen.stages.training.episodes import complete
from regimen.stages.training.pass_rates import row_id

log = logging.getLogger("regimen.curriculum")
STATE = "screen.json"
MAX_ROUNDS = 8


class Rows:
    """An endless seeded shuffle of the rows, reshuffled each lap (TRL's sampler's order), with its place saved."""

    def __init__(self, rows: list[dict[str, Any]], seed: int):
        self.rows, self.seed, self.lap, self.cursor = rows, seed, 0, 0
        self.order = self._order()

    def _order(self) -> list[int]:
        order = list(range(len(self.rows)))
        random.Random(self.seed * 1_000_003 + self.lap).shuffle(order)
        return order

    def stream(self) -> Iterator[dict[str, Any]]:
        while True:
            if self.cursor >= len(self.order):
                self.lap, self.cursor = self.lap + 1, 0
                self.order = self._order()
            i = self.order[self.cursor]
            self.cursor += 1
            yield {**self.rows[i], "prompt_id": row_id(self.rows[i])}

    def state(self) -> dict[str, int]:
        return {"lap": self.lap, "cursor": self.cursor}

    def load(self, state: dict[str, Any]) -> None:
        self.lap, self.cursor = int(state["lap"]), int(state["cursor"])
        self.order = self._order()


class Screen:
    """The screen (see the module doc). `source`: the curriculum (its `stream`, `screened`, `state`) or `Rows`."""

    def __init__(self, recipe, source, scorer: Scorer | None = None):
        cfg = recipe.curriculum
        self.recipe, self.source = recipe, source
        self.samples, self.batch = int(cfg.screen_samples), int(cfg.screen_batch)
        self.scorer = scorer or Scorer(recipe)
        self.model = self.tokenizer = None  # the live policy, handed over at on_train_begin
        self.step = 0
        self.counts = {"screened": 0, "skipped": 0, "admitted": 0, "unscreened": 0, "samples": 0}
        self.seconds = 0.0  # wall time spent screening (generating and scoring its answers)
        self.queue: deque[dict[str, Any]] = deque()
        self.answers = None  # reuse.Answers: where the admitted candidates' answers are kept for their groups
        self._stream: Iterator[dict[str, Any]] | None = None

    def _next(self) -> dict[str, Any]:
        if self._stream is None:
            self._stream = self.source.stream()
        return next(self._stream)

    def stream(self) -> Iterator[dict[str, Any]]:
        while True:
            if not self.queue:
                self.refill()
            yield self.queue.popleft()

    def refill(self) -> None:
        """Screen rounds of candidates until one enters; after `MAX_ROUNDS` rounds with none, one enters unscreened."""
        if self.model is None or self.samples < 2:  # nothing to ask yet (or nothing to compare): no screen
            self.queue.append(self._next())
            return
        for _ in range(MAX_ROUNDS):
            self.queue.extend(self.screen([self._next() for _ in range(self.batch)]))
            if self.queue:
                return
        self.counts["unscreened"] += 1
        self.queue.append(self._next())

    def screen(self, candidates: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The candidates whose screening answers do not all score alike."""
        began = time.perf_counter()
        k = self.samples
        if self.answers is not None and self.answers.trainer is not None:  # sampled as TRL samples, to be reused
            outs, envs, ids = self._sample(candidates)
        else:
            outs, envs, ids = *self._complete(candidates), None
        prompts = [c["prompt"] for c in candidates for _ in range(k)]
        cols = columns(candidates, repeat=k)
        if envs is not None:
            cols["environments"] = [e for es in envs for e in es]
        scored = self.scorer(prompts, [c for cs in outs for c in cs], cols)
        totals = scored.totals
        self.counts["screened"] += len(candidates)
        self.counts["samples"] += len(candidates) * k
        if hasattr(self.source, "screened"):  # the curriculum learns what the screen saw (Rows keeps no history)
            self.source.screened(candidates, scored, k)
        kept = []
        for i, c in enumerate(candidates):
            group = [t for t in totals[i * k : (i + 1) * k] if t == t]
            if len({round(t, 9) for t in group}) <= 1:
                self.counts["skipped"] += 1
            else:
                kept.append(c)
                if ids is not None:  # its answers differ: they become the first attempts of its group
                    self.answers.keep(c["prompt"], ids[i * k : (i + 1) * k], self.step)
        self.counts["admitted"] += len(kept)
        self.seconds += time.perf_counter() - began
        return kept

    def _sample(self, candidates: list[dict[str, Any]]):
        """The screening answers as token ids and text, sampled as TRL samples the group (`training/reuse.py`)."""
        answers, k = self.answers, self.samples
        ids = [p for p in answers.tokenize([c["prompt"] for c in candidates]) for _ in range(k)]
        out = answers.sample(self.model, ids)
        texts = self.tokenizer.batch_decode(out, skip_special_tokens=True)
        return [texts[i * k : (i + 1) * k] for i in range(len(candidates))], None, out

    def _complete(self, candidates: list[dict[str, Any]]):
        g = self.recipe.grpo_value
        return complete(
            self.model,
            self.tokenizer,
            self.recipe,
            candidates,
            num_return_sequences=self.samples,
            do_sample=True,
            temperature=float(g("temperature")),
            top_p=float(g("top_p") or 1.0),
            top_k=int(g("top_k") or 0),
            max_new_tokens=int(g("max_completion_length")),
            batch_size=self.recipe.eval.batch_size,
            desc="screen",
            extra={
                **{k: g(k) for k in ("min_p", "repetition_penalty") if g(k) is not None},
                **(g("generation_kwargs") or {}),
            },
        )

    def state(self) -> dict[str, Any]:
        return {
            "counts": self.counts,
            "seconds": self.seconds,
            "queue": list(self.queue),
            "source": self._source_state(),
            "kept": self.answers.state() if self.answers is not None else None,
        }

    def _source_state(self) -> dict[str, Any] | None:
        return self.source.state() if isinstance(self.source, Rows) else None

    def load(self, state: dict[str, Any]) -> None:
        if self.answers is not None:  # first: a malformed state raises before anything is replaced
            self.answers.load(state.get("kept") or [])
        self.counts.update({k: int(v) for k, v in state["counts"].items()})
        self.seconds = float(state.get("seconds") or 0.0)
        self.queue = deque(state.get("queue") or [])
        if isinstance(self.source, Rows) and state.get("source"):
            self.source.load(state["source"])
        self._stream = None

    def summary(self) -> dict[str, Any]:
        out = {**self.counts, "seconds": round(self.seconds, 3), "samples_per_candidate": self.samples}
        if self.answers is not None:
            out["reuse"] = self.answers.summary()
        return out


def dataset(screen: Screen):
    """An endless `datasets.IterableDataset` of the prompts the screen lets through."""
    return streams.dataset(screen)


class ScreenCallback(TrainerCallback):
    """Hands the screen the live policy, logs its counts (`screen/*`), saves its state in each checkpoint and restores
    it on resume (the curriculum's own callback saves the curriculum's)."""

    def __init__(self, screen: Screen):
        self.screen = screen

    def on_train_begin(self, args, state, control, model=None, processing_class=None, **kwargs):
        self.screen.model, self.screen.tokenizer = model, processing_class
        if state.global_step:
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / STATE
            try:
                self.screen.load(json.loads(path.read_text()))
            except (OSError, ValueError, KeyError, TypeError) as exc:
                log.warning("screen state not restored from %s (%s): it starts afresh", path, exc)
        self.screen.step = state.global_step

    def on_step_begin(self, args, state, control, **kwargs):
        self.screen.step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history and "reward" in state.log_history[-1]:
            state.log_history[-1].update({f"screen/{k}": v for k, v in self.screen.counts.items()})
            state.log_history[-1]["screen/seconds"] = round(self.screen.seconds, 3)
            if self.screen.answers is not None:
                state.log_history[-1]["screen/reused"] = self.screen.answers.counts["reused"]

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and ckpt.is_dir():
            tmp = ckpt / f".{STATE}.tmp"
            tmp.write_text(json.dumps(self.screen.state()))
            os.replace(tmp, ckpt / STATE)
