"""What `regimen status` shows: per stage, its completed versions (and any damaged or malformed ones),
failed attempts, a run in progress or interrupted, and the last good Trainer checkpoint in its work folder."""

from __future__ import annotations

from typing import Any

from regimen.stages import registry
from regimen.stages.core.errors import InputError
from regimen.stages.core.fingerprint import environment
from regimen.stages.records import datasets as data_records
from regimen.stages.store import Store, check_name
from regimen.stages.store.retention import pending_versions
from regimen.stages.training.checkpoints import last_checkpoint


def experiment_status(store_url: str, experiment: str, *, check: bool = False) -> list[dict[str, Any]]:
    """Each stage's line, from its index (one read a stage, whatever the history's length) with the latest
    version's files checked. `check=True` (`regimen status --check`) reads every manifest: each version's files
    checked, malformed manifests named, and the index compared with the manifests."""
    check_name(experiment)
    store = Store(store_url)
    if not store.has_experiment(experiment):
        raise InputError(f"status: no experiment {experiment!r} in store {store_url}")

    verdicts = store.verdicts_by_eval(experiment)
    rows = [heldout_row(store, experiment)]
    leaving = pending_versions(store, experiment)
    for stage in registry.NAMES:
        versions, malformed, drift = _versions(store, experiment, stage, check)
        if not check and versions and store.manifest(experiment, stage, versions[-1]["version"]) is None:
            # the index names a version whose manifest is gone or damaged: read this stage's manifests instead
            versions, malformed, drift = _versions(store, experiment, stage, True)
        n_failed, last_fail = store.last_failure(experiment, stage)
        running = store.running_info(experiment, stage)
        damaged = _damaged(store, experiment, stage, versions, check)
        ckpts = [c for d in store.work_dirs(experiment, stage) if (c := last_checkpoint(d))]
        latest = versions[-1] if versions else None
        if running and not running.get("stale"):
            state = "running"
        elif running or (
            last_fail
            and last_fail.get("interrupted")
            and (not latest or str(last_fail.get("failed_at", "")) > str(latest.get("finished_at", "")))
        ):
            state = "interrupted"
        elif last_fail and (not latest or str(last_fail.get("failed_at", "")) > str(latest.get("finished_at", ""))):
            state = "failed"
        elif latest:
            state = "completed"
        else:
            state = "not run"
        detail = []
        if damaged:
            detail.append("DAMAGED " + ", ".join(damaged) + ": not reused; the next run repeats the stage")
        if malformed:
            detail.append("malformed manifest(s): " + ", ".join(malformed))
        if drift:
            detail.append(f"index differed from the manifests ({drift}): rebuilt")
        if gone := sorted(v for s, v in leaving if s == stage):
            detail.append(f"a stopped gc planned to remove {', '.join(f'v{v}' for v in gone)}: the next gc ends it")
        if state in ("failed", "interrupted") and last_fail:
            detail.append(str(last_fail.get("error", ""))[:160])
        if running and running.get("malformed"):
            detail.append(f"damaged running marker ({running['malformed']})")
        elif running and running.get("stale"):
            detail.append(f"interrupted run (pid {running.get('pid')} is gone, or is another process now)")
        for step, _ckpt in ckpts:
            detail.append(f"has checkpoint at step {step}")
        if stage == registry.judge() and latest and (v := verdicts.get(latest["version"])):
            detail.append(f"verdict {v.get('verdict')}")
        rows.append(
            {
                "stage": stage,
                "state": state,
                "latest": f"v{latest['version']}" if latest else "-",
                "cycle": str(latest.get("cycle", "")) if latest else "-",
                "finished": str((latest or {}).get("finished_at", "-"))[:19],
                "detail": (
                    "; ".join(detail)
                    + (f" ({len(versions)} versions, {n_failed} failed attempts)" if versions or n_failed else "")
                ).strip(),
                "damaged": damaged,
                "libraries": (latest or {}).get("libraries"),
            }
        )
    return rows


def _damaged(store: Store, experiment: str, stage: str, versions: list[dict[str, Any]], check: bool) -> list[str]:
    """Damaged versions, each with its problems: every version with --check; else the latest, and those a run found
    damaged and passed over (`Ledger.record_damaged`), checked again now (one repaired is no longer named)."""
    found = store.damaged(experiment, stage) if not check else {}
    looked = versions if check else [m for m in versions[:-1] if m["version"] in found] + versions[-1:]
    return [
        f"v{m['version']} ({'; '.join(p)}"
        + (f"; found by a run at {str(found[m['version']].get('found_at'))[:19]}" if m["version"] in found else "")
        + ")"
        for m in looked
        if (p := store.check(m))
    ]


def _versions(store: Store, experiment: str, stage: str, check: bool) -> tuple[list[dict[str, Any]], list[str], str]:
    """The stage's versions: from its index; with `check`, from the manifests (less a stopped gc's plan, which the
    index rightly leaves out), the index rebuilt if it differed, and the drift reported only when it changed."""
    if not check:
        return store.versions(experiment, stage), [], ""
    leaving = {v for s, v in pending_versions(store, experiment) if s == stage}  # a stopped gc's plan: not versions
    listed = {m["version"] for m in store.versions(experiment, stage)} - leaving  # (the next gc unlists them)
    versions, malformed = store.scan(experiment, stage)
    versions = [m for m in versions if m["version"] not in leaving]
    found = {m["version"] for m in versions}
    drift = ""
    if listed != found:
        rebuilt = {int(v) for v in store.rebuild_index(experiment, stage)["versions"]}
        if rebuilt != listed:  # "rebuilt" only when the rebuild changed what the index lists
            drift = ", ".join(
                [f"v{v} listed, not a version" for v in sorted(listed - rebuilt)]
                + [f"v{v} missing from it" for v in sorted(rebuilt - listed)]
            )
    return versions, malformed, drift


def heldout_row(store: Store, experiment: str) -> dict[str, Any]:
    """The frozen held-out set's line: its version, or why it cannot be used (runs stop until it is fixed)."""
    versions = store.versions(experiment, data_records.HELDOUT)
    latest = versions[-1] if versions else None
    why = data_records.problem(store, experiment)
    if why:
        state, detail = "DAMAGED", f"{why}; runs stop until it is fixed: {data_records.WAY_OUT}"
    elif latest:
        state = "frozen"
        detail = f"{latest.get('rows')} prompts, by {latest.get('by')}: {latest.get('reason')}"
        if latest.get("excluded_trained"):
            detail += f" ({latest['excluded_trained']} trained prompts left out)"
    else:
        state, detail = "not run", ""
    return {
        "stage": data_records.HELDOUT,
        "state": state,
        "latest": f"v{latest['version']}" if latest else "-",
        "cycle": "-",
        "finished": str((latest or {}).get("finished_at", "-"))[:19],
        "detail": detail,
        "damaged": [why] if why else [],
        "libraries": None,
    }


def libraries_line(rows: list[dict[str, Any]]) -> str | None:
    """The library versions the latest versions were made with (their manifests record them), and where
    they differ from what is installed now: those stages' code versions changed, so the next run redoes
    them."""
    recorded = next((r["libraries"] for r in reversed(rows) if isinstance(r.get("libraries"), dict)), None)
    if recorded is None:
        return None
    now = environment()
    shown = ", ".join(f"{k} {v}" for k, v in recorded.items())
    changed = [
        f"{k} {recorded[k]} -> {now.get(k)}"
        for k in recorded
        if k not in ("regimen-rl", "prefect") and now.get(k) != recorded[k]
    ]
    line = f"made with {shown}"
    if changed:
        line += f"; installed now: {', '.join(changed)} (stages that depend on them run again)"
    return line
