"""The policy a training stage hands on: LoRA config from the recipe, and saving the result as a
folder any later stage (or user) loads with `from_pretrained`, the adapter merged when asked."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from regimen.stages.core.fingerprint import content_digest
from regimen.stages.decide.verdicts import OVERFITTING_VERDICT, REWARD_HACKING
from regimen.stages.training.model import TINY, resolve_base_model, tiny_spec_hash


def peft_config(recipe):
    if not recipe.peft:
        return None
    from peft import LoraConfig

    return LoraConfig(**recipe.peft)


def is_main_process(trainer) -> bool:
    """Rank 0 under `accelerate launch` (and the only process otherwise)."""
    return bool(trainer.is_world_process_zero())


def save_policy(trainer, tokenizer, out: Path, *, merge: bool = True):
    """Save the trained model (and tokenizer) to `out`; returns the model to evaluate."""
    out = Path(out)
    model = trainer.model
    unwrapped = trainer.accelerator.unwrap_model(model) if hasattr(trainer, "accelerator") else model
    if merge and hasattr(unwrapped, "merge_and_unload"):
        unwrapped = unwrapped.merge_and_unload()
        if trainer.is_world_process_zero():
            unwrapped.save_pretrained(out)
    else:
        trainer.save_model(str(out))
    if trainer.is_world_process_zero():
        tokenizer.save_pretrained(out)
    return unwrapped


def base_policy(recipe, store) -> dict:
    """The base model as an input reference: where to load it and a digest that identifies it."""
    name = recipe.model.name_or_path
    if name == TINY:
        spec = recipe.model.tiny.model_dump(exclude_defaults=False)
        if not spec.get("chat"):
            spec.pop("chat", None)  # models built before the chat template existed keep their identity
        from regimen.stages.store import files

        path = resolve_base_model(name, spec, files.ensure_dir(store.cache, store.cache / "_base"))
        return {"stage": "base", "model": path, "fingerprint": f"tiny-{tiny_spec_hash(spec)}"}
    local = Path(name).expanduser()
    if local.is_dir():  # by content: new weights of the same shape are a new base
        from regimen.stages.core.fingerprint import tree_digest

        return {"stage": "base", "model": str(local.resolve()), "fingerprint": f"local-{tree_digest(local)[:16]}"}
    # a hub id is identified by its name (pin a revision by pointing model.name_or_path at a local snapshot)
    return {
        "stage": "base",
        "model": name,
        "fingerprint": "hub-" + hashlib.sha256(json.dumps(name).encode()).hexdigest()[:16],
    }


def latest_policy(store, experiment: str, judge: str, trained_by: tuple[str, ...]) -> dict | None:
    """The newest evaluated trained policy of this experiment (for `cycle.start_from: latest`): the
    policy the `judge` stage last measured, made by one of the `trained_by` stages (the caller reads both
    from the registry), never one whose verdict suspected reward hacking (verdicts are kept beside the
    evaluations)."""
    verdicts = store.verdicts_by_eval(experiment)
    ev = next(
        (
            m
            for m in reversed(store.versions(experiment, judge))
            if verdicts.get(m["version"], {}).get("verdict") not in (REWARD_HACKING, OVERFITTING_VERDICT, None)
        ),
        None,
    )
    if not ev:
        return None
    ref = ev["inputs"]["policy"]
    if ref.get("stage") not in trained_by:
        return None
    return policy_from_ref(store, experiment, ref)


def policy_from_ref(store, experiment: str, ref: dict) -> dict | None:
    """The intact version a policy reference names (by stage and fingerprint, and content when given: a
    retrained version can share the fingerprint of a damaged one), as a fresh reference with local paths;
    None when no intact version holds it. A base-model reference is returned as it is."""
    if ref.get("stage") == "base":
        return ref
    same = [
        m
        for m in reversed(store.versions(experiment, ref["stage"]))
        if m["fingerprint"] == ref.get("fingerprint")
        and (not ref.get("content") or (m.get("content") or content_digest(m)) == ref["content"])
    ]
    manifest = next((m for m in same if not store.check(m)), None)
    if manifest is None:
        return None
    manifest = store.whole(manifest)
    path = store.local_path(manifest)
    return {
        "stage": ref["stage"],
        "version": manifest["version"],
        "fingerprint": manifest["fingerprint"],
        "path": str(path),
        "model": str(path / "model"),
        "content": content_digest(manifest),
    }
