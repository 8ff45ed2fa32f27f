"""Stage 1b, distill: on-policy distillation with `trl.DistillationTrainer` (role `teach`, after SFT; it
runs only when the recipe has a `distill:` section).

The student samples its own completions and the teacher grades every token of them: the loss is TRL's
generalized Jensen-Shannon divergence between the two next-token distributions on the student's own
states (`distill.beta`: 0 forward KL, 0.5 JSD, 1 reverse KL). SFT imitates answers the student would not
have written; here the feedback is dense and on the states the student actually visits.

The teacher is `distill.teacher_model_name_or_path`: a model folder (identified by its content), a hub id
(by its name), or `champion:<experiment>`, the champion of another experiment in this store, resolved
once per run to a version (its stage, version, fingerprint and weights' digest enter this stage's
fingerprint and manifest). The door (`door`, at the run's preflight) refuses a missing teacher, a
`champion:` of an experiment without one, and a teacher whose tokenizer differs from the student's,
naming both: this stage uses TRL's same-vocabulary trainer (cross-tokenizer distillation is TRL's
experimental GOLD trainer, `trl.experimental.gold`, which Regimen does not offer as a stage).

Like every training stage: Trainer checkpoints in the work folder (a killed stage resumes from the last
complete one), the operator's limits, the held-out probe inside training (`training/probe.py`: its curve
in the log, the best-probing weights kept; there is no reward here, so the reward-hacking guard has
nothing to read), the held-out accuracy of the result (the cycle's baseline, as SFT's is), and
trajectories: the student's samples with the teacher's per-token log-probabilities summarised (mean
reverse KL, student and teacher mean log-probability of the sampled tokens).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from regimen.stages.core.contract import StageOutput
from regimen.stages.core.errors import InputError
from regimen.stages.recipe.trl import device_for, for_stage
from regimen.stages.tasks.registry import identity, load_task
from regimen.stages.training import trajectories
from regimen.stages.training.heldout import heldout_eval, spread
from regimen.stages.training.model import TINY, build_char_tokenizer, load_model, load_tokenizer
from regimen.stages.training.policy import base_policy, is_main_process, peft_config, save_policy
from regimen.stages.training.sampling import encode_prompts, generate

NAME = "distill"
ROLE = "teach"
TRAINS = True
KEY_METRICS = ("heldout_accuracy", "teacher_heldout_accuracy", "divergence_first", "divergence_last", "best_step")
CHAMPION = "champion:"


def applies(recipe) -> bool:
    """The stage runs only when the recipe configures it."""
    return recipe.distills()


def teacher_spec(recipe) -> str:
    return str(recipe.distill["teacher_model_name_or_path"]).strip()


def resolve_teacher(recipe) -> dict[str, Any]:
    """The teacher as {"path": what from_pretrained loads, "identity": what enters the fingerprint and the
    manifest}. Raises InputError for a champion that does not exist or a folder that is not a model."""
    spec = teacher_spec(recipe)
    if spec.startswith(CHAMPION):
        from regimen.stages.store import Store
        from regimen.stages.training.policy import policy_from_ref

        experiment = spec.removeprefix(CHAMPION)
        store = Store(recipe.store)
        record = store.read_record(experiment, "champion.json") if store.has_experiment(experiment) else None
        current = record.get("champion") if isinstance(record, dict) else None
        if not current:
            raise InputError(
                f"distill.teacher_model_name_or_path {spec!r}: experiment {experiment!r} has no champion in store "
                f"{recipe.store} (run it first, e.g. `regimen run configs/{experiment}.yaml`)"
            )
        ref = policy_from_ref(store, experiment, current["policy_ref"])
        if ref is None:
            raise InputError(
                f"distill.teacher_model_name_or_path {spec!r}: the champion {current.get('policy')} of {experiment!r} "
                f"is damaged in store {recipe.store} (its files do not match its manifest)"
            )
        return {
            "path": ref["model"],
            "identity": {
                "champion": experiment,
                "policy": current.get("policy"),
                "stage": ref["stage"],
                "version": ref["version"],
                "fingerprint": ref["fingerprint"],
                "content": ref.get("content"),
            },
        }
    local = Path(spec).expanduser()
    if local.exists():
        if not (local / "config.json").is_file():
            raise InputError(f"distill.teacher_model_name_or_path {spec!r}: not a model folder (no config.json)")
        from regimen.stages.core.fingerprint import tree_digest

        return {
            "path": str(local.resolve()),
            "identity": {"folder": str(local.resolve()), "sha256": tree_digest(local)},
        }
    if spec.startswith(("/", ".", "~")) or spec.count("/") > 1:
        raise InputError(f"distill.teacher_model_name_or_path {spec!r}: no such folder (and not a hub id)")
    return {"path": spec, "identity": {"hub": spec}}


def door(recipe) -> dict[str, Any]:
    """Checked at the run's preflight, before anything is written: the teacher resolves, and its tokenizer
    is the student's (same vocabulary and special tokens). Returns the teacher's identity."""
    teacher = resolve_teacher(recipe)
    student = _student_tokenizer(recipe)
    try:
        from regimen.stages.training.model import load_tokenizer

        theirs = load_tokenizer(teacher["path"])
    except (OSError, ValueError) as exc:
        raise InputError(
            f"distill.teacher_model_name_or_path {teacher_spec(recipe)!r}: its tokenizer does not load "
            f"({str(exc).splitlines()[0][:160]})"
        ) from None
    if student.get_vocab() != theirs.get_vocab() or student.eos_token != theirs.eos_token:
        raise InputError(
            f"distill: the teacher's tokenizer ({teacher_spec(recipe)}: {type(theirs).__name__}, {len(theirs)} tokens) "
            f"differs from the "
            f"student's ({recipe.model.name_or_path}: {type(student).__name__}, {len(student)} tokens); on-policy "
            f"distillation here "
            "compares next-token distributions over one vocabulary: use a teacher with the student's tokenizer (TRL's "
            "cross-tokenizer GOLD trainer, trl.experimental.gold, is not a Regimen stage)"
        )
    return teacher["identity"]


def _student_tokenizer(recipe):
    if recipe.model.name_or_path == TINY:
        tok = build_char_tokenizer()  # the tiny model's tokenizer, without building the model
        if recipe.model.tiny.chat:
            return load_tokenizer(_tiny_path(recipe))
        return tok
    return load_tokenizer(recipe.model.name_or_path)


def _tiny_path(recipe) -> str:
    from regimen.stages.store import Store

    return base_policy(recipe, Store(recipe.store))["model"]


def config_section(recipe) -> dict[str, Any]:
    return {
        "data": identity(recipe.data),
        "distill": {k: v for k, v in recipe.distill.items() if k != "teacher_model_name_or_path"},
        "teacher": resolve_teacher(recipe)["identity"],
        "peft": recipe.peft,
        "model": {"dtype": recipe.model.dtype, "merge_lora": recipe.model.merge_lora},
        "probe": {
            **recipe.probe.model_dump(mode="json"),
            "metric": recipe.eval.metric,
            "max_new_tokens": recipe.max_new_tokens(),
        },
        "eval": {"max_new_tokens": recipe.max_new_tokens(), "metric": recipe.eval.metric},
    }


def run(recipe, inputs: dict[str, Any], dirs) -> StageOutput:
    from datasets import Dataset
    from trl import DistillationTrainer

    from regimen.stages.training import limits, progress
    from regimen.stages.training.checkpoints import MarkComplete, train_resumable
    from regimen.stages.training.probe import HeldoutProbe, probe_rows, restore_best

    teacher = resolve_teacher(recipe)
    policy = inputs["policy"]["model"]
    task = load_task(recipe.data, inputs.get("heldout"))
    tokenizer = load_tokenizer(policy)
    model = load_model(policy, dtype=recipe.model.dtype)
    teacher_model = load_model(teacher["path"], dtype=recipe.model.dtype)
    args = for_stage(recipe, "distill", dirs.checkpoints)
    probe = HeldoutProbe(
        recipe,
        probe_rows(task.heldout, recipe.probe.prompts, recipe.data.seed),
        tokenizer,
        dirs.checkpoints,
        progress=getattr(dirs, "progress", None),
    )
    trainer = DistillationTrainer(
        model=model,
        teacher_model=teacher_model,
        args=args,
        processing_class=tokenizer,
        peft_config=peft_config(recipe),
        train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in task.train]),
        callbacks=[probe, MarkComplete(), *limits.callbacks(recipe, dirs.checkpoints)],
    )
    probe.trainer = trainer
    progress.quiet(trainer, NAME, getattr(dirs, "progress", None))
    resumed = train_resumable(trainer, dirs.checkpoints, args.max_steps)
    history = trainer.state.log_history
    losses = [h["loss"] for h in history if "loss" in h]
    metrics: dict[str, float] = {
        "steps": float(trainer.state.global_step),
        "train_loss_first": losses[0] if losses else float("nan"),
        "train_loss_last": losses[-1] if losses else float("nan"),
    }
    curve = HeldoutProbe.curve(history)
    extra: dict[str, Any] = {"resumed_from_step": resumed, "teacher": teacher["identity"], "heldout_probe": curve}
    kept, best = "last", probe.best()
    if best is not None and {"step": best["step"], "heldout_accuracy": best["heldout_accuracy"]} not in curve:
        best = None  # a best/ this run's probe curve does not vouch for is never loaded
    if recipe.probe.keep == "best" and best is not None and not probe.sharded:
        unwrapped = trainer.accelerator.unwrap_model(trainer.model)
        if best["step"] == trainer.state.global_step or restore_best(unwrapped, probe.best_dir) is not None:
            kept = "best"
            metrics.update(best_step=float(best["step"]), best_probe_accuracy=float(best["heldout_accuracy"]))
    extra["kept"] = kept
    student = save_policy(trainer, tokenizer, Path(dirs.out) / "model", merge=recipe.model.merge_lora)
    if not is_main_process(trainer):  # under accelerate launch, rank 0 measures; the others are done
        return StageOutput(metrics, extra=extra)
    shutil.rmtree(probe.best_dir, ignore_errors=True)
    # the divergence and the probe per step (the UI plots them)
    with open(Path(dirs.out) / "train_log.jsonl", "w") as fh:
        for h in history:
            fh.write(json.dumps(h) + "\n")
    _measure(student, teacher_model, tokenizer, recipe, task, history, metrics, dirs.out)
    return StageOutput(metrics, extra=extra)


def _measure(student, teacher_model, tokenizer, recipe, task, history, metrics: dict[str, float], out) -> None:
    """The distilled student's held-out accuracy beside its teacher's, graded samples (with the reverse KL
    of each), the training divergence's first and last; writes the trajectories."""
    from regimen.stages.training.probe import probe_rows

    device = device_for(recipe)
    student.to(device)
    teacher_model.to(device)
    heldout_metrics, heldout_rows = heldout_eval(
        student, tokenizer, recipe, task.heldout, desc="held-out eval (after distillation)"
    )
    metrics.update(heldout_metrics)
    metrics["teacher_heldout_accuracy"] = heldout_eval(
        teacher_model, tokenizer, recipe, task.heldout, desc="teacher's held-out accuracy"
    )[0]["heldout_accuracy"]
    rows = probe_rows(task.train, recipe.eval.trajectories, recipe.data.seed + 3)
    samples = graded_samples(student, teacher_model, tokenizer, recipe, rows)
    if samples:
        kls = [s["reverse_kl_mean"] for s in samples]
        metrics["reverse_kl_mean"] = sum(kls) / len(kls)
    first, last = _kl_curve(history)
    # the training loss: the divergence distill.beta chose (forward KL at 0), not always the reverse KL
    if first is not None:
        metrics.update(divergence_first=first, divergence_last=last)
    trajectories.write(
        out,
        [{"kind": "distill", **s} for s in samples]
        + [{"kind": "heldout", **heldout_rows[i]} for i in spread(task.heldout, recipe.eval.trajectories)],
    )


def _kl_curve(history: list[dict[str, Any]]) -> tuple[float | None, float | None]:
    """The training divergence (TRL's logged loss) at its first and last logged step."""
    losses = [h["loss"] for h in history if "loss" in h]
    return (losses[0], losses[-1]) if losses else (None, None)


def graded_samples(student, teacher, tokenizer, recipe, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The student's own samples (as training draws them: `distill.temperature`), each with the teacher's
    grading of its tokens summarised: mean reverse KL(student || teacher) over the completion's tokens, and
    the mean log-probability each model gives the tokens the student sampled."""
    import torch

    if not rows:
        return []
    prompts = [r["prompt"] for r in rows]
    temperature = float(recipe.distill.get("temperature", 1.0) or 1.0)
    completions = [
        c[0]
        for c in generate(
            student,
            tokenizer,
            prompts,
            do_sample=True,
            temperature=temperature,
            max_new_tokens=recipe.max_new_tokens(),
            seed=recipe.data.seed,
            desc="distill samples",
        )
    ]
    out = []
    device = next(student.parameters()).device
    with torch.no_grad():
        for prompt, text, completion in zip(prompts, encode_prompts(tokenizer, prompts), completions):
            p_ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids.to(device)
            c_ids = tokenizer(completion, add_special_tokens=False, return_tensors="pt").input_ids.to(device)
            if c_ids.shape[1] == 0:
                continue
            ids = torch.cat([p_ids, c_ids], dim=1)
            n = c_ids.shape[1]
            s_logp = torch.log_softmax(student(ids).logits[0, -n - 1 : -1].float() / temperature, dim=-1)
            t_logp = torch.log_softmax(teacher(ids).logits[0, -n - 1 : -1].float() / temperature, dim=-1)
            reverse_kl = (s_logp.exp() * (s_logp - t_logp)).sum(-1)
            picked = c_ids[0]
            out.append(
                {
                    "prompt": prompt,
                    "completion": completion,
                    "answer": next((r.get("answer") for r in rows if r["prompt"] == prompt), None),
                    "tokens": int(n),
                    "reverse_kl_mean": round(float(reverse_kl.mean()), 5),
                    "student_logprob_mean": round(float(s_logp[torch.arange(n), picked].mean()), 5),
                    "teacher_logprob_mean": round(float(t_logp[torch.arange(n), picked].mean()), 5),
                }
            )
    return out
