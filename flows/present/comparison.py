"""A sweep's comparison: one GRPO+eval per value of one recipe field, from the same SFT policy.

For `grpo.num_generations` the completions per step stay fixed (`per_device_train_batch_size` counts
completions in TRL), so prompts per step = completions / group size and every value gets the same
per-step compute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from regimen.flows.present import plots
from regimen.flows.present.fmt import num
from regimen.stages.core.errors import InputError
from regimen.stages.recipe import Recipe, apply_overrides, load_yaml, raw_of, recipe_from_dict

COLUMNS = (
    "heldout_accuracy",
    "train_reward_mean",
    "frac_reward_zero_std_mean",
    "prompts_per_step",
    "grpo_wall_s",
    "grpo_version",
)


def parse_sweep(items: list[str]) -> tuple[str, list[Any], list[str]]:
    """From `--set` items, the one with comma-separated values is the sweep; the rest are overrides."""
    swept = [
        i for i in items if "=" in i and "," in i.split("=", 1)[1] and not i.split("=", 1)[1].strip().startswith("[")
    ]
    if len(swept) != 1:
        raise InputError("sweep: give exactly one --set KEY=V1,V2,... (e.g. --set grpo.num_generations=2,8,16)")
    key, raw = swept[0].split("=", 1)
    values = [load_yaml(v.strip(), f"--set {key.strip()}", text_if_not_yaml=True) for v in raw.split(",") if v.strip()]
    return key.strip(), values, [i for i in items if i is not swept[0]]


def variant(recipe: Recipe, key: str, value: Any) -> Recipe:
    """The recipe with one field changed, resolved from what the recipe itself set (so defaults stay defaults)."""
    return recipe_from_dict(apply_overrides(raw_of(recipe), {key: value}), f"sweep {key}={value}", check_trl=True)


def comparison(
    rows: list[dict[str, Any]], key: str, out_dir: Path, logs: dict[str, list[dict[str, Any]]], note: str
) -> dict[str, Path]:
    """Write comparison.json, comparison.md and sweep.png into `out_dir`."""
    from regimen.stages.store import files

    files.write_text(
        out_dir, out_dir / "comparison.json", json.dumps({"field": key, "note": note, "rows": rows}, indent=1)
    )
    cols = [key, *COLUMNS]
    md = [f"# Sweep over `{key}`", "", note, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join(num(r.get(c)) for c in cols) + " |")
    png = plots.sweep_curves(logs, key, out_dir / "sweep.png")
    md += ["", "![sweep](sweep.png)"]
    files.write_text(out_dir, out_dir / "comparison.md", "\n".join(md) + "\n")
    return {"json": out_dir / "comparison.json", "md": out_dir / "comparison.md", "png": png}
