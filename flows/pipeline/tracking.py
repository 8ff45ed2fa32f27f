"""The run mirrored into the trackers people already use (`tracking: [mlflow, trackio, tensorboard]`).

One run group per `regimen run` (nightly runs too), named `<experiment>-<UTC time>`, and in it one run per stage
call, named `<stage> c<cycle>.<round>` and tagged with the experiment, cycle, round, stage, version, fingerprint,
the Prefect flow run and the version's place in the store; a reused stage is tagged `reused` with the version it
reused, so a resumed or identical rerun never looks like a new training. Each stage's metrics (the gates' figures,
the audit's findings, held-out accuracy per task and level, the guard's finding) go to its run; training stages
stream their Trainer's log entries live (`StageDirs.progress`, event `log`); the cycle's verdicts go to the group.

- **MLflow** (`MlflowClient`, its own configuration: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, or
  `tracking_options.mlflow`): a parent run per run group and a nested run per stage (`mlflow.parentRunId`). When a
  champion is promoted or rolled back (by the flow or a person), the champion's model is registered by reference to
  its version in the store (`create_model_version(source=...)`, no copy) and the alias `champion` moves with it,
  the paired test's figures as tags.
- **trackio** (local-first; TRACKIO_DIR / TRACKIO_PROJECT or `tracking_options.trackio`): one project, a run per
  stage in the run group's `group`, the group's own run (`<group>/run`) holding the verdicts.
- **TensorBoard** (`tracking_options.tensorboard.dir`, default `<store>/<experiment>/tensorboard` for a local store):
  one log folder per run group, a subfolder per stage run, `run/` for the verdicts.
- **W&B**: passed through as its users set it up (WANDB_MODE, WANDB_PROJECT, ...), a run per stage in the group.

The store stays the source of truth. A tracker that is down, refuses, or is misconfigured never stops training:
its first failure is one warning line, and the run goes on without it. The trackers a run used are recorded in
the experiment (`<experiment>/tracking.json`), so a person's `promote` or `rollback` moves MLflow's alias too.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

log = logging.getLogger("regimen.run")
RECORD = "tracking.json"
EXTRAS = {"mlflow": "mlflow", "trackio": "trackio", "tensorboard": "tensorboard", "wandb": "wandb"}


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a log entry or a stage's metrics, under names every tracker takes."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[re.sub(r"[^A-Za-z0-9_\-./ ]", "_", str(k))[:250]] = float(v)
    return out


@contextlib.contextmanager
def _quiet():
    """Trackers that print to stdout (trackio's banners) stay off the run's quiet terminal."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


class MLflow:
    name = "mlflow"

    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str]):
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # an unreachable server: one warning, quickly
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=options.get("tracking_uri"))
        name = options.get("experiment_name") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or f"regimen-{experiment}"
        found = self.client.get_experiment_by_name(name)
        self.experiment_id = found.experiment_id if found else self.client.create_experiment(name)
        self.model = options.get("registered_model") or f"regimen-{experiment}"
        self.parent = self.client.create_run(self.experiment_id, run_name=group, tags=tags).info.run_id
        self.runs: dict[str, str] = {}

    def start(self, key: str, name: str, tags: dict[str, str]) -> None:
        run = self.client.create_run(
            self.experiment_id, run_name=name, tags={**tags, "mlflow.parentRunId": self.parent}
        )
        self.runs[key] = run.info.run_id

    def log(self, key: str | None, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        run = self.runs[key] if key else self.parent
        self.client.log_batch(run, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    def finish(self, key: str, tags: dict[str, str], failed: bool) -> None:
        from mlflow.entities import RunTag

        self.client.log_batch(self.runs[key], tags=[RunTag(k, v) for k, v in tags.items()])
        self.client.set_terminated(self.runs[key], "FAILED" if failed else "FINISHED")

    def tag_group(self, tags: dict[str, str]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.parent, k, v)

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.parent, "FAILED" if failed else "FINISHED")

    def link(self, key: str | None) -> str:
        run = self.runs.get(key or "", self.parent)
        uri = self.client.tracking_uri
        if str(uri).startswith("http"):
            return f"{uri.rstrip('/')}/#/experiments/{self.experiment_id}/runs/{run}"
        return f"MLflow run {run} ({uri})"

    def champion(self, move: dict[str, Any]) -> None:
        register_champion(self.client, self.model, move)


def register_champion(client, model: str, move: dict[str, Any]) -> None:
    """The champion's model registered by reference (its version's place in the store, no copy), alias `champion`
    on it, the paired test's figures as tags."""
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(model)
    except MlflowException:
        client.create_registered_model(model, description="Regimen's champion: the alias `champion` is the one in use")
    tags = {k: str(v) for k, v in move.items() if k != "source" and v is not None}
    version = client.create_model_version(model, source=move["source"], run_id=move.get("run_id"), tags=tags)
    client.set_registered_model_alias(model, "champion", version.version)


class TensorBoard:
    name = "tensorboard"

    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], default_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer_of = SummaryWriter
        self.dir = Path(options.get("dir") or default_dir) / group
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

    def champion(self, move: dict[str, Any]) -> None:
        pass


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


class Trackio:
    name = "trackio"

    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str]):
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

    def champion(self, move: dict[str, Any]) -> None:
        pass


class WandB:
    name = "wandb"

    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str]):
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

    def tag_group(self, tags: dict[str, str]) -> None:
        pass

    def close(self, failed: bool) -> None:
        pass

    def link(self, key: str | None) -> str:
        return f"W&B project {self.project}, group {self.group}"

    def champion(self, move: dict[str, Any]) -> None:
        pass


class Trackers:
    """The run's trackers (see the module doc). Every call is guarded: a tracker's first failure is one warning
    and it is left out from then on; the run never waits on it or stops for it."""

    def __init__(self, adapters: list[Any], group: str, tags: dict[str, str] | None = None):
        self.adapters, self.group, self.tags = adapters, group, dict(tags or {})
        self.said: set[str] = set()
        self.keys: dict[str, int] = {}

    @classmethod
    def open(cls, recipe, experiment: str, store, flow_run_id: str | None) -> Trackers | None:
        if not recipe.tracking:
            return None
        group = f"{experiment}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
        tags = {"regimen.experiment": experiment, "regimen.run_group": group, "regimen.store": str(recipe.store)}
        if flow_run_id:
            tags["prefect.flow_run_id"] = str(flow_run_id)
        made = cls([], group, tags)
        for name in recipe.tracking:
            options = dict(recipe.tracking_options.get(name) or {})
            made.guard(
                name, lambda n=name, o=options: made.adapters.append(_make(n, o, experiment, group, tags, store))
            )
        try:
            store.ledger.write(
                experiment, RECORD, {"tracking": list(recipe.tracking), "options": recipe.tracking_options}
            )
        except Exception as exc:  # noqa: BLE001 - a person's promote then does not move MLflow's alias; said once
            log.warning("tracking: could not record the trackers in the store (%s)", exc)
        return made

    def guard(self, name: str, call) -> Any:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - a tracker never stops training
            if name not in self.said:
                self.said.add(name)
                log.warning(
                    "tracker %s failed (%s): the run goes on without it", name, " ".join(str(exc).split())[:200]
                )
            self.adapters = [a for a in self.adapters if a.name != name]
            return None

    def _each(self, method: str, *args: Any) -> None:
        for adapter in list(self.adapters):
            self.guard(adapter.name, lambda a=adapter: getattr(a, method)(*args))

    def start(self, stage: str, cycle: int, round: int, tags: dict[str, str]) -> str:
        name = f"{stage} c{cycle}.{round}"
        self.keys[name] = self.keys.get(name, 0) + 1
        key = name if self.keys[name] == 1 else f"{name} #{self.keys[name]}"
        stage_tags = {"regimen.stage": stage, "regimen.cycle": str(cycle), "regimen.round": str(round)}
        self._each("start", key, key, {**self.tags, **stage_tags, **tags})
        return key

    def log(self, key: str | None, entry: dict[str, Any], step: int) -> None:
        if numbers := _numbers(entry):
            self._each("log", key, numbers, int(step))

    def finish(self, key: str, result: dict[str, Any], store_path: str, failed: str | None = None) -> None:
        """A stage's run closed with its metrics and what it made (or reused), or why it failed."""
        metrics = _numbers(result.get("metrics") or {})
        if metrics:
            self._each("log", key, metrics, int(metrics.get("steps", 0)))
        tags = (
            {"regimen.failed": failed[:250]}
            if failed
            else {
                "regimen.version": str(result.get("version")),
                "regimen.fingerprint": str(result.get("fingerprint") or (result.get("ref") or {}).get("fingerprint")),
                "regimen.reused": str(bool(result.get("reused"))).lower(),
                "regimen.store_path": store_path,
            }
        )
        if result.get("reused"):
            tags["regimen.reused_version"] = str(result.get("version"))
        for k in ("finding", "warning"):
            if result.get(k):
                tags[f"regimen.{k}"] = str(result[k])[:250]
        self._each("finish", key, tags, bool(failed))

    def verdict(self, record: dict[str, Any], step: int) -> None:
        self._each(
            "log", None, _numbers({"verdict/cycle": record.get("cycle"), "verdict/round": record.get("round")}), step
        )
        self._each(
            "tag_group", {f"regimen.verdict.c{record.get('cycle')}.{record.get('round')}": str(record.get("verdict"))}
        )

    def champion(self, move: dict[str, Any]) -> None:
        self._each("champion", move)

    def close(self, failed: bool) -> None:
        self._each("close", failed)

    def links(self, key: str | None = None) -> list[str]:
        return [f"{a.name}: {a.link(key)}" for a in self.adapters]


def _make(name: str, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], store) -> Any:
    if name == "mlflow":
        return MLflow(options, experiment, group, tags)
    if name == "trackio":
        return Trackio(options, experiment, group, tags)
    if name == "tensorboard":
        local = store.backend.local
        default = (
            Path(store.backend.root) / experiment / "tensorboard"
            if local
            else store.backend.cache / experiment / "tensorboard"
        )
        return TensorBoard(options, experiment, group, tags, default)
    return WandB(options, experiment, group, tags)


def champion_move(store, experiment: str, line: dict[str, Any]) -> dict[str, Any] | None:
    """What MLflow's registry records of a champion's move (a history line of champion.json): the model's place in
    the store, the figures of the paired test."""
    ref = line.get("policy_ref") or {}
    if not ref.get("stage") or not ref.get("version"):
        return None
    source = store.backend.join(experiment, ref["stage"], f"v{ref['version']}", "model")
    if store.backend.local:
        source = Path(source).resolve().as_uri()
    move = {"source": source, "event": line.get("event"), "by": line.get("by"), "policy": line.get("policy")}
    for k in ("heldout_accuracy", "heldout_set", "eval_version", "reason"):
        move[k] = line.get(k)
    if figures := line.get("figures"):
        move["figures"] = json.dumps(figures, default=str)[:5000]
    return move


def person_moved(store, experiment: str, line: dict[str, Any]) -> str | None:
    """A person's promote or rollback, mirrored into MLflow's registry when the experiment's runs track with MLflow
    (`tracking.json`); a line saying what happened, or None when it does not track with MLflow."""
    recorded = store.ledger.read(experiment, RECORD)
    if not isinstance(recorded, dict) or "mlflow" not in (recorded.get("tracking") or []):
        return None
    move = champion_move(store, experiment, line)
    if move is None:
        return None
    options = (recorded.get("options") or {}).get("mlflow") or {}
    try:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        from mlflow import MlflowClient

        register_champion(
            MlflowClient(tracking_uri=options.get("tracking_uri")),
            options.get("registered_model") or f"regimen-{experiment}",
            move,
        )
    except Exception as exc:  # noqa: BLE001 - the record in the store is the truth; the registry only mirrors it
        return f"recorded; MLflow's registry not updated: {' '.join(str(exc).split())[:160]}"
    return "MLflow's registered model: alias champion moved"
