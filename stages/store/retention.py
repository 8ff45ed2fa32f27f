"""Retention: which versions of an experiment an operator's policy removes, and removing them safely (`regimen gc`).

The policy (`store.keep: {last: K, days: D}`, or `regimen gc --keep-last K --keep-days D`) keeps, per stage, its
last K versions and those finished within D days. Whatever the policy, these are never removed:
- `roots` the caller names with their lineage: the champion (and the evaluation that crowned it, what it was
  trained from), every earlier champion a rollback can return to and its evaluation, the policy `start_from:
  latest` would take; the lineage is every version their manifests' inputs name, transitively (read from the
  stages' indexes: no manifest is read);
- the experiment's records: every version of the frozen held-out sets and of the data versions;
- anything a running stage holds (its running marker's inputs);
- versions of another experiment (a plan is one experiment's).

Removing is ordered so that a gc killed at any point leaves a store every command still reads:
1. the plan is written (`<experiment>/gc-pending.json`): a later gc resumes it, a rebuilt index leaves it out;
2. the versions leave their stages' indexes (no lookup finds them from here on);
3. per version: its manifest first (no scan counts it again), then its files, then a tombstone
   (`v<N>/removed.json`: the number stays taken, and `status`/lineage can say it was removed);
4. the plan is removed. A bucket store's cached copies of removed versions go too.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from regimen.stages.store.backend import MANIFEST, now_iso
from regimen.stages.store.index import TOMBSTONE

PENDING = "gc-pending.json"
RECORD_STAGES = ("heldout", "data")


def refs_in(value: Any) -> list[tuple[str, int]]:
    """(stage, version) of every reference a manifest's inputs hold (nested in dicts and lists)."""
    out: list[tuple[str, int]] = []
    if isinstance(value, dict):
        if isinstance(value.get("stage"), str) and isinstance(value.get("version"), int):
            out.append((value["stage"], value["version"]))
        for v in value.values():
            if isinstance(v, (dict, list)):
                out += refs_in(v)
    elif isinstance(value, list):
        for v in value:
            out += refs_in(v)
    return out


def _finished(entry: dict[str, Any]) -> float | None:
    try:
        return datetime.fromisoformat(str(entry.get("finished_at"))).timestamp()
    except ValueError:
        return None


def plan(
    store, experiment: str, *, last: int | None, days: float | None, roots: list[tuple[str, int]]
) -> dict[str, Any]:
    """What the policy removes and what it keeps, with why: {"remove": [...], "kept": {why: [...]}, "bytes": n}."""
    stages = [s for s in stages_of(store, experiment)]
    entries = {s: {e["version"]: e for e in store.versions(experiment, s)} for s in stages}
    why: dict[tuple[str, int], str] = {}

    def protect(ref: tuple[str, int], reason: str) -> None:
        todo = [ref]
        while todo:
            stage, version = todo.pop()
            if (stage, version) in why or version not in entries.get(stage, {}):
                continue
            why[(stage, version)] = reason
            todo += refs_in(entries[stage][version].get("inputs"))

    for ref in roots:
        protect(ref, "the champion's lineage, a rollback target or the latest policy")
    for stage in stages:
        running = store.workspace.running_info(experiment, stage)
        for ref in refs_in((running or {}).get("inputs")):
            protect(ref, "held by a running stage")
    now = time.time()
    remove = []
    for stage in stages:
        ordered = sorted(entries[stage])
        for version in ordered:
            e = entries[stage][version]
            if stage in RECORD_STAGES:
                why.setdefault((stage, version), "the experiment's records (held-out sets, data versions)")
            elif last is not None and version in ordered[-last:]:
                why.setdefault((stage, version), f"among the last {last} of its stage")
            elif days is not None and (f := _finished(e)) is not None and now - f <= days * 86400:
                why.setdefault((stage, version), f"finished within {days:g} days")
            elif last is None and days is None:
                why.setdefault((stage, version), "no policy set")
            if (stage, version) not in why:
                remove.append({"stage": stage, "version": version, "bytes": int(e.get("bytes") or 0)})
    kept: dict[str, list[str]] = {}
    for (stage, version), reason in sorted(why.items()):
        kept.setdefault(reason, []).append(f"{stage}/v{version}")
    return {"experiment": experiment, "remove": remove, "kept": kept, "bytes": sum(r["bytes"] for r in remove)}


def stages_of(store, experiment: str) -> list[str]:
    out = []
    for entry in store.backend.entries(store.backend.join(experiment)):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not name.startswith(".") and name not in ("decisions", "revisions") and store.backend.fs.isdir(entry):
            out.append(name)
    return sorted(out)


def remove(store, the_plan: dict[str, Any]) -> int:
    """Carry out a plan (see the module doc for the order); the bytes it freed. Resumable: a plan left pending
    by a killed gc is carried out by the next one before anything else."""
    b = store.backend
    experiment = the_plan["experiment"]
    pending = b.join(experiment, PENDING)
    b.write_text(pending, json.dumps(the_plan, default=str))
    _step("planned")
    by_stage: dict[str, list[int]] = {}
    for r in the_plan["remove"]:
        by_stage.setdefault(r["stage"], []).append(r["version"])
    for stage, versions in by_stage.items():
        store.catalog.index.drop(experiment, stage, versions)
    _step("unindexed")
    freed = 0
    for r in the_plan["remove"]:
        freed += _remove_version(store, experiment, r["stage"], r["version"], r["bytes"])
    _rm(b, pending)
    return freed


def _remove_version(store, experiment: str, stage: str, version: int, size: int) -> int:
    b = store.backend
    base = b.version_path(experiment, stage, version)
    if _exists(b, f"{base}/{TOMBSTONE}") and not _exists(b, f"{base}/{MANIFEST}"):
        return 0  # removed already (a resumed plan)
    _rm(b, f"{base}/{MANIFEST}")
    _step("manifest")
    freed = _rm_tree_but(b, base)
    _step("files")
    b.write_text(f"{base}/{TOMBSTONE}", json.dumps({"removed_at": now_iso(), "by": "gc", "bytes": size}))
    _step("tombstone")
    if not b.local:  # this host's checked copy of it, in the cache
        for cached in (b.cache / experiment / stage / "versions").glob(f"v{version}-*"):
            shutil.rmtree(cached, ignore_errors=True)
    return freed


def _step(name: str) -> None:
    """Test hook: `REGIMEN_KILL=gc@<step>` SIGKILLs this process there (a gc killed at each of its steps)."""
    if os.environ.get("REGIMEN_KILL") == f"gc@{name}":
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def _exists(b, path: str) -> bool:
    return os.path.lexists(path) if b.local else bool(b.fs.exists(path))


def _rm(b, path: str) -> None:
    try:
        if b.local:
            if os.path.lexists(path):
                os.unlink(path)
        else:
            b.fs.rm_file(path)
    except FileNotFoundError:
        pass


def _rm_tree_but(b, base: str) -> int:
    """Remove everything under a version folder (never following a link) but a tombstone (and a bucket version's
    claim); the bytes freed."""
    freed = 0
    if b.local:
        root = Path(base)
        if not root.is_dir() or root.is_symlink():
            return 0
        for p in sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if p.name == TOMBSTONE and p.parent == root:
                continue
            if p.is_symlink() or p.is_file():
                freed += p.lstat().st_size if p.is_file() and not p.is_symlink() else 0
                p.unlink()
            elif p.is_dir():
                p.rmdir()
        return freed
    for path, info in b.fs.find(base, detail=True).items():
        if not path.endswith((f"/{TOMBSTONE}", "/.claim")):  # the claim stays: the number is taken for good
            freed += int(info.get("size") or 0)
            b.fs.rm_file(path)
    return freed


def resume_pending(store, experiment: str) -> int:
    """A plan a killed gc left, carried out (0 when there is none)."""
    found = store.backend.read_json(store.backend.join(experiment, PENDING))
    if isinstance(found, dict) and isinstance(found.get("remove"), list):
        return remove(store, found)
    return 0


def pending_versions(store, experiment: str) -> set[tuple[str, int]]:
    found = store.backend.read_json(store.backend.join(experiment, PENDING))
    if not isinstance(found, dict):
        return set()
    return {(r["stage"], r["version"]) for r in found.get("remove", []) if isinstance(r, dict)}


def roots(store, experiment: str) -> list[tuple[str, int]]:
    """What the records keep alive: the champion (its policy, what it was trained from, the evaluation that crowned
    it), every earlier champion a rollback can return to (its policy and evaluations), and the newest evaluation's
    policy (`cycle.start_from: latest`). Read from champion.json and the stages' indexes."""
    record = store.ledger.read(experiment, "champion.json")
    out: list[tuple[str, int]] = []
    evals: set[int] = set()
    if isinstance(record, dict):
        for line in [record.get("champion") or {}, *(record.get("history") or [])]:
            if not isinstance(line, dict) or line.get("event") == "kept":
                continue
            out += refs_in({k: line.get(k) for k in ("policy_ref", "trained_from")})
            if isinstance(line.get("eval_version"), int):
                evals.add(line["eval_version"])
    champions = set(out)
    for stage in stages_of(store, experiment):
        judged = [e for e in store.versions(experiment, stage) if {"policy", "heldout"} <= set(e.get("inputs") or {})]
        for e in judged:
            measured = refs_in(e["inputs"]["policy"])[:1]
            if e["version"] in evals or (measured and measured[0] in champions):
                out.append((stage, e["version"]))  # the evaluations that crowned a champion, or measured one
        if judged:
            out.append((stage, judged[-1]["version"]))  # the newest evaluation and the policy it measured
    return out


def collect(store, experiment: str, *, last: int | None, days: float | None, dry_run: bool = False) -> dict[str, Any]:
    """Resume a killed gc, plan by the policy (`roots` protected), and remove (unless `dry_run`): the plan, with
    `freed` (bytes removed now) and `resumed` (bytes a pending plan removed first)."""
    resumed = 0 if dry_run else resume_pending(store, experiment)
    the_plan = plan(store, experiment, last=last, days=days, roots=roots(store, experiment))
    the_plan["resumed"] = resumed
    the_plan["freed"] = 0 if dry_run else remove(store, the_plan)
    return the_plan
