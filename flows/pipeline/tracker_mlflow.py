"""MLflow (`MlflowClient`, its own configuration: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, or
`tracking_options.mlflow`): a parent run per run group and a nested run per stage (`mlflow.parentRunId`). When a
champion is promoted or rolled back (by the flow or a person), the champion's model is registered by reference to its
version in the store (`create_model_version(source=...)`, no copy) and the alias `champion` moves with it, the paired
test's figures as tags."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from regimen.flows.pipeline.tracking import Tracker, register_tracker


def _client(options: dict[str, Any]):
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")  # an unreachable server: one warning, quickly
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=options.get("tracking_uri"))


@register_tracker("mlflow")
class MLflow(Tracker):
    def __init__(self, options: dict[str, Any], experiment: str, group: str, tags: dict[str, str], folder: Path):
        self.client = _client(options)
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

    @classmethod
    def moved_by_person(cls, options: dict[str, Any], experiment: str, move: dict[str, Any]) -> str | None:
        register_champion(_client(options), options.get("registered_model") or f"regimen-{experiment}", move)
        return "MLflow's registered model: alias champion moved"


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
