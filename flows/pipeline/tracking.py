"""The run mirrored into the trackers people already use (`tracking: [mlflow, trackio, tensorboard]`).

One run group per `regimen run` (nightly runs too), named `<experiment>-<UTC time>`, and in it one run per stage
call, named `<stage> c<cycle>.<round>` and tagged with the experiment, cycle, round, stage, version, fingerprint,
the Prefect flow run and the version's place in the store; a reused stage is tagged `reused` with the version it
reused, so a resumed or identical rerun never looks like a new training. Each stage's metrics (the gates' figures,
the audit's findings, held-out accuracy per task and level, the guard's finding) go to its run; training stages
stream their Trainer's log entries live (`StageDirs.progress`, event `log`); the cycle's verdicts go to the group.

The trackers are a registry, as rewards and tasks are: one module per tracker next to this one,
`tracker_<name>.py`, holding a `Tracker` subclass decorated `@register_tracker("<name>")` (MLflow, trackio,
TensorBoard, W&B: see each module's doc). This module finds the `tracker_*` modules itself, and `Trackers.open`
makes each tracker the recipe names by looking its name up. The names a recipe may write, and each one's options,
are the recipe's (`stages/recipe/trackers.py`, which says why they live there); a test checks that the registered
trackers and those names are the same set.

The store stays the source of truth. A tracker that is down, refuses, or is misconfigured never stops training:
its first failure is one warning line, and the run goes on without it. The trackers a run used are recorded in
the experiment (`<experiment>/tracking.json`), so a person's `promote` or `rollback` moves MLflow's alias too.
"""

from __future__ import annotations

import abc
import importlib
import json
import logging
import math
import pkgutil
import re
import time
from pathlib import Path
from typing import Any, ClassVar

log = logging.getLogger("regimen.run")
RECORD = "tracking.json"
_REGISTRY: dict[str, type[Tracker]] = {}
_FOUND = False


class Tracker(abc.ABC):
    """What the run calls on a tracker. Made once per run group as `cls(options, experiment, group, tags, folder)`:
    `options` are the recipe's `tracking_options.<name>` (validated against `stages/recipe/trackers.py`), `group`
    the run group's name, `tags` the group's tags, `folder` a place of its own for local files
    (`<store>/<experiment>/<name>` for a local store, the store's cache otherwise). A stage call's run is `key`;
    `key=None` is the group itself. Every call is guarded by `Trackers`: an exception is one warning and the tracker
    is left out from then on. `start`, `log` and `finish` are a tracker's own; the rest may stay as they are here."""

    name: ClassVar[str] = ""  # set by register_tracker

    @abc.abstractmethod
    def start(self, key: str, name: str, tags: dict[str, str]) -> None:
        """A stage call's run opens, named `name` (`<stage> c<cycle>.<round>`) with its tags."""
        raise NotImplementedError

    @abc.abstractmethod
    def log(self, key: str | None, metrics: dict[str, float], step: int) -> None:
        """Finite numbers at `step`: a Trainer's log entry, a stage's metrics, or (key None) the group's verdicts."""
        raise NotImplementedError

    @abc.abstractmethod
    def finish(self, key: str, tags: dict[str, str], failed: bool) -> None:
        """A stage call's run closes with what it made or reused (tags), or as failed."""
        raise NotImplementedError

    def tag_group(self, tags: dict[str, str]) -> None:
        """Tags on the run group (the cycle's verdicts)."""
        return None  # nothing, unless the tracker says otherwise

    def close(self, failed: bool) -> None:
        """The run group ends."""
        return None  # nothing, unless the tracker says otherwise

    def link(self, key: str | None) -> str:
        """Where a person finds the run (the Prefect UI's `trackers` artifact shows it)."""
        return self.name

    def champion(self, move: dict[str, Any]) -> None:
        """The flow promoted or rolled back the champion (`champion_move`): a model registry follows it."""
        return None  # nothing, unless the tracker says otherwise

    @classmethod
    def moved_by_person(cls, options: dict[str, Any], experiment: str, move: dict[str, Any]) -> str | None:
        """A person's `promote` or `rollback`, outside any run (no run group is opened): one line saying what moved,
        or None when the tracker has nothing to move."""
        return None


def register_tracker(name: str):
    """Register a `Tracker` subclass under `name`, the name a recipe's `tracking:` lists (declared, with its
    options, in `stages/recipe/trackers.py`)."""

    def deco(cls: type[Tracker]) -> type[Tracker]:
        if not (isinstance(cls, type) and issubclass(cls, Tracker)):
            raise TypeError(f"tracker {name!r}: {cls!r} is not a subclass of Tracker ({__name__})")
        if cls.__abstractmethods__:
            raise TypeError(f"tracker {name!r}: {cls.__name__} lacks {', '.join(sorted(cls.__abstractmethods__))}")
        other = _REGISTRY.get(name)
        if other is not None and (other.__module__, other.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(f"tracker {name!r} is registered twice: {other.__module__} and {cls.__module__}")
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def registered() -> dict[str, type[Tracker]]:
    """The registered trackers by name. The `tracker_*` modules next to this one register theirs when imported,
    here, once per process (nothing else needs to name them)."""
    global _FOUND
    if not _FOUND:
        for found in pkgutil.iter_modules([str(Path(__file__).parent)]):
            if found.name.startswith("tracker_"):
                importlib.import_module(f"{__package__}.{found.name}")
        _FOUND = True
    return dict(_REGISTRY)


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a log entry or a stage's metrics, under names every tracker takes."""
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[re.sub(r"[^A-Za-z0-9_\-./ ]", "_", str(k))[:250]] = float(v)
    return out


class Trackers:
    """The run's trackers (see the module doc). Every call is guarded: a tracker's first failure is one warning
    and it is left out from then on; the run never waits on it or stops for it."""

    def __init__(self, adapters: list[Tracker], group: str, tags: dict[str, str] | None = None):
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
            store.write_record(
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


def _make(name: str, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], store) -> Tracker:
    """The tracker registered as `name`, made for this run group."""
    trackers = registered()
    if name not in trackers:
        raise ValueError(f"no tracker is registered as {name!r} (registered: {', '.join(sorted(trackers))})")
    folder = (Path(store.root) if store.local else Path(store.cache)) / experiment / name
    return trackers[name](options, experiment, group, tags, folder)


def champion_move(store, experiment: str, line: dict[str, Any]) -> dict[str, Any] | None:
    """What MLflow's registry records of a champion's move (a history line of champion.json): the model's place in
    the store, the figures of the paired test."""
    ref = line.get("policy_ref") or {}
    if not ref.get("stage") or not ref.get("version"):
        return None
    source = store.join(experiment, ref["stage"], f"v{ref['version']}", "model")
    if store.local:
        source = Path(source).resolve().as_uri()
    move = {"source": source, "event": line.get("event"), "by": line.get("by"), "policy": line.get("policy")}
    for k in ("heldout_accuracy", "heldout_set", "eval_version", "reason"):
        move[k] = line.get(k)
    if figures := line.get("figures"):
        move["figures"] = json.dumps(figures, default=str)[:5000]
    return move


def person_moved(store, experiment: str, line: dict[str, Any]) -> str | None:
    """A person's promote or rollback, mirrored into the trackers the experiment's runs used (`tracking.json`) that
    keep a model registry (`Tracker.moved_by_person`: MLflow's); a line saying what happened, or None when none
    does."""
    recorded = store.read_record(experiment, RECORD)
    if not isinstance(recorded, dict):
        return None
    trackers = registered()
    names = [n for n in recorded.get("tracking") or [] if n in trackers]
    move = champion_move(store, experiment, line) if names else None
    if move is None:
        return None
    said = []
    for name in names:
        options = (recorded.get("options") or {}).get(name) or {}
        try:
            line_said = trackers[name].moved_by_person(options, experiment, move)
        except Exception as exc:  # noqa: BLE001 - the record in the store is the truth; a registry only mirrors it
            line_said = f"recorded; {name}'s registry not updated: {' '.join(str(exc).split())[:160]}"
        if line_said:
            said.append(line_said)
    return "; ".join(said) or None
