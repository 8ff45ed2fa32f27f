"""An experiment's history from its manifests and recorded verdicts (cycles, rounds, metrics), and its
plots (local PNGs, also embedded in Prefect's markdown artifacts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from regimen.flows.present import plots
from regimen.stages import registry
from regimen.stages.store import Store


def history(store: Store, experiment: str) -> list[dict[str, Any]]:
    """Teach results (SFT) and the judge's evaluations in the order they were made, with each evaluation's
    latest verdict and the training stage whose policy it measured."""
    teach, train, judge = registry.in_role("teach"), registry.in_role("train"), registry.judge()
    rows = [m for stage in (*teach, *train, judge) for m in store.versions(experiment, stage)]
    rows.sort(key=lambda m: m.get("finished_at", ""))
    by_fp = {m["fingerprint"]: m for m in rows if m["stage"] in train}
    whole = {m["fingerprint"]: m for stage in train for m in store.scan(experiment, stage)[0]}  # config, curriculum
    verdicts = store.verdicts_by_eval(experiment)
    out = []
    for m in rows:
        met = m.get("metrics", {})
        if m["stage"] in teach:
            out.append(
                {
                    "label": f"c{m.get('cycle')} {m['stage']} v{m['version']}",
                    "stage": m["stage"],
                    "cycle": m.get("cycle"),
                    "round": 0,
                    "version": m["version"],
                    "heldout_accuracy": met.get("heldout_accuracy"),
                    "train_reward": None,
                    "verdict": None,
                }
            )
        elif m["stage"] == judge:
            grpo = by_fp.get((m.get("inputs", {}).get("policy") or {}).get("fingerprint"), {})
            g = grpo.get("metrics", {})
            out.append(
                {
                    "label": f"c{m.get('cycle')}.{m.get('round')} {judge} v{m['version']}",
                    "stage": judge,
                    "cycle": m.get("cycle"),
                    "round": m.get("round"),
                    "version": m["version"],
                    "heldout_accuracy": met.get("heldout_accuracy"),
                    "train_reward": g.get("train_reward_last"),
                    "verdict": verdicts.get(m["version"], {}).get("verdict"),
                    "grpo_version": grpo.get("version"),
                    "kl": g.get("kl_last"),
                    "frac_reward_zero_std": g.get("frac_reward_zero_std_mean"),
                    "best_step": grpo.get("best_step"),
                    "groups": groups(whole.get(grpo.get("fingerprint"), grpo)),
                }
            )
    return out


def groups(grpo: dict[str, Any]) -> str | None:
    """GRPO's groups in one line: generated and trained, skipped before generation (by the curriculum's history, by
    the screen), and how many of the generated ones scored all alike (with `skip_all_alike` they are out of the loss,
    so none of them is trained), and the screening answers reused as attempts of their groups."""
    m, cfg = grpo.get("metrics") or {}, grpo.get("config") or {}
    # TRL's section of the resolved recipe (the one with a group size), and the curriculum's record
    g = next((v for v in cfg.values() if isinstance(v, dict) and "num_generations" in v), {})
    cur = grpo.get("curriculum") or {}
    group, batch = g.get("num_generations") or 8, g.get("per_device_train_batch_size")
    if not m.get("steps") or not batch:
        return None
    made = int(m["steps"] * batch / group)
    alike = round(made * (m.get("frac_reward_zero_std_mean") or 0.0))
    out_of_loss = bool((cfg.get("curriculum") or {}).get("skip_all_alike"))
    line = f"{made - alike if out_of_loss else made} trained"
    history, screen = int(cur.get("groups_skipped") or 0), int((cur.get("screen") or {}).get("skipped") or 0)
    if history or screen:
        line += f", skipped {history + screen} (history {history}, screen {screen})"
    line += f", all-alike {alike} of {made}" + (" (out of the loss)" if out_of_loss else "")
    reused = int(((cur.get("screen") or {}).get("reuse") or {}).get("reused") or 0)
    return line + (f"; {reused} screening answers reused in their groups" if reused else "")


def make_plots(store: Store, experiment: str, target: float | None = None) -> list[Path]:
    """Regenerate `<store>/<experiment>/plots/*.png` (local stores; remote ones get a local copy)."""
    out_dir = store.experiment_dir(experiment, "plots")
    made = []
    grpo_runs = {}
    # the newest four training runs only: their files are read (in a bucket, fetched), the rest of the history is not
    trained = [m for stage in registry.in_role("train") for m in store.versions(experiment, stage)]
    for m in sorted(trained, key=lambda m: str(m.get("finished_at", "")))[-4:]:
        log = plots.read_log(store.local_path(m) / "train_log.jsonl")
        if log:
            grpo_runs[f"{m['stage']} v{m['version']} (c{m.get('cycle')}.{m.get('round')})"] = log
    if grpo_runs:
        made.append(
            plots.training_curves(grpo_runs, out_dir / "grpo_curves.png", f"{experiment}: GRPO training curves")
        )
    points = [p for p in history(store, experiment) if p["heldout_accuracy"] is not None]
    if points:
        made.append(
            plots.heldout_accuracy(
                points, out_dir / "heldout_accuracy.png", f"{experiment}: held-out accuracy per evaluation", target
            )
        )
    return made
