"""Per-prompt pass rates, and the curriculum GRPO samples its prompts by.

GRPO learns only from groups whose attempts score differently: a group where every attempt is solved, or
every attempt fails, costs a full generation and teaches nothing. The field's answer (DAPO's dynamic
sampling, verl's `filter_groups`, prime-rl's easy/normal/hard pools, open-r1's pass-rate filtering) is to
stop sampling prompts that are already solved or still hopeless. TRL's `GRPOTrainer` has none of it, so it
is written here, on TRL's public surface only:

- **Pass rates** (`PassRates`): per prompt (a stable id from its normalised text), the attempts scored,
  their mean weighted reward, the groups seen, how many of the latest groups in a row scored all alike,
  and the step it was last seen. The dry run, GRPO (live, from the rewards the trainer computes) and
  evaluation each store their table with their version (`pass_rates.jsonl`); GRPO starts from the dry
  run's.
- **The curriculum** (`Curriculum`): GRPO's training set becomes a `datasets.IterableDataset` whose
  generator asks the curriculum for each next prompt (TRL repeats each one `num_generations` times and
  batches them as its own sampler would; `shuffle_dataset` is off so the choice is live). A prompt whose
  latest `set_aside_after` groups all scored alike is set aside; after `readmit_after` steps it is
  re-admitted (a policy that improved may now solve what it failed, or fail what it solved); set aside
  again, it waits twice as long each time (at most 8x). The rest
  are drawn by difficulty band, prime-rl's pools: `hard` (mean reward below `bands.hard`), `easy` (at or
  above `bands.easy`), `normal` between them and every prompt not yet seen. `weights` are per prompt: each
  draw picks a band in proportion to its weight times the active prompts it holds (so a band of six
  prompts is not drawn as often as one of five hundred), then walks a seeded shuffle of the data to that
  band's next active prompt. **Groups skipped** counts, draw by draw, the prompts TRL's own sampler
  (a seeded shuffle of the data, walked alongside) would have drawn while they were set aside.
- The trainer's rewards reach the curriculum through the reward wrappers (`trajectories.Recorder`
  listeners), its step through a callback; its state is saved in every checkpoint (`curriculum.json`), so
  a resumed run continues with the same table, set-asides and walk. The choice lags the rewards by one
  generation batch: the dataloader fetches a batch ahead, so a prompt found all alike at step N may
  still be drawn for step N+1 (and the prompts drawn ahead of a checkpoint are not trained after a
  resume: the walk goes on past them).

Why hand-written: no library offers pass-rate sampling for TRL (huggingface/trl#3708, DAPO's dynamic
sampling, is open); the rule is short and tested on made-up rewards (`tests/test_curriculum.py`).
Under `accelerate launch` (several processes) each rank would see only its share of a group and choose
differently, so the curriculum turns itself off there and says so.
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from regimen.stages.rewards.scoring import trained_totals
from regimen.stages.training import streams
from regimen.stages.training.pass_rates import FILE, PassRates, row_id

log = logging.getLogger("regimen.curriculum")
STATE = "curriculum.json"
BANDS = ("easy", "normal", "hard")


class Curriculum:
    """Chooses GRPO's next prompt from the training rows by pass rate (see the module docstring).
    `cfg` is the recipe's `curriculum:` section."""

    def __init__(self, rows: list[dict[str, Any]], cfg, seed: int, rates: PassRates | None = None):
        self.rows = rows
        self.ids = [row_id(r) for r in rows]
        self.cfg = cfg
        self.rates = rates or PassRates()
        self.step = 0
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        # each band's walk: a seeded shuffle of its rows; a row whose band changes joins the new band's walk
        # (and is passed over in the old one), so a draw costs the band's length, never the whole data's
        self.walks: dict[str, list[int]] = {b: [] for b in BANDS}
        self.listed: dict[str, set[int]] = {b: set() for b in BANDS}
        for i in order:
            self._enlist(i)
        # TRL's own sampler, a seeded shuffle: what it would have drawn (groups skipped)
        self.order, self.shadow = (order, 0)
        self.cursor = {b: 0 for b in BANDS}
        self.rng = random.Random(seed + 1)
        self.aside: dict[str, int] = {}  # prompt id -> the step from which it is re-admitted
        self.times_aside: dict[
            str, int
        ] = {}  # ... and how often it was set aside: each time waits twice as long (at most 8x)
        self.counts = {"groups_skipped": 0, "set_aside": 0, "readmitted": 0, "draws": 0}
        # band sizes, kept until the table or the step changes
        self._changes, self._sizes_key, self._sizes = (0, None, {})
        self.drawn_by_band = {b: 0 for b in BANDS}
        self.rows_of: dict[str, list[int]] = {}
        for i, pid in enumerate(self.ids):
            self.rows_of.setdefault(pid, []).append(i)
        for pid, e in self.rates.table.items():  # what earlier stages saw: set aside what they found all alike
            if pid in self.rows_of and e.alike_streak >= cfg.set_aside_after:
                self.aside[pid] = cfg.readmit_after

    # -- bands ---------------------------------------------------------------------------------
    def _enlist(self, i: int) -> None:
        b = self.band(self.ids[i])
        if i not in self.listed[b]:
            self.listed[b].add(i)
            self.walks[b].append(i)

    def band(self, pid: str) -> str:
        e = self.rates.table.get(pid)
        if e is None or e.attempts == 0:
            return "normal"
        if e.mean_reward >= self.cfg.bands.easy:
            return "easy"
        if e.mean_reward < self.cfg.bands.hard:
            return "hard"
        return "normal"

    def active(self, pid: str) -> bool:
        until = self.aside.get(pid)
        if until is None:
            return True
        if self.step >= until:
            del self.aside[pid]
            entry = self.rates.table.get(pid)
            if entry is not None:
                entry.alike_streak = 0
            self.counts["readmitted"] += 1
            return True
        return False

    def band_sizes(self) -> dict[str, int]:
        sizes = {b: 0 for b in BANDS}
        aside = 0
        for pid in self.rows_of:
            if pid in self.aside and self.step < self.aside[pid]:
                aside += 1
            else:
                sizes[self.band(pid)] += 1
        return {**sizes, "set_aside": aside}

    # -- drawing -------------------------------------------------------------------------------
    def _walk(self, band: str) -> int | None:
        """The band's next active row on its walk (set-aside ones met on the way are skipped groups; rows
        that moved to another band are passed over); None when a whole lap finds none."""
        walk = self.walks[band]
        for _ in range(len(walk)):
            i = walk[self.cursor[band] % len(walk)]
            self.cursor[band] += 1
            pid = self.ids[i]
            if self.band(pid) != band:
                continue
            if self.active(pid):
                return i
        return None

    def _active_sizes(self) -> dict[str, int]:
        key = (self.step, self._changes)
        if self._sizes_key != key:
            self._sizes, self._sizes_key = self.band_sizes(), key
        return self._sizes

    def next_index(self) -> int:
        self.counts["draws"] += 1
        # a prompt's weight is its band's: a band is drawn in proportion to weight x active prompts in it, so
        # the few prompts of a small band are not drawn over and over (a band-level share of 0.7 once sent
        # most draws to six prompts, and held-out accuracy fell)
        shadow = self.ids[self.order[self.shadow % len(self.order)]]
        self.shadow += 1
        if shadow in self.aside and self.step < self.aside[shadow]:
            self.counts["groups_skipped"] += 1  # TRL's sampler would have spent a group on a prompt set aside
        sizes = self._active_sizes()
        weights = {b: w * sizes[b] for b, w in self.cfg.weights.items() if w > 0 and sizes[b] > 0}
        while weights:
            names = list(weights)
            band = self.rng.choices(names, weights=[weights[b] for b in names])[0]
            i = self._walk(band)
            if i is not None:
                self.drawn_by_band[band] += 1
                return i
            del weights[band]
        for band in BANDS:  # only bands weighted 0 hold an active prompt: better than stalling the trainer
            if (i := self._walk(band)) is not None:
                self.drawn_by_band[band] += 1
                return i
        # everything is set aside: re-admit the one due first
        pid = min(self.aside, key=lambda p: self.aside[p])
        self._changes += 1
        self.aside[pid] = self.step
        self.active(pid)
        return self.rows_of[pid][0]

    def stream(self) -> Iterator[dict[str, Any]]:
        while True:
            i = self.next_index()
            yield {**self.rows[i], "prompt_id": self.ids[i]}

    # -- learning from the trainer's rewards ---------------------------------------------------
    def screened(self, candidates: list[dict[str, Any]], scores, k: int) -> None:
        """What the screen saw (`screen.py`): each candidate's `k` answers, as a group of its own."""
        ids = [c.get("prompt_id") or row_id(c) for c in candidates for _ in range(k)]
        self.observe(ids, [0.0 if t != t else t for t in scores.totals], k)

    def observe(self, ids: list[str], totals: list[float], group: int) -> None:
        self._changes += 1
        for k, same in zip(range(0, len(ids), group), self.rates.add_groups(ids, totals, group, self.step, "grpo")):
            pid = ids[k]
            for i in self.rows_of.get(pid, ()):
                self._enlist(i)  # its band may have changed
            if same and self.rates.table[pid].alike_streak >= self.cfg.set_aside_after and pid not in self.aside:
                times = self.times_aside[pid] = self.times_aside.get(pid, 0) + 1
                # alike again: a longer wait
                self.aside[pid] = self.step + self.cfg.readmit_after * min(2 ** (times - 1), 8)
                self.counts["set_aside"] += 1

    # -- state (checkpoints) -------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "rates": self.rates.rows(),
            "aside": self.aside,
            "times_aside": self.times_aside,
            "counts": self.counts,
            "drawn_by_band": self.drawn_by_band,
            "cursor": self.cursor,
            "shadow": self.shadow,
            "walks": self.walks,
            "rng": _rng_state(self.rng),
            "step": self.step,
        }

    def load(self, state: dict[str, Any]) -> None:
        self.rates = PassRates.from_rows(state["rates"])
        self.aside = {k: int(v) for k, v in state["aside"].items()}
        self.times_aside = {k: int(v) for k, v in state.get("times_aside", {}).items()}
        self.counts.update(state["counts"])
        self.drawn_by_band.update(state.get("drawn_by_band", {}))
        self.cursor.update({k: int(v) for k, v in state["cursor"].items()})
        self.shadow = int(state.get("shadow", 0))
        self.walks = {b: [int(i) for i in state["walks"][b]] for b in BANDS}
        self.listed = {b: set(w) for b, w in self.walks.items()}
        self.rng.setstate(_rng_from(state["rng"]))
        self.step = int(state["step"])
        self._changes += 1

    def summary(self) -> dict[str, Any]:
        return {"bands": self.band_sizes(), "drawn_by_band": dict(self.drawn_by_band), **self.counts}


def _rng_state(rng: random.Random) -> list[Any]:
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def _rng_from(state: list[Any]) -> tuple[Any, ...]:
    return (state[0], tuple(state[1]), state[2])


def dataset(curriculum: Curriculum):
    """An endless `datasets.IterableDataset` whose rows the curriculum chooses as training goes."""
    return streams.dataset(curriculum)


def listener(curriculum: Curriculum, weights: list[float], group: int):
    """For `Recorder.listen`: the weighted total per sample (TRL's: None counts as nothing) by prompt id."""

    def heard(kwargs: dict[str, Any], values: list[list[float | None]]) -> None:
        ids = kwargs.get("prompt_id")
        if not ids:
            return
        curriculum.observe(list(ids), trained_totals(values, weights), group)

    return heard


def rates_listener(rates: PassRates, weights: list[float], group: int, recorder):
    """Pass rates without a curriculum: every group the trainer scores, at the recorder's step."""

    def heard(kwargs: dict[str, Any], values: list[list[float | None]]) -> None:
        ids = kwargs.get("prompt_id")
        if ids:
            totals = trained_totals(values, weights)
            i = 0
            while i < len(ids):  # whole groups only (a run of `group` equal ids); a partial one is left out
                j = i
                while j < len(ids) and ids[j] == ids[i]:
                    j += 1
                for k in range(i, j - group + 1, group):
                    rates.add_group(ids[k], [float(t) for t in totals[k : k + group]], recorder.step, "grpo")
                i = j

    return heard


class RatesCallback(TrainerCallback):
    """Without a curriculum: the pass-rate table saved in each checkpoint and restored on resume."""

    def __init__(self, rates: PassRates):
        self.rates = rates

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step:
            self.restore(Path(args.output_dir) / f"checkpoint-{state.global_step}")

    def restore(self, ckpt: Path) -> None:
        if (Path(ckpt) / FILE).is_file():
            self.rates.table = PassRates.read(ckpt).table

    def on_save(self, args, state, control, **kwargs):
        ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and ckpt.is_dir():
            self.rates.write(ckpt)


class CurriculumCallback(TrainerCallback):
    """Keeps the curriculum's step, logs the bands beside TRL's metrics (`curriculum/<band>`, plotted with
    `frac_reward_zero_std`), saves its state in each checkpoint and restores it on resume."""

    def __init__(self, curriculum: Curriculum):
        self.curriculum = curriculum

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step:
            self.restore(Path(args.output_dir) / f"checkpoint-{state.global_step}")
        self.curriculum.step = state.global_step

    def restore(self, ckpt: Path) -> None:
        path = Path(ckpt) / STATE
        try:
            self.curriculum.load(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("curriculum state not restored from %s (%s): it starts afresh", path, exc)

    def on_step_begin(self, args, state, control, **kwargs):
        self.curriculum.step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.log_history and "reward" in state.log_history[-1]:
            sizes = self.curriculum.band_sizes()
            state.log_history[-1].update({f"curriculum/{k}": v for k, v in sizes.items()})
            state.log_history[-1]["curriculum/groups_skipped"] = self.curriculum.counts["groups_skipped"]

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            ckpt = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            if ckpt.is_dir():
                tmp = ckpt / f".{STATE}.tmp"
                tmp.write_text(json.dumps(self.curriculum.state()))
                os.replace(tmp, ckpt / STATE)
