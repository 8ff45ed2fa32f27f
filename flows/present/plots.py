"""PNG plots people would rather look at than read: GRPO's training curves per step (training reward,
trained and monitored rewards side by side, the held-out probe, reward std, frac_reward_zero_std, KL),
held-out accuracy per evaluation across cycles, and a sweep's curves (matplotlib's object API, no pyplot: drawn
headless, and safe off the main thread). `data_uri` turns a PNG into the `data:image/png;base64,...` form that Prefect's
markdown artifacts render."""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path
from typing import Any


def _figure(nrows: int = 1, ncols: int = 1, **kwargs):
    """A figure and its axes from matplotlib's object API (no pyplot state: plots can be drawn off the
    main thread, one figure per call), laid out once by fixed margins (tight_layout cost 0.4 s a figure)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=kwargs.pop("figsize", (9, 4.5)))
    axes = fig.subplots(nrows, ncols, squeeze=False, **kwargs)
    return fig, axes


def _save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.png")  # a fresh name: never written through a planted link
    fig.savefig(tmp, dpi=100)
    tmp.replace(out)  # rename replaces a link planted at `out`, never its target
    return out


def data_uri(png: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode()


def read_log(path: Path) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _points(log: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    return [(h["step"], h[key]) for h in log if key in h and "step" in h and h[key] is not None]


def _bands(ax, name: str, log: list[dict[str, Any]], color) -> None:
    """The curriculum's bands (`curriculum/<band>` in the log) as shares of the prompts, beside
    frac_reward_zero_std: what the sampler drew from while groups did or did not vary."""
    keys = ("easy", "normal", "hard", "set_aside")
    rows = [h for h in log if "step" in h and all(f"curriculum/{k}" in h for k in keys)]
    if not rows:
        return
    for k, style in zip(keys, (":", "-.", "--", (0, (1, 3)))):
        pts = [(h["step"], h[f"curriculum/{k}"] / max(sum(h[f"curriculum/{b}"] for b in keys), 1)) for h in rows]
        ax.plot(
            *zip(*pts), linestyle=style, color=color, alpha=0.6, linewidth=1.0, label=f"{name}: {k.replace('_', ' ')}"
        )


def _levels(ax, name: str, log: list[dict[str, Any]], color) -> None:
    """`curriculum.kind: levels`: the level over the steps (`curriculum/level`), on its own axis at the right."""
    if pts := _points(log, "curriculum/level"):
        twin = ax.twinx()
        twin.step(*zip(*pts), where="post", color=color, linestyle="-.", linewidth=1.2, label=f"{name}: level")
        twin.set_ylabel("curriculum level")
        twin.set_ylim(-0.2, max(p[1] for p in pts) + 1.2)
        twin.legend(fontsize=6, loc="upper right")


def divergence_curves(runs: dict[str, list[dict[str, Any]]], out: Path, title: str) -> Path:
    """Per run of a training without a reward (on-policy distillation): the training loss (the divergence
    between the student's and the teacher's next-token distributions on the student's samples) and the
    held-out probe."""
    fig, axes = _figure(1, 2, figsize=(12, 4.2), sharex=True)
    for name, log in runs.items():
        if pts := _points(log, "loss"):
            axes[0][0].plot(*zip(*pts), label=name, linewidth=1.4)
        if probe := _points(log, "heldout_probe"):
            axes[0][1].plot(*zip(*probe), marker="o", linestyle="--", label=name)
    axes[0][0].set_title("divergence to the teacher (training loss)")
    axes[0][1].set_title("held-out probe")
    axes[0][1].set_ylim(-0.02, 1.02)
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.subplots_adjust(left=0.06, right=0.98, top=0.85, bottom=0.14, wspace=0.18)
    return _save(fig, out)


def training_curves(runs: dict[str, list[dict[str, Any]]], out: Path, title: str) -> Path:
    """Per run: training reward with each reward's mean (monitors dashed) and the held-out probe; reward
    std; frac_reward_zero_std; KL."""
    fig, axes = _figure(2, 2, figsize=(12, 7.5), sharex=True)
    ax = axes[0][0]
    for name, log in runs.items():
        if pts := _points(log, "reward"):
            (line,) = ax.plot(*zip(*pts), label=f"{name}: training reward", linewidth=1.6)
            color = line.get_color()
            rewards = sorted({k for h in log for k in h if k.startswith("rewards/") and k.endswith("/mean")})
            for i, key in enumerate(rewards):
                if len(rewards) > 1 and (rp := _points(log, key)):
                    ax.plot(
                        *zip(*rp),
                        linestyle=[":", "-."][i % 2],
                        color=color,
                        alpha=0.7,
                        linewidth=1.1,
                        label=f"{name}: {key[8:-5]}",
                    )
            if probe := _points(log, "heldout_probe"):
                ax.plot(*zip(*probe), marker="o", linestyle="--", color=color, label=f"{name}: held-out probe")
    ax.set_title("training reward (per reward) and held-out probe")
    ax.set_ylim(-0.02, 1.02)
    for ax, (key, label) in zip(
        list(axes.flat)[1:],
        (("reward_std", "reward std"), ("frac_reward_zero_std", "frac_reward_zero_std"), ("kl", "KL to reference")),
    ):
        for name, log in runs.items():
            if pts := _points(log, key):
                (line,) = ax.plot(*zip(*pts), label=name, linewidth=1.4)
                if key == "frac_reward_zero_std":
                    _bands(ax, name, log, line.get_color())
                    _levels(ax, name, log, line.get_color())
        ax.set_title(
            label
            if key != "frac_reward_zero_std" or not ax.get_legend_handles_labels()[0][1:]
            else "frac_reward_zero_std and the curriculum's bands (share of prompts)"
        )
        if key == "frac_reward_zero_std" and ax.get_legend_handles_labels()[0][1:]:
            ax.legend(fontsize=6, loc="best")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("GRPO step")
    if axes[0][0].get_legend_handles_labels()[0]:  # a run logged before its first reward has nothing to label yet
        axes[0][0].legend(fontsize=7, loc="best")
    fig.suptitle(title)
    fig.subplots_adjust(left=0.06, right=0.97, bottom=0.08, top=0.9, wspace=0.28, hspace=0.2)
    return _save(fig, out)


def heldout_accuracy(points: list[dict[str, Any]], out: Path, title: str, target: float | None = None) -> Path:
    """Held-out accuracy per evaluation (SFT results and GRPO rounds), labelled by cycle.round."""
    fig, axes = _figure(figsize=(9, 4.5))
    ax = axes[0][0]
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
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.25, top=0.9)
    return _save(fig, out)


def sweep_curves(logs: dict[str, list[dict[str, Any]]], key: str, out: Path) -> Path:
    """A sweep: training reward and frac_reward_zero_std per step, one line per value."""
    fig, grid = _figure(1, 2, figsize=(12, 4.5))
    axes = grid[0]
    for name, log in logs.items():
        for ax, metric in zip(axes, ("reward", "frac_reward_zero_std")):
            if pts := _points(log, metric):
                ax.plot(*zip(*pts), label=f"{key}={name}", linewidth=1.4)
    for ax, title in zip(axes, ("training reward", "frac_reward_zero_std (groups that teach nothing)")):
        ax.set_title(title)
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.12, top=0.9, wspace=0.15)
    return _save(fig, out)
