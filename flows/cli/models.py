"""The CLI's commands about an experiment's models and data over time: `champion`, `promote`, `rollback`,
`export`, `heldout refresh`, and `make-model` (a small model built locally). The work is in
`flows/pipeline/champion.py` and `stages/records/datasets.py`. A person's move is recorded as such (`by: person`,
with the reason given), and, when a Prefect server is configured (`PREFECT_API_URL`), announced as an event for
automations."""

from __future__ import annotations

import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from regimen.flows.cli.app import app
from regimen.stages.core.errors import InputError

console = Console(soft_wrap=True, emoji=False)
StoreOpt = Annotated[str, typer.Option("--store", help="artifact store: a folder or an fsspec URL")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="why (recorded in the champion's history)")]


def _announce(experiment: str, event: str, line: dict) -> None:
    """The person's move as a Prefect event, when a server is configured. The record is the truth and is
    already written: a server that does not answer gets one line saying the move was not announced."""
    url = os.environ.get("PREFECT_API_URL")
    if not url:
        return
    if not _api_answers(url):
        console.print(
            f"recorded; not announced to Prefect: its API at {url} does not answer (automations on "
            f"regimen.model.{event} will not see this move)",
            markup=False,
            highlight=False,
        )
        return
    try:
        from prefect.events import emit_event

        emit_event(
            event=f"regimen.model.{event}",
            resource={"prefect.resource.id": f"regimen.experiment.{experiment}", "prefect.resource.name": experiment},
            payload={
                "experiment": experiment,
                "by": "person",
                "policy": line.get("policy"),
                "heldout_accuracy": line.get("heldout_accuracy"),
                "reason": line.get("reason"),
            },
        )
    except Exception as exc:  # noqa: BLE001 - an unreachable server does not undo the recorded move
        console.print(
            f"recorded; not announced to Prefect: {' '.join(str(exc).split())[:120]}", markup=False, highlight=False
        )


def _mirror(store, experiment: str, line: dict) -> None:
    """A person's move into MLflow's registry when the experiment tracks with MLflow (one line either way)."""
    from regimen.flows.pipeline.tracking import person_moved

    if said := person_moved(store, experiment, line):
        console.print(said, markup=False, highlight=False)


def _api_answers(url: str) -> bool:
    """Whether Prefect's API answers its health check within a few seconds (with the auth string, if set)."""
    import httpx

    auth = os.environ.get("PREFECT_API_AUTH_STRING")
    try:
        r = httpx.get(
            f"{url.rstrip('/')}/health", timeout=5, auth=tuple(auth.split(":", 1)) if auth and ":" in auth else None
        )
        return r.status_code == 200
    except httpx.HTTPError:
        return False


def champion(experiment: Annotated[str, typer.Argument(help="experiment name")], store: StoreOpt = "artifacts") -> None:
    """The experiment's champion and its history (promotions, keeps, a person's moves)."""
    from regimen.flows.pipeline.champion import record
    from regimen.flows.pipeline.publish import champion_table
    from regimen.stages.core.errors import InputError
    from regimen.stages.store import Store

    st = Store(store)
    if not st.has_experiment(experiment):
        raise InputError(f"champion: no experiment {experiment!r} in store {store}")
    rec = record(st, experiment)
    current = rec.get("champion")
    if current:
        low, high = current.get("interval_95") or (None, None)
        console.print(
            f"champion of {experiment}: {current['policy']}, held-out {current['heldout_accuracy']:.3f} (95% "
            f"{low:.3f}–{high:.3f}) on held-out set v{current['heldout_set']}, {current['prompts']} prompts",
            markup=False,
            highlight=False,
        )
    else:
        console.print(f"{experiment} has no champion yet", markup=False)
    from regimen.stages.store.retention import removed

    gone = {
        str(h.get("policy"))
        for h in rec.get("history", [])
        if isinstance(ref := h.get("policy_ref"), dict)
        and isinstance(ref.get("version"), int)
        and removed(st, experiment, str(ref.get("stage")), ref["version"])
    }
    rows = champion_table(rec, gone)
    if rows:
        table = Table(title="history (newest first)")
        cols = ["when", "event", "by", "policy", "held-out", "champion then", "held-out set", "reason"]
        for c in cols:
            table.add_column(c)
        for r in rows:
            table.add_row(*[str(r.get(c, "")) for c in cols])
        console.print(table)


def promote(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    version: Annotated[str, typer.Argument(help="the policy: grpo/v3, v3 or 3 (a GRPO version), or sft/v2")],
    store: StoreOpt = "artifacts",
    reason: ReasonOpt = "",
) -> None:
    """Make a policy the champion (a person's decision; it must have been evaluated on the frozen held-out set)."""
    from regimen.flows.pipeline.champion import person_promotes
    from regimen.stages.store import Store

    st = Store(store)
    line = person_promotes(st, experiment, version, reason)
    console.print(
        f"{experiment}: {line['policy']} is the champion (held-out {line['heldout_accuracy']:.3f}), by a person",
        markup=False,
        highlight=False,
    )
    _announce(experiment, "promoted", line)
    _mirror(st, experiment, line)


def rollback(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    store: StoreOpt = "artifacts",
    reason: ReasonOpt = "",
) -> None:
    """Make the previous champion the champion again (a person's decision; it holds until a better challenger)."""
    from regimen.flows.pipeline.champion import person_rolls_back
    from regimen.stages.store import Store

    st = Store(store)
    line = person_rolls_back(st, experiment, reason)
    console.print(
        f"{experiment}: rolled back from {line['from']} to {line['policy']} (held-out {line['heldout_accuracy']:.3f})",
        markup=False,
        highlight=False,
    )
    _announce(experiment, "rollback", line)
    _mirror(st, experiment, line)


def export(
    experiment: Annotated[str, typer.Argument(help="experiment name")],
    out: Annotated[
        str, typer.Argument(help="a new folder: the champion as a plain model folder (from_pretrained loads it)")
    ],
    store: StoreOpt = "artifacts",
) -> None:
    """Write the champion as a model folder that `AutoModelForCausalLM.from_pretrained` loads."""
    from regimen.flows.pipeline.champion import export as do_export
    from regimen.stages.store import Store

    path = do_export(Store(store), experiment, out)
    console.print(f"exported the champion of {experiment} to {path}", markup=False, highlight=False)


heldout_app = typer.Typer(help="The experiment's frozen held-out set.", no_args_is_help=True)


@heldout_app.command("refresh")
def heldout_refresh(
    config: Annotated[str, typer.Argument(help="the experiment's recipe (its data gives the new set)")],
    reason: Annotated[str, typer.Option("--reason", help="why a new set (recorded)")],
    store: Annotated[str | None, typer.Option("--store", help="artifact store")] = None,
    experiment: Annotated[str | None, typer.Option("--experiment", help="experiment name")] = None,
) -> None:
    """Start a new frozen held-out set from the recipe's data (a person's decision; accuracies compare within one
    set)."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.records import datasets as data_records
    from regimen.stages.store import Store, check_name
    from regimen.stages.tasks.registry import load_task

    recipe = load_recipe(config, {"store": store} if store else {})
    experiment = check_name(experiment or recipe.experiment)  # data of the command, not put into the recipe
    st = Store(recipe.store)
    with st.lock(experiment):
        ref = data_records.refresh(st, experiment, load_task(recipe.data).heldout, reason=reason)
    left_out = (
        f", {ref['excluded_trained']} prompts left out because the experiment trained on them"
        if ref["excluded_trained"]
        else ""
    )
    console.print(
        f"{experiment}: held-out set v{ref['version']} ({ref['rows']} prompts{left_out}) from now on; the champion is "
        f"compared with challengers on it at the next run",
        markup=False,
        highlight=False,
    )


for _command in (champion, promote, rollback, export):
    app.command(_command.__name__)(_command)
app.add_typer(heldout_app, name="heldout")


@app.command("make-model")
def make_model(
    out: Annotated[str, typer.Argument(help="folder to write the model into (like a hub snapshot)")],
    arch: Annotated[
        str, typer.Option("--arch", help="qwen3 or llama (either with a byte-level BPE tokenizer and a chat template)")
    ] = "qwen3",
    hidden_size: Annotated[int, typer.Option("--hidden-size")] = 64,
    layers: Annotated[int, typer.Option("--layers")] = 2,
) -> None:
    """Build a small standard-architecture causal LM locally (no download), saved with save_pretrained."""
    from regimen.stages.training.model import build_real_shaped_model

    if arch not in ("qwen3", "llama"):
        raise InputError(f"--arch {arch!r}: use qwen3 or llama")
    # 4 attention heads of hidden_size // 4 each, and rotary embeddings need an even head size
    if not (8 <= hidden_size <= 8192 and hidden_size % 8 == 0):
        raise InputError(f"--hidden-size {hidden_size}: a multiple of 8 between 8 and 8192 (4 heads of an even size)")
    if not 1 <= layers <= 64:
        raise InputError(f"--layers {layers}: between 1 and 64")
    path = build_real_shaped_model(out, arch=arch, hidden_size=hidden_size, num_layers=layers)
    console.print(f"model saved to {path} (model.name_or_path: {path})")
