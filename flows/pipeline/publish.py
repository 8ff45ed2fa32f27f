"""Prefect artifacts from stage outputs: a metrics table, a sample of trajectories, a link to the folder,
the cycle's verdict, and the plots, shown *in* the UI (markdown artifacts with the PNG as a
`data:image/png;base64,...` image; a `file://` link is something the UI cannot open).
Keys are `<experiment>-<stage>`, so versions accumulate in the UI.

Publishing is off the training's critical path (`Presenter`): plots and API calls run on one background
thread while the next stage computes, a live probe plot asked for while the previous one is still being
drawn replaces it (the latest wins), and a run waits for what is still queued only when it ends. A plot or
an artifact that fails (the Prefect server is away, a full disk) is a warning, never the run's failure.
"""

from __future__ import annotations

import contextvars
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from regimen.flows.present import plots
from regimen.flows.present import trajectories as present
from regimen.flows.present.fmt import cell, rounded
from regimen.flows.present.report import history, make_plots
from regimen.flows.serving import orchestrator
from regimen.stages import registry
from regimen.stages.rewards.audit import summary
from regimen.stages.run.runner import StageResult
from regimen.stages.training import trajectories

log = logging.getLogger("regimen.publish")


class Presenter:
    """One background thread for a run's plots and artifacts (see the module doc)."""

    def __init__(self) -> None:
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="regimen-publish")
        self.pending: list[Future] = []
        self.latest: dict[str, tuple[Callable[..., Any], tuple, dict]] = {}
        self.lock = threading.Lock()
        self.closed = False

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run `fn` on the publishing thread, in the caller's context (Prefect's run context: artifacts are
        linked to the flow and task run that asked for them)."""
        ctx = contextvars.copy_context()
        with self.lock:
            self.pending = [f for f in self.pending if not f.done()]
            self.pending.append(self.pool.submit(ctx.run, self._guarded, fn, args, kwargs))

    def submit_latest(self, slot: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Like `submit`, but while a job of this `slot` waits, a newer one replaces its arguments."""
        with self.lock:
            queued = slot in self.latest
            self.latest[slot] = (fn, args, kwargs)
        if not queued:
            self.submit(self._run_latest, slot)

    def _run_latest(self, slot: str) -> None:
        with self.lock:
            fn, args, kwargs = self.latest.pop(slot)
        fn(*args, **kwargs)

    @staticmethod
    def _guarded(fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
        if orchestrator.down():  # nobody to publish to: the store keeps the results, the warning was said once
            return
        try:
            fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - presentation never fails a run
            if orchestrator.down():
                return  # said once, by the orchestrator's watch
            log.warning(
                "could not publish %s: %s",
                getattr(fn, "__name__", "an artifact"),
                str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__,
            )

    def close(self, patience: float | None = None) -> None:
        """Wait for what is queued, then stop the thread. Not while Prefect's API is down (what is queued is
        dropped; a call stuck in the client's retries is left to the exit), and not past `patience`
        seconds when given (an interrupted run: the person asked to stop)."""
        if self.closed:
            return
        self.closed = True
        self.pool.shutdown(wait=False)
        deadline = None if patience is None else time.monotonic() + patience
        while True:
            with self.lock:
                pending = [f for f in self.pending if not f.done()]
            if not pending:
                return
            if orchestrator.down() or (deadline is not None and time.monotonic() > deadline):
                break
            done, _ = wait(pending, timeout=2.0)
            if not done and not orchestrator.answers(timeout=2.0):  # stuck in the client's retries: the API is gone
                orchestrator.mark_down()
                break
        for f in pending:
            f.cancel()
        if left := sum(not f.done() for f in pending):
            log.warning("%d artifact(s) for Prefect's UI left unpublished (the store has the results)", left)


def artifact_key(*parts: str) -> str:
    """Prefect keys allow lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def trajectories_markdown(path: Path, title: str, limit: int = 12) -> str:
    rows = trajectories.read(path, limit=limit) if (path / trajectories.FILE).exists() else []
    if not rows:
        return f"### {title}\n\n(no trajectories)"
    names = sorted({k for r in rows for k in (r.get("rewards") or {})})
    head = "| prompt | completion | " + " | ".join(names) + " |\n|" + "---|" * (2 + len(names))
    lines = [
        f"| {cell(r.get('rendered_prompt') or r.get('prompt'))} | "
        f"{cell(turns_text(r['episode']) if r.get('episode') else r.get('completion'))} | "
        + " | ".join(cell(rounded((r.get("rewards") or {}).get(n))) for n in names)
        + " |"
        for r in rows
    ]
    return f"### {title}\n\n{head}\n" + "\n".join(lines)


def audit_markdown(report: dict[str, Any], title: str) -> str:
    """The reward audit as markdown: what it searched, then each finding with its witness (escaped, in a code span)."""
    lines = [f"### {title}", ""]
    for line in summary(report):
        lines.append(f"- {cell(line.strip(), width=600)}")
    return "\n".join(lines) + "\n"


def turns_text(episode: dict) -> str:
    """An episode's turns on one line: each tool call with its arguments, what it returned, the answer."""
    parts = []
    for t in episode.get("turns", []):
        if "call" in t:
            args = (
                ", ".join(f"{k}={v!r}" for k, v in (t.get("arguments") or {}).items())
                if isinstance(t.get("arguments"), dict)
                else t.get("arguments")
            )
            parts.append(f"{t['call']}({args})")
        elif "result" in t:
            parts.append(f"→ {t['result']}")
        elif "say" in t:
            parts.append(f"says {t['say']!r}")
    failure = (episode.get("episode") or {}).get("failure")
    return " ".join(parts) + (f" [ended: {failure}]" if failure else "")


def publish(result: StageResult, store) -> None:
    """Artifacts for one stage result (also for reused ones: the UI shows what this run used)."""
    m = result.manifest
    base = artifact_key(m["experiment"], m["stage"])
    state = "reused" if result.reused else "ran"
    table = [{"metric": k, "value": rounded(v)} for k, v in sorted(m.get("metrics", {}).items())]
    table += [{"metric": "version", "value": m["version"]}, {"metric": "cycle", "value": m.get("cycle")}]
    create_table_artifact(
        table=table, key=base, description=f"{m['stage']} v{m['version']} ({state}), cycle {m.get('cycle')}: metrics"
    )
    create_markdown_artifact(
        markdown=trajectories_markdown(result.path, f"{m['stage']} v{m['version']}: sample trajectories"),
        key=artifact_key(base, "trajectories"),
        description=f"what the model wrote in {m['stage']} v{m['version']}",
    )
    create_link_artifact(
        link=result.path.resolve().as_uri() if result.path.is_absolute() else str(result.path),
        link_text=f"{m['stage']}/v{m['version']}",
        key=artifact_key(base, "folder"),
        description="the version folder (manifest.json, metrics.json, trajectories.jsonl)",
    )
    report = m.get("reward_audit")
    if isinstance(report, dict) and not report.get("skipped"):  # the dry run's audit: findings with their witnesses
        create_markdown_artifact(
            markdown=audit_markdown(report, f"{m['stage']} v{m['version']}: the reward audit"),
            key=artifact_key(base, "reward-audit"),
            description=f"{m['stage']} v{m['version']}: what the reward audit searched and found",
        )
    if m["stage"] == registry.judge() and not result.reused:  # what this evaluation changed against the one before
        publish_changes(store, m)
    if registry.trains(m["stage"]) and (result.path / "train_log.jsonl").exists():
        name = f"{m['stage']} v{m['version']}"
        log = trajectories.read(result.path / "train_log.jsonl")
        # GRPO's curves; a training without a reward (distillation) shows its divergence
        rewarded = any("reward" in h for h in log)
        publish_curves(
            m["experiment"],
            {name: log},
            store.experiment_dir(m["experiment"], "plots") / f"{m['stage']}_v{m['version']}.png",
            f"{name}: training and held-out probe",
            kind="training" if rewarded else "divergence",
        )


def publish_changes(store, m: dict[str, Any]) -> None:
    """After an evaluation: the page of every held-out row against the evaluation before (the experiment's `pages`
    folder) and, in the UI, its counts, flags and first flips as markdown (a browser will not follow a `file://`
    link from the UI's http page, so the tables themselves travel, with the page's path and the command)."""
    v = present.view(store, m["experiment"], m["stage"], m["version"])
    page = present.write_page(v, store.experiment_dir(m["experiment"], "pages") / f"{m['stage']}_v{m['version']}.html")
    create_markdown_artifact(
        markdown=present.markdown(v, str(page.resolve())),
        key=artifact_key(m["experiment"], m["stage"], "changes"),
        description=f"{m['stage']} v{m['version']}: the prompts that flipped, and what looks like a hack",
    )


def publish_curves(
    experiment: str,
    runs: dict[str, list[dict[str, Any]]],
    png: Path,
    title: str,
    key: str = "curves",
    kind: str = "training",
) -> None:
    """The training curves (with the held-out probe) as an image the UI shows."""
    try:
        (plots.training_curves if kind == "training" else plots.divergence_curves)(runs, png, title)
    except OSError:
        return
    create_markdown_artifact(
        markdown=f"### {title}\n\n![{title}]({plots.data_uri(png)})",
        key=artifact_key(experiment, key),
        description=title,
    )


def publish_trackers(experiment: str, group: str, links: list[str]) -> None:
    """Where this run is in the trackers (`tracking:`): the run group and a link or command per tracker."""
    lines = "\n".join(f"- {link}" for link in links)
    create_markdown_artifact(
        markdown=f"### Trackers: run group `{group}`\n\n{lines}\n",
        key=artifact_key(experiment, "trackers"),
        description=f"{experiment}: this run in the trackers",
    )


def champion_table(record: dict[str, Any], gone: set[str] | frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """The champion history as rows, newest first (the current champion's line is marked; a policy in `gone`,
    removed by retention, says so)."""
    current = (record.get("champion") or {}).get("policy")
    rows = []
    for h in reversed(record.get("history", [])):
        figures = h.get("figures") or {}
        champ = figures.get("champion") or {}
        policy = h.get("policy", "-")
        rows.append(
            {
                "when": str(h.get("at", ""))[:19],
                "event": h["event"],
                "by": h.get("by"),
                "policy": f"{policy} (removed by gc)" if policy in gone else policy,
                "held-out": rounded(h.get("heldout_accuracy")),
                "interval 95%": h.get("interval_95"),
                "champion then": f"{champ.get('policy')} {rounded(champ.get('heldout_accuracy'))}" if champ else "-",
                "held-out set": h.get("heldout_set"),
                "reason": h.get("reason"),
            }
        )
    if rows and current:
        rows[0]["current champion"] = current
    return rows


def publish_champion(experiment: str, record: dict[str, Any], line: dict[str, Any]) -> None:
    """The champion's history as a table artifact with a stable key (the UI's artifact history is the
    champion history), and the event `regimen.model.promoted` or `regimen.model.kept` with the figures."""
    current = record.get("champion") or {}
    create_table_artifact(
        table=champion_table(record),
        key=artifact_key(experiment, "champion"),
        description=f"{experiment}: champion {current.get('policy', 'none')} "
        f"(held-out {rounded(current.get('heldout_accuracy'))} on set v{current.get('heldout_set')}); {line['event']}: "
        f"{line['reason']}",
    )
    emit_event(
        event=f"regimen.model.{line['event']}",
        resource={"prefect.resource.id": f"regimen.experiment.{experiment}", "prefect.resource.name": experiment},
        payload={
            "experiment": experiment,
            "champion": current.get("policy"),
            "champion_heldout_accuracy": current.get("heldout_accuracy"),
            "challenger": line.get("policy"),
            "challenger_heldout_accuracy": line.get("heldout_accuracy"),
            "reason": line["reason"],
            "figures": line.get("figures", {}),
        },
    )


def publish_verdict(experiment: str, record: dict[str, Any], eval_path: str) -> None:
    md = f"### Verdict: `{record['verdict']}`\n\n{record['reason']}\n"
    if record.get("warning"):
        md += f"\n**Warning:** {record['warning']}\n"
    if record.get("evidence"):
        md += "\n| evidence | value |\n|---|---|\n" + "\n".join(
            f"| {k} | {cell(rounded(v))} |" for k, v in record["evidence"].items()
        )
    if record["verdict"] == "reward-hacking-suspected":
        md += "\n\n" + hacked_trajectories_markdown(Path(eval_path))
        md += (
            f"\n\nEvery held-out row, flagged, beside the evaluation before: `regimen trajectories {experiment}` "
            f"(the page is in the experiment's `pages` folder; the `{experiment}-eval-changes` artifact has its counts)"
        )
    create_markdown_artifact(
        markdown=md,
        key=artifact_key(experiment, "verdict"),
        description=f"cycle {record.get('cycle')} round {record.get('round')}",
    )


def publish_stopped(experiment: str, stage: str, reason: str, attempt: str | None) -> None:
    """A stage that stopped the flow (a gate, or the guard during GRPO): its reason and what it saw."""
    md = f"### Stopped at `{stage}`\n\n{reason}\n"
    if attempt and stage in registry.in_role("train"):
        md += "\n\n" + hacked_trajectories_markdown(Path(attempt), training=True)
    create_markdown_artifact(
        markdown=md, key=artifact_key(experiment, "verdict"), description=f"{stage} stopped the flow"
    )


def hacked_trajectories_markdown(path: Path, limit: int = 12, training: bool = False) -> str:
    """Samples the trained rewards scored high although they are wrong: what the policy learnt to game."""
    if not (path / trajectories.FILE).exists():
        return "(no trajectories)"
    rows = trajectories.read(path)
    if training:
        rows = [
            r
            for r in rows
            if max([v for v in (r.get("rewards") or {}).values() if v is not None], default=0) >= 0.5
            and any(v == 0 for v in (r.get("rewards") or {}).values())
        ]
    else:
        rows = [
            r
            for r in rows
            if not r.get("correct")
            and max([v for v in (r.get("rewards") or {}).values() if v is not None], default=0) >= 0.5
        ]
    if not rows:
        return "(no sample scored high while wrong)"
    names = sorted({k for r in rows for k in r.get("rewards", {})})
    head = "| prompt | completion | reference | " + " | ".join(names) + " |\n|" + "---|" * (3 + len(names))
    lines = [
        f"| {cell(r.get('prompt'))} | {cell(r.get('completion'))} | {cell(r.get('answer'))} | "
        + " | ".join(cell(rounded(r["rewards"].get(n))) for n in names)
        + " |"
        for r in rows[:limit]
    ]
    where = "training samples (a trained reward high, a monitor at 0)" if training else "held-out samples"
    return f"### High reward, wrong answer ({len(rows)} {where})\n\n{head}\n" + "\n".join(lines)


def publish_report(store, recipe, experiment: str) -> None:
    """Regenerate the experiment's plots and show them (and the history table) in Prefect."""
    for png in make_plots(store, experiment, recipe.cycle.target):
        title = f"{experiment}: {png.stem.replace('_', ' ')}"
        create_markdown_artifact(
            markdown=f"### {title}\n\n![{png.stem}]({plots.data_uri(png)})",
            key=artifact_key(experiment, "plot", png.stem),
            description=title,
        )
    rows = [
        {
            k: rounded(v)
            for k, v in r.items()
            if k in ("label", "heldout_accuracy", "train_reward", "verdict", "kl", "frac_reward_zero_std", "best_step")
        }
        for r in history(store, experiment)
    ]
    if rows:
        create_table_artifact(
            table=rows, key=artifact_key(experiment, "history"), description=f"{experiment}: evaluations across cycles"
        )
