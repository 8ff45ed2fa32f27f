"""PNG plots people would rather look at than read: GRPO's training curves per step and held-out
accuracy per evaluation across cycles (matplotlib, headless Agg backend)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CURVES = (("reward", "training reward"), ("reward_std", "reward std"), ("frac_reward_zero_std", "frac_reward_zero_std"), ("kl", "KL to reference"))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def read_log(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def training_curves(runs: dict[str, list[dict[str, Any]]], out: Path, title: str) -> Path:
    """One panel per curve (reward, reward_std, frac_reward_zero_std, kl), one line per run."""
    plt = _plt()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7), sharex=True)
    for ax, (key, label) in zip(axes.flat, CURVES):
        for name, log in runs.items():
            pts = [(h["step"], h[key]) for h in log if key in h and "step" in h and h[key] is not None]
            if pts:
                ax.plot(*zip(*pts), label=name, linewidth=1.4)
        ax.set_title(label)
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6))
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 0.96))
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def heldout_accuracy(points: list[dict[str, Any]], out: Path, title: str, target: float | None = None) -> Path:
    """Held-out accuracy per evaluation (SFT results and GRPO rounds), labelled by cycle.round."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    xs = list(range(len(points)))
    ax.plot(xs, [p["heldout_accuracy"] for p in points], marker="o", color="tab:blue", label="held-out accuracy")
    train = [(i, p["train_reward"]) for i, p in enumerate(points) if p.get("train_reward") is not None]
    if train:
        ax.plot(*zip(*train), marker="s", linestyle="--", color="tab:orange", label="training reward (last window)")
    if target is not None:
        ax.axhline(target, color="tab:green", linestyle=":", label=f"target {target}")
    ax.set_xticks(xs, [p["label"] for p in points], rotation=30, ha="right")
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
