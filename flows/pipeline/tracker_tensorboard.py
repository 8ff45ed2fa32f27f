"""TensorBoard (`tracking_options.tensorboard.dir`, default `<store>/<experiment>/tensorboard` for a local store, the
store's cache otherwise): one log folder per run group, a subfolder per stage run, `run/` for the verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regimen.flows.pipeline.tracking import Tracker, register_tracker


@register_tracker("tensorboard")
class TensorBoard(Tracker):
    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], folder: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer_of = SummaryWriter
        self.dir = Path(options.get("dir") or folder) / group
        self.writers: dict[str, Any] = {"": SummaryWriter(str(self.dir / "run"))}
        self.writers[""].add_text("tags", json.dumps(tags, indent=1))
        self.steps: dict[str, int] = {}

    def start(self, key: str, name: str, tags: dict[str, str]) -> None:
        self.writers[key] = self.writer_of(str(self.dir / name.replace(" ", "-")))
        self.writers[key].add_text("tags", json.dumps(tags, indent=1))

    def log(self, key: str | None, metrics: dict[str, float], step: int) -> None:
        writer = self.writers[key or ""]
        for k, v in metrics.items():
            writer.add_scalar(k, v, step)
        self.steps[key or ""] = max(step, self.steps.get(key or "", 0))
        writer.flush()

    def finish(self, key: str, tags: dict[str, str], failed: bool) -> None:
        self.writers[key].add_text("result", json.dumps({**tags, "failed": failed}, indent=1))
        self.writers.pop(key).close()

    def tag_group(self, tags: dict[str, str]) -> None:
        self.writers[""].add_text("result", json.dumps(tags, indent=1))

    def close(self, failed: bool) -> None:
        for writer in self.writers.values():
            writer.close()

    def link(self, key: str | None) -> str:
        return f"tensorboard --logdir {self.dir}"
