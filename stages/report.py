"""An experiment's history from its manifests (cycles, rounds, verdicts, metrics) and its plots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from stages import plots
from stages.store import Store


def history(store: Store, experiment: str) -> list[dict[str, Any]]:
    """SFT results and GRPO evaluations in the order they were made."""
    rows = []
    for stage in ("sft", "grpo", "eval"):
        for m in store.versions(experiment, stage):
            rows.append(m)
    rows.sort(key=lambda m: m.get("finished_at", ""))
    by_fp = {m["fingerprint"]: m for m in rows if m["stage"] == "grpo"}
    out = []
    for m in rows:
        met = m.get("metrics", {})
        if m["stage"] == "sft":
            out.append({"label": f"c{m.get('cycle')} sft v{m['version']}", "stage": "sft", "cycle": m.get("cycle"), "round": 0,
                        "version": m["version"], "heldout_accuracy": met.get("heldout_accuracy"), "train_reward": None, "verdict": None})
        elif m["stage"] == "eval":
            grpo = by_fp.get(m["inputs"]["policy"]["fingerprint"], {})
            out.append({"label": f"c{m.get('cycle')}.{m.get('round')} eval v{m['version']}", "stage": "eval", "cycle": m.get("cycle"),
                        "round": m.get("round"), "version": m["version"], "heldout_accuracy": met.get("heldout_accuracy"),
                        "train_reward": met.get("train_reward"), "verdict": m.get("verdict"), "grpo_version": grpo.get("version"),
                        "kl": grpo.get("metrics", {}).get("kl_last"), "frac_reward_zero_std": grpo.get("metrics", {}).get("frac_reward_zero_std_mean")})
    return out


def make_plots(store: Store, experiment: str, target: float | None = None) -> list[Path]:
    """Regenerate `<store>/<experiment>/plots/*.png` (local stores; remote ones get a local copy)."""
    out_dir = store.cache / experiment / "plots"
    made = []
    grpo_runs = {}
    for m in store.versions(experiment, "grpo"):
        log = plots.read_log(store.local_path(m) / "train_log.jsonl")
        if log:
            grpo_runs[f"grpo v{m['version']} (c{m.get('cycle')}.{m.get('round')})"] = log
    if grpo_runs:
        made.append(plots.training_curves(grpo_runs, out_dir / "grpo_curves.png", f"{experiment}: GRPO training curves"))
    points = [p for p in history(store, experiment) if p["heldout_accuracy"] is not None]
    if points:
        made.append(plots.heldout_accuracy(points, out_dir / "heldout_accuracy.png", f"{experiment}: held-out accuracy per evaluation", target))
    return made
