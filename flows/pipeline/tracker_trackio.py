"""trackio (local-first; TRACKIO_DIR / TRACKIO_PROJECT or `tracking_options.trackio`): one project, a run per stage
in the run group's `group`, the group's own run (`<group>/run`) holding the verdicts."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from pathlib import Path
from typing import Any

from regimen.flows.pipeline.tracking import Tracker, register_tracker


@contextlib.contextmanager
def _quiet():
    """Trackers that print to stdout (trackio's banners) stay off the run's quiet terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _trackio_at(directory: Path) -> None:
    """Point an already-imported trackio at `directory`. trackio reads TRACKIO_DIR once, at its first import, and
    its modules keep copies of the paths made from it (TRACKIO_DIR, MEDIA_DIR, ARTIFACTS_DIR); a process that runs
    several recipes (a served worker, the tests) would write a later recipe's runs into the first one's folder. No
    trackio API sets the folder after import, so those copies are rebound here, in every loaded trackio module.
    The folder is the process's: two recipes tracked at once in one process share the later one's."""
    import trackio.utils as utils

    if utils.TRACKIO_DIR == directory:
        return
    new = {"TRACKIO_DIR": directory, "MEDIA_DIR": directory / "media", "ARTIFACTS_DIR": directory / "artifacts"}
    old = {name: getattr(utils, name) for name in new if hasattr(utils, name)}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == "trackio" or name.startswith("trackio.")):
            continue
        for attr, value in old.items():
            if getattr(module, attr, None) == value:
                setattr(module, attr, new[attr])


@register_tracker("trackio")
class Trackio(Tracker):
    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], folder: Path):
        import trackio
        from trackio.utils import HF_HOME

        # this recipe's folder: its own option, else TRACKIO_DIR as the environment says now, else trackio's default
        # (never an earlier recipe's option: one process may run several recipes, one after another)
        _trackio_at(Path(options.get("dir") or os.environ.get("TRACKIO_DIR") or Path(HF_HOME) / "trackio"))

        self.trackio, self.group, self.tags = trackio, group, tags
        self.project = options.get("project") or os.environ.get("TRACKIO_PROJECT") or f"regimen-{experiment}"
        self.pending: list[tuple[dict[str, float], int]] = []
        self.open: str | None = None

    def _init(self, name: str, config: dict[str, str]) -> None:
        with _quiet():
            self.trackio.init(
                project=self.project,
                name=name,
                group=self.group,
                config=config,
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )

    def start(self, key: str, name: str, tags: dict[str, str]) -> None:
        self._init(f"{self.group}/{name}", tags)
        self.open = key

    def log(self, key: str | None, metrics: dict[str, float], step: int) -> None:
        if key is None:
            self.pending.append((metrics, step))  # the group's own run is written at the end
        elif key == self.open:
            with _quiet():
                self.trackio.log(metrics, step=step)

    def finish(self, key: str, tags: dict[str, str], failed: bool) -> None:
        with _quiet():
            self.trackio.config.update({**tags, "failed": failed}, allow_val_change=True)
            self.trackio.finish()
        self.open = None

    def tag_group(self, tags: dict[str, str]) -> None:
        self.tags = {**self.tags, **tags}

    def close(self, failed: bool) -> None:
        self._init(f"{self.group}/run", {**self.tags, "failed": failed})
        with _quiet():
            for metrics, step in self.pending:
                self.trackio.log(metrics, step=step)
            self.trackio.finish()

    def link(self, key: str | None) -> str:
        return f"trackio show --project {self.project}"
