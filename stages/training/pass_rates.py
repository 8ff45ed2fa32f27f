"""Per-prompt pass rates: for each prompt (a stable id from its normalised text) the attempts scored, their
mean weighted reward, the groups seen, how many of the latest groups in a row scored all alike, and when
and by which stage it was last seen. The dry run, GRPO (live, from the rewards the trainer computes) and
evaluation store their table with their version (`pass_rates.jsonl`); the curriculum
(`training/curriculum.py`) samples by it. Plain Python: the flows read it without loading a trainer."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from regimen.stages.tasks import EPISODE, normalized_prompt

log = logging.getLogger("regimen.pass_rates")
FILE = "pass_rates.jsonl"


def row_id(row: dict[str, Any]) -> str:
    """A row's id for pass rates: its prompt's (`prompt_id`); an episode's (`tasks.EPISODE`) apart from the other
    episodes of the same prompt."""
    pid = prompt_id(row["prompt"])
    return pid if row.get(EPISODE) is None else f"{pid}-e{row[EPISODE]}"


def prompt_id(prompt: Any) -> str:
    """A short stable id for a prompt: its normalised text's digest (the same normalisation as the
    train/held-out overlap check, so copies of a prompt share one id)."""
    if isinstance(prompt, str):  # a text prompt and the one-message conversation made of it are one prompt
        prompt = [{"role": "user", "content": normalized_prompt(prompt)}]
    return hashlib.sha256(normalized_prompt(prompt).encode()).hexdigest()[:16]


def alike(rewards: list[float]) -> bool:
    """Every attempt of the group scored the same (TRL's zero-std group): it teaches nothing."""
    finite = [r for r in rewards if math.isfinite(r)]
    return len({round(r, 9) for r in finite}) <= 1


@dataclass
class Entry:
    attempts: int = 0
    mean_reward: float = 0.0
    groups: int = 0
    alike_streak: int = 0  # the latest groups in a row that scored all alike
    last_seen: int = -1  # the step (GRPO step; 0 for the dry run, -1 never)
    source: str = ""  # which stage saw it last: dry_run, grpo, evaluate

    def add(self, rewards: list[float], step: int, source: str) -> bool:
        finite = [r for r in rewards if math.isfinite(r)]
        if finite:
            n = self.attempts + len(finite)
            self.mean_reward = (self.mean_reward * self.attempts + sum(finite)) / n
            self.attempts = n
        self.groups += 1
        same = alike(rewards)
        self.alike_streak = self.alike_streak + 1 if same else 0
        self.last_seen, self.source = step, source
        return same


@dataclass
class PassRates:
    """Prompt id -> Entry. Written as one JSON object per prompt (`pass_rates.jsonl`)."""

    table: dict[str, Entry] = field(default_factory=dict)

    def add_group(self, pid: str, rewards: list[float], step: int, source: str) -> bool:
        return self.table.setdefault(pid, Entry()).add(rewards, step, source)

    def add_groups(self, ids: list[str], totals: list[float], group: int, step: int, source: str) -> list[bool]:
        """Consecutive runs of `group` samples are one prompt's group (TRL's and the dry run's layout)."""
        out = []
        for i in range(0, len(totals) - group + 1, group):
            if len(set(ids[i : i + group])) != 1:
                raise ValueError(f"samples {i}..{i + group - 1} are not one prompt's group")
            out.append(self.add_group(ids[i], [float(t) for t in totals[i : i + group]], step, source))
        return out

    def rows(self) -> list[dict[str, Any]]:
        return [
            {
                "prompt_id": k,
                "attempts": e.attempts,
                "mean_reward": round(e.mean_reward, 6),
                "groups": e.groups,
                "alike_streak": e.alike_streak,
                "last_seen": e.last_seen,
                "source": e.source,
            }
            for k, e in sorted(self.table.items())
        ]

    @classmethod
    def from_rows(cls, rows: list[dict[str, Any]]) -> PassRates:
        return cls(
            {
                r["prompt_id"]: Entry(
                    int(r["attempts"]),
                    float(r["mean_reward"]),
                    int(r.get("groups", 0)),
                    int(r.get("alike_streak", 0)),
                    int(r.get("last_seen", -1)),
                    str(r.get("source", "")),
                )
                for r in rows
            }
        )

    def write(self, folder: Path) -> Path:
        path = Path(folder) / FILE
        with path.open("w", encoding="utf-8") as fh:
            for row in self.rows():
                fh.write(json.dumps(row) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path | None) -> PassRates:
        """The table a version stored; an empty one when there is none (or it cannot be read)."""
        if folder is None or not (Path(folder) / FILE).is_file():
            return cls()
        try:
            return cls.from_rows(
                [json.loads(line) for line in (Path(folder) / FILE).read_text().splitlines() if line.strip()]
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("pass rates in %s unreadable (%s): starting without them", folder, exc)
            return cls()
