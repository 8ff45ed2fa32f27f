"""A sweep's comparison: one GRPO+eval per value of one recipe field, from the same SFT policy.

For `grpo.num_generations` the completions per step stay fixed (`per_device_train_batch_size` counts
completions in TRL), so prompts per step = completions / group size and every value gets the same
per-step compute."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from stages import plots
from stages.config import Recipe, apply_overrides, recipe_from_dict


def parse_sweep(items: list[str]) -> tuple[str, list[Any], list[str]]:
    """From `--set` items, the one with comma-separated values is the sweep; the rest are overrides."""
    import yaml

    swept = [i for i in items if "=" in i and "," in i.split("=", 1)[1] and not i.split("=", 1)[1].strip().startswith("[")]
    if len(swept) != 1:
        from stages.errors import InputError

        raise InputError("sweep: give exactly one --set KEY=V1,V2,... (e.g. --set grpo.num_generations=2,8,16)")
    key, raw = swept[0].split("=", 1)
    values = [yaml.safe_load(v.strip()) for v in raw.split(",") if v.strip()]
    return key.strip(), values, [i for i in items if i is not swept[0]]


def variant(recipe: Recipe, key: str, value: Any) -> Recipe:
    return recipe_from_dict(apply_overrides(recipe.model_dump(mode="json", exclude_none=False), {key: value}), f"sweep {key}={value}")


def comparison(rows: list[dict[str, Any]], key: str, out_dir: Path, logs: dict[str, list[dict[str, Any]]], note: str) -> dict[str, Path]:
    """Write comparison.json, comparison.md and sweep.png into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "comparison.json").write_text(json.dumps({"field": key, "note": note, "rows": rows}, indent=1))
    cols = [key, "heldout_accuracy", "train_reward_mean", "frac_reward_zero_std_mean", "prompts_per_step", "grpo_wall_s", "grpo_version"]
    md = [f"# Sweep over `{key}`", "", note, "", "| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        md.append("| " + " | ".join(f"{r[c]:.3f}" if isinstance(r.get(c), float) else str(r.get(c)) for c in cols) + " |")
    (out_dir / "comparison.md").write_text("\n".join(md) + "\n")
    png = sweep_plot(logs, key, out_dir / "sweep.png")
    return {"json": out_dir / "comparison.json", "md": out_dir / "comparison.md", "png": png}


def sweep_plot(logs: dict[str, list[dict[str, Any]]], key: str, out: Path) -> Path:
    plt = plots._plt()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, log in logs.items():
        for ax, metric in zip(axes, ("reward", "frac_reward_zero_std")):
            pts = [(h["step"], h[metric]) for h in log if metric in h and "step" in h]
            if pts:
                ax.plot(*zip(*pts), label=f"{key}={name}", linewidth=1.4)
    for ax, title in zip(axes, ("training reward", "frac_reward_zero_std (groups that teach nothing)")):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
