"""W&B: passed through as its users set it up (WANDB_MODE, WANDB_PROJECT, ... or `tracking_options.wandb`), a run
per stage in the run group's `group`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from regimen.flows.pipeline.tracking import Tracker, register_tracker


@register_tracker("wandb")
class WandB(Tracker):
    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], folder: Path):
        import wandb

        self.wandb, self.group = wandb, group
        self.project = options.get("project") or os.environ.get("WANDB_PROJECT") or f"regimen-{experiment}"
        self.mode = options.get("mode") or os.environ.get("WANDB_MODE")
        self.run = None

    def start(self, key: str, name: str, tags: dict[str, str]) -> None:
        self.run = self.wandb.init(
            project=self.project, group=self.group, name=name, config=tags, mode=self.mode, reinit="finish_previous"
        )

    def log(self, key: str | None, metrics: dict[str, float], step: int) -> None:
        if key is not None and self.run is not None:
            self.run.log(metrics, step=step)

    def finish(self, key: str, tags: dict[str, str], failed: bool) -> None:
        if self.run is not None:
            self.run.config.update(tags, allow_val_change=True)
            self.run.finish(exit_code=1 if failed else 0)
            self.run = None

    def link(self, key: str | None) -> str:
        return f"W&B project {self.project}, group {self.group}"
