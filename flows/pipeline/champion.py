"""The champion in the flow and for a person: where a run starts from, the challenger against the champion at
the end of a run, the record in the store, its Prefect artifact and events; and a person's moves
(`regimen champion`, `promote`, `rollback`, `export`). The rule itself is `stages/decide/promotion.py`.

Events, for an operator's automations: `regimen.model.promoted` and `regimen.model.kept`, about the
resource `regimen.experiment.<name>`, with the decision's figures in the payload; `regimen.model.rollback`
and `regimen.model.promoted` (by a person) from the CLI when it talks to a Prefect server.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from regimen.stages import registry
from regimen.stages.core.errors import InputError, StoreError
from regimen.stages.decide import promotion as rule
from regimen.stages.records import datasets as data_records
from regimen.stages.rewards import from_specs, gameable_names
from regimen.stages.store import StaleRecord, Store, now_iso
from regimen.stages.store.retention import removed
from regimen.stages.training.policy import policy_from_ref

log = logging.getLogger("regimen.run")


def record(store: Store, experiment: str) -> dict[str, Any]:
    """The experiment's champion record (empty when it has none). An unreadable one stops whoever reads it:
    treating it as empty would write a fresh history over the old one."""
    return _parsed(store, experiment, store.read_record(experiment, rule.RECORD))


def _parsed(store: Store, experiment: str, found: Any) -> dict[str, Any]:
    if found is None and not store.has_record(experiment, rule.RECORD):
        return rule.empty()
    if not (isinstance(found, dict) and isinstance(found.get("history"), list)):
        raise StoreError(
            f"{store.join(experiment, rule.RECORD)}: unreadable (not the record the store wrote); restore it from a "
            f"backup or move it aside (the experiment's history is in it)"
        )
    return found


def vetoed(rec: dict[str, Any]) -> list[dict[str, Any]]:
    """The models a person rolled back from, unless a person promoted them again since."""
    out: list[dict[str, Any]] = []
    for h in rec.get("history", []):
        if h["event"] == "rolled-back" and h.get("from_ref"):
            out.append(h["from_ref"])
        elif h["event"] == "promoted" and h.get("by") == "person" and h.get("policy_ref"):
            out = [v for v in out if not rule.same_policy(v, h["policy_ref"])]
    return out


def start_policy(store: Store, experiment: str, data_digest: str | None) -> dict[str, Any] | None:
    """Where `cycle.start_from: champion` starts: the champion; or, when the champion was trained on exactly
    tonight's data, what it was trained from (the same training again: every stage is reused, and the
    challenger is the champion). None without a champion (the caller starts from the base model)."""
    current = record(store, experiment).get("champion")
    if not current:
        return None
    if current.get("data") and current.get("data") == data_digest and current.get("trained_from"):
        return current["trained_from"]
    return policy_from_ref(store, experiment, current["policy_ref"])


def correct_of(eval_path: str | Path) -> list[float | None]:
    try:
        return json.loads((Path(eval_path) / "correct.json").read_text())
    except (OSError, ValueError):
        return []


def measured(policy: dict[str, Any], ev: dict[str, Any], heldout: dict[str, Any]) -> rule.Measured:
    return rule.Measured(
        policy=policy,
        eval_version=ev["version"],
        heldout_set=heldout["version"],
        accuracy=float(ev["metrics"]["heldout_accuracy"]),
        correct=correct_of(ev["path"]),
    )


DECIDE_ATTEMPTS = 5


def conclude(
    store: Store,
    recipe,
    experiment: str,
    *,
    challenger: rule.Measured | None,
    champion_eval,
    stopped: str | None,
    trained_from: dict[str, Any] | None,
    data_digest: str | None,
) -> dict[str, Any]:
    """Decide, record, and return the history entry. `champion_eval(policy)` evaluates the current champion
    on the frozen set (a judge stage call: reused when nothing changed) and returns its summary.

    The decision is made on the record as read, and written only if the record is still that one
    (compare-and-swap on its revision, `Ledger.update`): when a person promoted or rolled back
    meanwhile, the flow decides again on the new record (their line and their veto stand), and its own
    line says how often it had to (`redone`)."""
    for attempt in range(DECIDE_ATTEMPTS):
        rec = record(store, experiment)
        decision, event = _decision(
            store, recipe, rec, challenger=challenger, champion_eval=champion_eval, stopped=stopped
        )
        line = rule.entry(
            event,
            challenger,
            by="flow",
            reason=decision.reason,
            at=now_iso(),
            extra={"figures": decision.figures, **({"redone": attempt} if attempt else {})},
        )

        def apply(current: Any, line=line, event=event) -> dict[str, Any]:
            new = _parsed(store, experiment, current)
            if event == "promoted":
                new["champion"] = rule.champion_entry(new, challenger, trained_from=trained_from, data=data_digest)
            new["history"].append(line)
            return new

        try:
            store.update_record(experiment, rule.RECORD, apply, expect=rec.get("revision", 0))
        except StaleRecord as exc:
            log.warning("champion: %s (a person's move, most likely): deciding again on the record as it is now", exc)
            continue
        log.info(
            "champion: %s — %s", "challenger promoted" if event == "promoted" else "champion kept", decision.reason
        )
        return line
    raise StoreError(
        f"{experiment}/{rule.RECORD} changed {DECIDE_ATTEMPTS} times while this run decided; nothing recorded by the "
        f"run (the people's moves stand); the next run decides again"
    )


def _decision(
    store: Store, recipe, rec: dict[str, Any], *, challenger: rule.Measured | None, champion_eval, stopped: str | None
) -> tuple[rule.Decision, str]:
    """The decision on the record `rec` as read, and its event (promoted / kept)."""
    current = rec.get("champion")
    champ = None
    if current and challenger is not None and not rule.same_policy(challenger.policy, current["policy_ref"]):
        ev = champion_eval(current["policy_ref"])
        champ = measured(current["policy_ref"], ev, {"version": challenger.heldout_set})
    elif current and challenger is not None:
        champ = challenger

    gameable = gameable_names(from_specs([s for s in recipe.rewards if s.weight > 0]))
    if challenger is None:
        also = (
            f"; it trains gameable reward(s) {', '.join(gameable)}: the flow would not promote it anyway"
            if gameable
            else ""
        )
        return rule.Decision(False, f"the run stopped ({stopped}) before a challenger was measured{also}", {}), "kept"
    decision = rule.decide(
        challenger,
        champ,
        min_gain=recipe.promote.min_gain,
        confidence=recipe.promote.confidence,
        stopped=stopped,
        gameable=gameable,
        vetoed=vetoed(rec),
    )
    if decision.promote and recipe.promote.enabled:
        return decision, "promoted"
    if decision.promote:  # promotion switched off: the decision is recorded, the champion stays
        decision = rule.Decision(False, f"{decision.reason}; not promoted: promote.enabled is false", decision.figures)
    return decision, "kept"


def policy_version(store: Store, experiment: str, spec: str) -> dict[str, Any]:
    """A person's `VERSION` argument (`grpo/v3`, `v3`, `3`: a train stage's version; `sft/v2`) as a policy reference."""
    stage, _, version = spec.rpartition("/")
    stage = stage or registry.in_role("train")[-1]
    try:
        number = int(version.removeprefix("v"))
    except ValueError:
        raise InputError(f"VERSION {spec!r}: give a version such as grpo/v3, v3 or 3") from None
    found = next((m for m in store.versions(experiment, stage) if m["version"] == number), None)
    if found is None or not (store.local_path(found) / "model").is_dir():
        raise InputError(f"VERSION {spec!r}: experiment {experiment!r} has no {stage} v{number} with a model")
    ref = policy_from_ref(store, experiment, {"stage": stage, "version": number, "fingerprint": found["fingerprint"]})
    if ref is None:
        raise StoreError(f"{stage} v{number} of {experiment!r} is damaged (its files do not match its manifest)")
    return ref


def evaluation_of(
    store: Store, experiment: str, policy: dict[str, Any], heldout: dict[str, Any]
) -> dict[str, Any] | None:
    """The newest intact evaluation of `policy` on the frozen set `heldout`, as a stage summary."""
    judge = registry.judge()
    for m in reversed(store.versions(experiment, judge)):
        ref, used = m.get("inputs", {}).get("policy", {}), m.get("inputs", {}).get("heldout", {})
        if rule.same_policy(ref, policy) and used.get("version") == heldout["version"] and not store.check(m):
            return {"version": m["version"], "metrics": m.get("metrics", {}), "path": str(store.local_path(m))}
    return None


def person_promotes(store: Store, experiment: str, spec: str, reason: str) -> dict[str, Any]:
    """`regimen promote EXP VERSION`: a person makes a policy the champion (it must have been evaluated on the frozen
    set)."""
    heldout = data_records.current(store, experiment)
    if heldout is None:
        raise InputError(f"experiment {experiment!r} has no frozen held-out set yet: run it first")
    policy = policy_version(store, experiment, spec)
    ev = evaluation_of(store, experiment, policy, heldout)
    if ev is None:
        raise InputError(
            f"{spec}: no evaluation of {policy['stage']} v{policy['version']} on held-out set v{heldout['version']}; "
            "a run evaluates the policies it trains"
        )
    m = measured(policy, ev, heldout)

    def apply(current: Any) -> dict[str, Any]:
        rec = _parsed(store, experiment, current)
        rec["champion"] = rule.champion_entry(rec, m, trained_from=None, data=None)
        rec["history"].append(
            rule.entry("promoted", m, by="person", reason=reason or "promoted by a person", at=now_iso())
        )
        return rec

    return store.update_record(experiment, rule.RECORD, apply)["history"][-1]


def person_rolls_back(store: Store, experiment: str, reason: str) -> dict[str, Any]:
    """`regimen rollback EXP`: the champion before the current one is the champion again (a person's move),
    decided and written as one step under the record lock (the champion it rolls back from is the one
    recorded at that moment, not at an earlier read)."""

    def apply(current: Any) -> dict[str, Any]:
        rec = _parsed(store, experiment, current)
        champ = rec.get("champion")
        if not champ:
            raise InputError(f"experiment {experiment!r} has no champion to roll back")
        earlier = [
            h
            for h in rec["history"]
            if h["event"] in ("promoted", "rolled-back")
            and h.get("policy_ref")
            and not rule.same_policy(h["policy_ref"], champ["policy_ref"])
        ]
        if not earlier:
            raise InputError(
                f"experiment {experiment!r}: the champion ({champ['policy']}) is the first one; there is nothing to "
                f"roll back to"
            )
        target = earlier[-1]
        ref = target["policy_ref"]
        if isinstance(ref.get("version"), int) and removed(store, experiment, str(ref["stage"]), ref["version"]):
            raise InputError(
                f"experiment {experiment!r}: {target['policy']} was removed by retention (store.keep.champions sets "
                f"how many earlier champions stay restorable); promote a version that is kept with `regimen promote`"
            )
        heldout = data_records.current(store, experiment)
        policy = policy_version(
            store, experiment, f"{target['policy_ref']['stage']}/v{target['policy_ref']['version']}"
        )
        ev = evaluation_of(store, experiment, policy, heldout) if heldout else None
        if ev is None:
            raise InputError(
                f"{target['policy']}: no evaluation on the current held-out set; promote another version with `regimen "
                f"promote`"
            )
        m = measured(policy, ev, heldout)
        rec["champion"] = rule.champion_entry(rec, m, trained_from=None, data=None)
        rec["history"].append(
            rule.entry(
                "rolled-back",
                m,
                by="person",
                reason=reason or f"rolled back from {champ['policy']}",
                at=now_iso(),
                extra={
                    "from": champ["policy"],
                    "from_ref": {k: champ["policy_ref"].get(k) for k in ("stage", "version", "fingerprint", "content")},
                },
            )
        )
        return rec

    return store.update_record(experiment, rule.RECORD, apply)["history"][-1]


def export(store: Store, experiment: str, out: str) -> Path:
    """`regimen export EXP DIR`: the champion as a plain model folder (`from_pretrained` loads it).

    Written into a fresh folder atomically: the copy is made in a private temporary folder beside the
    target and renamed into place only when complete, so a failure (a full disk, a damaged version, Ctrl-C)
    leaves nothing behind. The target must be new (or an empty folder); a link or a file there is refused."""
    target = Path(out)
    if target.is_symlink():
        raise InputError(f"{out}: is a symbolic link; export into a new folder (the link is not followed)")
    if target.exists() and not target.is_dir():
        raise InputError(f"{out}: is a file, not a folder; export into a new folder")
    if target.is_dir() and any(target.iterdir()):
        raise InputError(f"{out}: exists and is not empty; export into a new folder")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise InputError(f"{out}: its parent folder {parent} does not exist")
    current = record(store, experiment).get("champion")
    if not current:
        raise InputError(f"experiment {experiment!r} has no champion yet")
    policy = policy_version(store, experiment, f"{current['policy_ref']['stage']}/v{current['policy_ref']['version']}")
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=parent))
    try:
        shutil.copytree(policy["model"], tmp, symlinks=True, dirs_exist_ok=True)
        if any(p.is_symlink() for p in tmp.rglob("*")):
            raise StoreError(
                f"{policy['model']}: the champion's model folder holds a symbolic link; a store version holds plain "
                f"files only"
            )
        (tmp / "regimen_champion.json").write_text(
            json.dumps(
                {"experiment": experiment, **{k: v for k, v in current.items() if k != "correct"}},
                indent=1,
                default=str,
            )
        )
        tmp.chmod(0o755)
        if target.is_dir() and not target.is_symlink():
            target.rmdir()  # empty (checked above): replaced by the finished copy
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target
