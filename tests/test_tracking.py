"""The run mirrored into the trackers (issue 43), read back through each tracker's own reader: MLflow with a SQLite
backend (`MlflowClient`), trackio's local store (its `Api` and `SQLiteStorage`), TensorBoard's event files
(tensorboard's `EventAccumulator`). A tracker pointed at a closed port: training completes, one warning. Trackers
are a registry (`flows/pipeline/tracking.py`) over the recipe's one list of names (`stages/recipe/trackers.py`)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from conftest import TINY, run_cli

slow = pytest.mark.slow  # the tests that train or start trackers; the registry's run fast

EXP = "tiny-test"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """One real run of the tiny recipe with all three trackers, then an identical rerun (every stage reused)."""
    tmp = tmp_path_factory.mktemp("tracked")
    store, tb, trackio_dir = tmp / "store", tmp / "tb", tmp / "trackio"
    uri = f"sqlite:///{tmp / 'mlflow.db'}"
    env = {"MLFLOW_TRACKING_URI": uri, "TRACKIO_DIR": str(trackio_dir)}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    args = [
        "run",
        str(TINY),
        "--store",
        str(store),
        "--set",
        "tracking=[mlflow, trackio, tensorboard]",
        "--set",
        f"tracking_options={{tensorboard: {{dir: '{tb}'}}}}",
    ]
    try:
        from conftest import run_cli as cli

        first = cli(args, _Capsys())
        again = cli(args, _Capsys())
    finally:
        for k, v in old.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    return {"store": store, "tb": tb, "trackio": trackio_dir, "uri": uri, "first": first, "again": again}


class _Capsys:
    """run_cli outside a test function: captures nothing (the fixture reads the trackers, not the terminal)."""

    def readouterr(self):
        from types import SimpleNamespace

        return SimpleNamespace(out="", err="")


def _mlflow(uri: str):
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(f"regimen-{EXP}")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    return client, runs


@slow
def test_mlflow_holds_a_parent_per_run_and_a_nested_run_per_stage_with_metrics_and_tags(tracked):
    assert tracked["first"][0] == 0
    client, runs = _mlflow(tracked["uri"])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 2  # one run group per `regimen run`
    first = min(parents, key=lambda r: r.info.start_time)
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == first.info.run_id]
    stages = {r.data.tags["regimen.stage"] for r in children}
    assert {"sft", "reward-dry-run", "grpo-smoke", "grpo", "eval"} <= stages
    by = {r.data.tags["regimen.stage"]: r for r in children}
    grpo = by["grpo"]
    for tag in (
        "regimen.experiment",
        "regimen.cycle",
        "regimen.round",
        "regimen.version",
        "regimen.fingerprint",
        "regimen.store_path",
        "regimen.run_group",
    ):
        assert tag in grpo.data.tags, tag
    assert grpo.data.tags["regimen.reused"] == "false"
    history = client.get_metric_history(grpo.info.run_id, "reward")
    assert len(history) >= 2  # the Trainer's log entries, streamed as it trained
    assert "heldout_accuracy" in by["eval"].data.metrics
    assert {"mean_reward", "frac_reward_zero_std", "audit_findings"} <= set(by["reward-dry-run"].data.metrics)
    assert any(k.startswith("regimen.verdict.") for k in first.data.tags)  # the cycle's verdict on the group


@slow
def test_a_reused_stage_says_so_in_the_tracker(tracked):
    client, runs = _mlflow(tracked["uri"])
    parents = sorted((r for r in runs if "mlflow.parentRunId" not in r.data.tags), key=lambda r: r.info.start_time)
    rerun = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parents[-1].info.run_id]
    assert rerun and all(r.data.tags["regimen.reused"] == "true" for r in rerun)
    assert all(r.data.tags["regimen.reused_version"] == r.data.tags["regimen.version"] for r in rerun)


@slow
def test_the_champion_is_registered_by_reference_with_the_alias_after_a_promotion_and_a_rollback(
    tracked, tmp_path, capsys
):
    """The flow's promotion registers the champion's model (by its place in the store) under the alias `champion`;
    a person's promote and rollback (`regimen promote`, `regimen rollback`) move the alias too."""
    from mlflow import MlflowClient
    from test_records import EXP as REC
    from test_records import build, conclude

    client = MlflowClient(tracking_uri=tracked["uri"])
    champion = client.get_model_version_by_alias(f"regimen-{EXP}", "champion")
    assert champion.source.startswith("file://") and champion.source.endswith("/model")
    assert Path(champion.source.removeprefix("file://")).is_dir()  # the version in the store, not a copy
    assert (
        champion.tags["event"] == "promoted" and champion.tags["by"] == "flow" and "heldout_accuracy" in champion.tags
    )

    store = tmp_path / "store"
    st = build(store)  # grpo v1..v3, each evaluated on one frozen set
    conclude(st, 1)
    st.write_record(REC, "tracking.json", {"tracking": ["mlflow"], "options": {}})  # as a tracked run records it
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    os.environ["MLFLOW_TRACKING_URI"] = uri
    try:
        code, out, err = run_cli(["promote", REC, "grpo/v3", "--store", str(store), "--reason", "v3 wins"], capsys)
        assert code == 0 and "alias champion moved" in out, (out, err)
        client = MlflowClient(tracking_uri=uri)
        promoted = client.get_model_version_by_alias(f"regimen-{REC}", "champion")
        assert promoted.tags["by"] == "person" and promoted.source.endswith("/grpo/v3/model")
        assert promoted.tags["heldout_accuracy"] == "0.9"
        code, out, err = run_cli(["rollback", REC, "--store", str(store), "--reason", "back"], capsys)
        assert code == 0 and "alias champion moved" in out, (out, err)
        back = client.get_model_version_by_alias(f"regimen-{REC}", "champion")
        assert back.tags["event"] == "rolled-back" and back.source.endswith("/grpo/v1/model")
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)


@slow
def test_trackio_has_one_project_with_a_run_per_stage_in_the_group(tracked):
    os.environ["TRACKIO_DIR"] = str(tracked["trackio"])
    try:
        from trackio.sqlite_storage import SQLiteStorage

        runs = SQLiteStorage.get_runs(f"regimen-{EXP}")
        groups = {r.split("/")[0] for r in runs}
        assert len(groups) == 2 and any(r.endswith("/run") for r in runs)
        grpo = next(r for r in runs if "/grpo c1." in r)
        assert any("reward" in row for row in SQLiteStorage.get_logs(f"regimen-{EXP}", grpo))
        config = SQLiteStorage.get_run_config(f"regimen-{EXP}", grpo)
        assert config["regimen.stage"] == "grpo" and config["_Group"] in groups
    finally:
        os.environ.pop("TRACKIO_DIR", None)


@slow
def test_tensorboard_has_a_folder_per_run_group_and_a_subfolder_per_stage(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    groups = sorted(p for p in tracked["tb"].iterdir() if p.is_dir())
    assert len(groups) == 2
    folders = {p.name for p in groups[0].iterdir()}
    assert {"run", "sft-c1.0", "grpo-c1.1", "eval-c1.1"} <= folders, folders
    acc = EventAccumulator(str(groups[0] / "grpo-c1.1"))
    acc.Reload()
    assert "reward" in acc.Tags()["scalars"] and len(acc.Scalars("reward")) >= 2


@slow
def test_a_tracker_pointed_at_a_closed_port_never_stops_training(tmp_path, capsys):
    os.environ["MLFLOW_TRACKING_URI"] = f"http://127.0.0.1:{_closed_port()}"
    try:
        code, out, err = run_cli(
            ["run", str(TINY), "--store", str(tmp_path / "store"), "--set", "tracking=[mlflow]"], capsys
        )
    finally:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    assert code == 0, err
    said = [line for line in (out + err).splitlines() if "tracker mlflow failed" in line]
    assert len(said) == 1, out + err  # one warning, and the run went on
    from regimen.stages.store import Store

    assert Store(tmp_path / "store").versions(EXP, "eval")


def test_tracking_is_the_way_in_and_report_to_beside_it_is_refused():
    from regimen.stages.core.errors import InputError
    from regimen.stages.recipe import load_recipe

    with pytest.raises(InputError, match="grpo.report_to: with `tracking:`"):
        load_recipe(str(TINY), {"tracking": ["mlflow"], "grpo.report_to": ["tensorboard"]}, check_trl=False)
    with pytest.raises(InputError, match="tracking_options.trackio: trackio is not in tracking"):
        load_recipe(str(TINY), {"tracking": ["mlflow"], "tracking_options": {"trackio": {}}}, check_trl=False)


@slow
def test_a_process_running_a_second_recipe_writes_its_trackio_runs_into_that_recipes_folder(tmp_path):
    """trackio reads its folder once, at import: a served worker that runs a second recipe with another
    `tracking_options.trackio.dir` must not write into the first one's folder (a fresh process, so that the
    import happens here)."""
    import subprocess
    import sys

    first, second = tmp_path / "first", tmp_path / "second"
    script = f"""
import os
os.environ["TRACKIO_DIR"] = {str(first)!r}
import trackio  # loaded for the first recipe
from regimen.flows.pipeline.tracker_trackio import Trackio
t = Trackio({{"dir": {str(second)!r}}}, "exp", "g1", {{}}, None)
t.start("k", "sft c1.0", {{}})
t.log("k", {{"loss": 1.0}}, 1)
t.finish("k", {{}}, False)
t = Trackio({{}}, "later", "g2", {{}}, None)  # a later recipe without a folder of its own: the process's TRACKIO_DIR
t.start("k", "sft c1.0", {{}})
t.log("k", {{"loss": 1.0}}, 1)
t.finish("k", {{}}, False)
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert (second / "regimen-exp.db").is_file() and not (first / "regimen-exp.db").exists()
    assert (first / "regimen-later.db").is_file() and not (second / "regimen-later.db").exists()


def test_a_tracker_is_one_class_and_one_registration(tmp_path, monkeypatch):
    """A tracker registered by name is made by the flow's `Trackers.open` for a recipe that lists it, gets every
    stage call, and follows a person's promote through `tracking.json`; no other code names it."""
    from types import SimpleNamespace

    from regimen.flows.pipeline import tracking
    from regimen.stages.store import Store

    monkeypatch.setattr(tracking, "_REGISTRY", tracking.registered())  # the test's tracker leaves with the test
    calls = []

    @tracking.register_tracker("fake")
    class Fake(tracking.Tracker):
        def __init__(self, options, experiment, group, tags, folder):
            calls.append(("made", options, experiment, folder.name))

        def start(self, key, name, tags):
            calls.append(("start", name, tags["regimen.stage"]))

        def log(self, key, metrics, step):
            calls.append(("log", key, metrics, step))

        def finish(self, key, tags, failed):
            calls.append(("finish", key, failed))

        @classmethod
        def moved_by_person(cls, options, experiment, move):
            return f"fake: {move['event']} {move['source'].rsplit('/', 3)[-3]}"

    store = Store(tmp_path / "store")
    recipe = SimpleNamespace(tracking=["fake"], tracking_options={"fake": {"color": "red"}}, store=str(tmp_path))
    trackers = tracking.Trackers.open(recipe, "exp", store, None)
    assert [type(a) for a in trackers.adapters] == [Fake]
    key = trackers.start("grpo", 1, 1, {})
    trackers.log(key, {"reward": 0.5, "note": "text"}, 3)
    trackers.finish(key, {"version": 2, "metrics": {}}, "exp/grpo/v2")
    trackers.close(False)
    assert calls == [
        ("made", {"color": "red"}, "exp", "fake"),
        ("start", "grpo c1.1", "grpo"),
        ("log", "grpo c1.1", {"reward": 0.5}, 3),
        ("finish", "grpo c1.1", False),
    ]
    assert trackers.links(key) == ["fake: fake"]
    line = {"policy_ref": {"stage": "grpo", "version": 2}, "event": "promoted", "by": "person"}
    assert tracking.person_moved(store, "exp", line) == "fake: promoted grpo"


def test_a_tracker_without_its_own_start_log_and_finish_is_refused_at_registration(monkeypatch):
    from regimen.flows.pipeline import tracking

    monkeypatch.setattr(tracking, "_REGISTRY", tracking.registered())
    with pytest.raises(TypeError, match="tracker 'half': Half lacks finish, log"):

        @tracking.register_tracker("half")
        class Half(tracking.Tracker):
            def start(self, key, name, tags):
                pass

    with pytest.raises(ValueError, match="tracker 'mlflow' is registered twice"):

        @tracking.register_tracker("mlflow")
        class Other(tracking.Tracker):
            def start(self, key, name, tags):
                pass

            def log(self, key, metrics, step):
                pass

            def finish(self, key, tags, failed):
                pass


def test_the_recipes_tracker_names_are_the_registered_trackers():
    """The recipe's one list of names (stages may not import flows) and the flows' registry are the same set."""
    from regimen.flows.pipeline.tracking import registered
    from regimen.stages.recipe import trackers
    from regimen.stages.recipe.schema import Recipe

    assert set(trackers.NAMES) == set(registered())
    assert set(typing_args(Recipe.model_fields["tracking"].annotation)) == set(trackers.NAMES)


def typing_args(annotation) -> tuple:
    """The names of `list[Literal[...]]`."""
    import typing

    (literal,) = typing.get_args(annotation)
    return typing.get_args(literal)


def test_an_unknown_tracker_is_one_line_naming_the_field_and_the_known_names():
    from regimen.stages.core.errors import InputError
    from regimen.stages.recipe import load_recipe, trackers

    for overrides, field in [
        ({"tracking": ["mlflw"]}, "tracking.0"),
        ({"tracking": ["mlflow"], "tracking_options": {"mlflw": {}}}, "tracking_options.mlflw"),
    ]:
        with pytest.raises(InputError) as caught:
            load_recipe(str(TINY), overrides, check_trl=False)
        said = str(caught.value)
        assert "\n" not in said and field in said and "mlflw" in said, said
        assert all(repr(name) in said for name in trackers.NAMES), said
    with pytest.raises(InputError, match=r"tracking_options.mlflow: unknown colour \(known: experiment_name, "):
        load_recipe(str(TINY), {"tracking": ["mlflow"], "tracking_options": {"mlflow": {"colour": 1}}}, check_trl=False)
