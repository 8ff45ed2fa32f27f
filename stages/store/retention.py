"""Retention: which versions of an experiment an operator's policy removes, and removing them safely (`regimen gc`).

The policy (`store.keep: {last: K, days: D}`, or `regimen gc --keep-last K --keep-days D`) keeps, per stage, its
last K versions and those finished within D days. Whatever the policy, these are never removed:
- `roots` the caller names with their lineage: the champion (and the evaluation that crowned it, what it was
  trained from), the earlier champions a rollback can return to (`store.keep.champions`, default 2) and their
  evaluations, the policy `start_from: latest` would take; the lineage is every version their manifests' inputs
  name, transitively, back to (not including) the measured policy (an evaluated one: an earlier night's result) its
  round started from (read from the stages' indexes: no manifest is read). Older champions go like
  anything else (their lines stay in champion.json's history; a rollback to one is refused with one line). An
  evaluation is a version of the `judge` stage, by the role its manifest records, not by the shape of its inputs;
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
    followed: set[tuple[str, int]] = set()
    measured = {
        found[0]
        for stage in stages
        for e in entries[stage].values()
        if is_evaluation(e) and (found := refs_in((e.get("inputs") or {}).get("policy")))
    }

    def protect(ref: tuple[str, int], reason: str) -> None:
        """`ref` and its lineage: what it was made from, transitively, back to the measured policy its round started
        from (an earlier night's result, kept or not by its own standing as a root): without that stop a nightly
        that trains from the champion would keep every night before it."""
        todo = [ref]
        while todo:
            stage, version = here = todo.pop()
            if here in followed or version not in entries.get(stage, {}):
                continue
            why.setdefault(here, reason)
            followed.add(here)
            todo += [r for r in refs_in(entries[stage][version].get("inputs")) if r not in measured]

    for ref in roots:
        protect(ref, "the champion's lineage, a rollback target or the latest policy")
    for stage in stages:
        running = store.running_info(experiment, stage)
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
    for entry in store._backend.entries(store._backend.join(experiment)):
        name = entry.rstrip("/").rsplit("/", 1)[-1]
        if not name.startswith(".") and name not in ("decisions", "revisions") and store._backend.fs.isdir(entry):
            out.append(name)
    return sorted(out)


def remove(store, the_plan: dict[str, Any]) -> int:
    """Carry out a plan (see the module doc for the order); the bytes it freed. Resumable: a plan left pending
    by a killed gc is carried out by the next one before anything else."""
    b = store._backend
    experiment = the_plan["experiment"]
    pending = b.join(experiment, PENDING)
    b.write_text(pending, json.dumps(the_plan, default=str))
    _step("planned")
    by_stage: dict[str, list[int]] = {}
    for r in the_plan["remove"]:
        by_stage.setdefault(r["stage"], []).append(r["version"])
    for stage, versions in by_stage.items():
        store._catalog.index.drop(experiment, stage, versions)
    _step("unindexed")
    freed = 0
    for r in the_plan["remove"]:
        freed += _remove_version(store, experiment, r["stage"], r["version"], r["bytes"])
    _rm(b, pending)
    return freed


def _remove_version(store, experiment: str, stage: str, version: int, size: int) -> int:
    b = store._backend
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
    found = store._backend.read_json(store._backend.join(experiment, PENDING))
    if isinstance(found, dict) and isinstance(found.get("remove"), list):
        return remove(store, found)
    return 0


def pending_versions(store, experiment: str) -> set[tuple[str, int]]:
    found = store._backend.read_json(store._backend.join(experiment, PENDING))
    if not isinstance(found, dict):
        return set()
    return {(r["stage"], r["version"]) for r in found.get("remove", []) if isinstance(r, dict)}


DEFAULT_CHAMPIONS = 2
"""Earlier champions a rollback can return to, unless the operator says otherwise (`store.keep.champions`)."""


def is_evaluation(entry: dict[str, Any]) -> bool:
    """An evaluation is a version of the stage whose role is `judge` (recorded in its manifest by the runner). A
    version written before the role was recorded is one when it measured a policy on a held-out set and holds no
    model: a stage that trains from a policy (a nightly SFT from the champion) writes a model, an evaluation never."""
    if "role" in entry:
        return entry.get("role") == "judge"
    return {"policy", "heldout"} <= set(entry.get("inputs") or {}) and not entry.get("has_model", True)


def champions_kept(record: Any, depth: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the champion's line and the `depth` earlier champions' newest lines, newest first; the older champions'
    lines) from champion.json. Earlier champions are the distinct policies promoted or rolled back to."""
    if not isinstance(record, dict):
        return [], []
    current = record.get("champion") if isinstance(record.get("champion"), dict) else None
    seen: list[tuple[str, Any]] = []
    kept: list[dict[str, Any]] = [current] if current else []
    if current and isinstance(current.get("policy_ref"), dict):
        seen.append(_policy_key(current["policy_ref"]))
    older: list[dict[str, Any]] = []
    for line in reversed([h for h in record.get("history") or [] if isinstance(h, dict)]):
        if line.get("event") not in ("promoted", "rolled-back") or not isinstance(line.get("policy_ref"), dict):
            continue
        key = _policy_key(line["policy_ref"])
        if key in seen:
            continue
        seen.append(key)
        (kept if len(kept) <= depth - (0 if current else 1) else older).append(line)
    return kept, older


def _policy_key(ref: dict[str, Any]) -> tuple[str, Any]:
    return (str(ref.get("stage")), ref.get("version"))


def roots(store, experiment: str, champions: int = DEFAULT_CHAMPIONS) -> list[tuple[str, int]]:
    """What the records keep alive: the champion (its policy, what it was trained from, the evaluation that crowned
    it), the `champions` earlier champions a rollback can return to (each with its evaluations), and the newest
    evaluation with the policy it measured (`cycle.start_from: latest`). Older champions are not roots: their
    lineage goes like anything else, and their history lines stay. Read from champion.json and the indexes."""
    record = store._ledger.read(experiment, "champion.json")
    lines, _older = champions_kept(record, champions)
    out: list[tuple[str, int]] = []
    crowned: set[int] = set()
    for line in lines:
        out += refs_in({k: line.get(k) for k in ("policy_ref", "trained_from")})
        if isinstance(line.get("eval_version"), int):
            crowned.add(line["eval_version"])
    kept_policies = {_policy_key(line["policy_ref"]) for line in lines if isinstance(line.get("policy_ref"), dict)}
    for stage in stages_of(store, experiment):
        evals = [e for e in store.versions(experiment, stage) if is_evaluation(e)]
        newest_of: dict[tuple[str, Any], int] = {}
        for e in evals:
            measured = refs_in(e["inputs"]["policy"])[:1]
            if measured and measured[0] in kept_policies:
                newest_of[measured[0]] = e["version"]  # what a rollback to it reads
            if e["version"] in crowned:
                out.append((stage, e["version"]))
        out += [(stage, v) for v in newest_of.values()]
        if evals:  # the newest evaluation and the policy it measured (`cycle.start_from: latest` starts there): a
            # measured policy is not followed from an evaluation's lineage, so it is a root of its own
            out.append((stage, evals[-1]["version"]))
            out += refs_in((evals[-1].get("inputs") or {}).get("policy"))[:1]
    return out


def collect(
    store,
    experiment: str,
    *,
    last: int | None,
    days: float | None,
    champions: int = DEFAULT_CHAMPIONS,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Resume a killed gc, plan by the policy (`roots` protected), and remove (unless `dry_run`): the plan, with
    `freed` (bytes removed now) and `resumed` (bytes a pending plan removed first). A dry run lists what a pending
    plan will remove too (`pending`: those entries), since the next gc carries it out before anything else."""
    if dry_run:
        the_plan = plan(store, experiment, last=last, days=days, roots=roots(store, experiment, champions))
        ahead = _pending_left(store, experiment)
        going = _keys({"remove": ahead})
        rest = [r for r in the_plan["remove"] if (r["stage"], r["version"]) not in going]
        the_plan["remove"] = [{**r, "pending": True} for r in ahead] + rest
        the_plan["bytes"] = sum(int(r.get("bytes") or 0) for r in the_plan["remove"])
        the_plan["pending"] = len(ahead)
        the_plan["kept"] = {
            why: left
            for why, kept in the_plan["kept"].items()
            if (left := [k for k in kept if k not in {f"{stage}/v{version}" for stage, version in going}])
        }
        the_plan["resumed"] = the_plan["freed"] = 0
        return the_plan
    resumed = resume_pending(store, experiment)
    the_plan = plan(store, experiment, last=last, days=days, roots=roots(store, experiment, champions))
    the_plan["resumed"] = resumed
    the_plan["freed"] = remove(store, the_plan)
    return the_plan


def _keys(the_plan: dict[str, Any]) -> set[tuple[str, int]]:
    return {(r["stage"], r["version"]) for r in the_plan["remove"]}


def _pending_left(store, experiment: str) -> list[dict[str, Any]]:
    """The entries of a pending plan (a gc killed after planning) that are not removed yet."""
    b = store._backend
    found = b.read_json(b.join(experiment, PENDING))
    if not isinstance(found, dict) or not isinstance(found.get("remove"), list):
        return []
    out = []
    for r in found["remove"]:
        if not (isinstance(r, dict) and isinstance(r.get("stage"), str) and isinstance(r.get("version"), int)):
            continue
        base = b.version_path(experiment, r["stage"], r["version"])
        if _exists(b, f"{base}/{TOMBSTONE}") and not _exists(b, f"{base}/{MANIFEST}"):
            continue  # removed already
        out.append({"stage": r["stage"], "version": r["version"], "bytes": int(r.get("bytes") or 0)})
    return out


def removed(store, experiment: str, stage: str, version: int) -> bool:
    """Whether gc removed this version (its folder holds a tombstone and no manifest)."""
    b = store._backend
    base = b.version_path(experiment, stage, version)
    return _exists(b, f"{base}/{TOMBSTONE}") and not _exists(b, f"{base}/{MANIFEST}")
