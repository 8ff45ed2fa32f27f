"""The GPU check, in one script: the pipeline on a real-shaped model on one GPU, in four settings, with
each stage's device, wall time, peak GPU memory and completions/s.

    python bench/gpu_check.py [--out DIR] [--quick]      (default DIR: a fresh temp folder, printed)

Settings (each a full `regimen run`: dry run -> smoke -> GRPO -> eval, no SFT, then one with SFT):
  bf16            the real-shaped Qwen3 model (built here, ~25M parameters) in bfloat16
  lora            the same with a `peft:` LoRA adapter (merged into the saved policy)
  vllm            `grpo.use_vllm: true, vllm_mode: colocate` (skipped, and said so, where vLLM is not installed)
  accelerate      `launcher: accelerate` with one process (the subprocess path a multi-GPU machine takes)
  code-env        `configs/gpu/code-env.yaml`: GRPO over the code environment (sandboxed `run_tests` tool) on a
                  Qwen3-shaped model with Qwen3's chat template (`--no-env` skips it)
It prints one table and writes `gpu_check.json` into --out. It exits non-zero if any stage generated on
the CPU while a GPU was present (the device each stage recorded in its manifest). Meant to finish in
under 10 minutes on one GPU; `--quick` shrinks the steps for a smoke test of the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def dataset(out: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(0)
    pairs = sorted({(rng.randint(0, 99), rng.randint(0, 99)) for _ in range(3000)})[:2000]
    path = out / "addition.parquet"
    pq.write_table(
        pa.table({"question": [f"What is {a}+{b}?" for a, b in pairs], "answer": [str(a + b) for a, b in pairs]}), path
    )
    return path


def recipe(out: Path, model: Path, data: Path, quick: bool) -> Path:
    steps = 8 if quick else 200
    text = f"""
experiment: gpu-check
model: {{name_or_path: {model}, dtype: bfloat16}}
data: {{task: hf, path: parquet, data_files: {data}, heldout_fraction: 0.1,
       columns: {{prompt: question, answer: answer}},
       system_prompt: "Answer with the number only."}}
teacher: {{kind: none}}
rewards:
  - {{name: answer, weight: 1.0}}
  - {{name: format, weight: 0.2, pattern: '\\d+'}}
sft: {{max_steps: {steps}, per_device_train_batch_size: 32, learning_rate: 1.0e-3, bf16: true,
      gradient_checkpointing: false}}
dry_run: {{num_prompts: 64, min_mean_reward: 0.0, max_mean_reward: 1.0, max_frac_zero_std: 1.0}}
smoke: {{max_steps: 2}}
grpo: {{max_steps: {steps}, per_device_train_batch_size: 64, num_generations: 8, learning_rate: 1.0e-4,
       max_completion_length: 16,
       bf16: true, gradient_checkpointing: false, logging_steps: 10, save_steps: 100}}
probe: {{steps: {max(2, steps // 4)}, prompts: 64}}
eval: {{batch_size: 128}}
"""
    path = out / "gpu-check.yaml"
    path.write_text(text)
    return path


SETTINGS = {
    "bf16": [],
    "lora": ["peft={r: 16, lora_alpha: 32, target_modules: all-linear}"],
    "vllm": ["grpo.use_vllm=true", "grpo.vllm_mode=colocate", "grpo.vllm_gpu_memory_utilization=0.3"],
    "accelerate": ["launcher=accelerate", "accelerate.num_processes=1"],
    "with-sft": ["teacher.kind=oracle"],
}


def code_env(out: Path, quick: bool, cpu_while_gpu: list[str], gpu: bool) -> list[dict]:
    """`configs/gpu/code-env.yaml` (the code environment, its sandboxed `run_tests` tool, GRPO through TRL's
    environment_factory) on a locally built Qwen3-shaped model carrying Qwen3's own chat template, so TRL
    parses its tool calls as it would the hub model's. Its answers are noise (random weights): the gates'
    band is opened so every stage runs; what this checks is that episodes train and generate on the GPU."""
    from trl.chat_template_utils import qwen3_chat_template

    from regimen.stages.training.model import build_real_shaped_model

    model = build_real_shaped_model(
        out / "model-qwen3-tools", arch="qwen3", hidden_size=256, num_layers=4, chat_template=qwen3_chat_template
    )
    store = out / "store-code-env"
    steps = 4 if quick else 40
    cmd = [
        sys.executable,
        "-m",
        "regimen.flows.cli",
        "run",
        "configs/gpu/code-env.yaml",
        "--store",
        str(store),
        "--experiment",
        "code-env",
    ]
    for s in (
        f"model.name_or_path={model}",
        "peft=null",
        "dry_run.min_mean_reward=0",
        "dry_run.max_frac_zero_std=1.0",
        f"grpo.max_steps={steps}",
        "grpo.max_completion_length=256",
        "eval.max_new_tokens=128",
        "probe.steps=0",
        "grpo.per_device_train_batch_size=8",
        "grpo.num_generations=4",
    ):
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(
        cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "REGIMEN_MACHINE_SLOTS": "0"}
    )
    print(f"[code-env] exit {proc.returncode} in {time.perf_counter() - t0:.0f}s", flush=True)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], flush=True)
    rows = []
    for manifest in sorted(store.glob("code-env/*/v*/manifest.json")):
        m = json.loads(manifest.read_text())
        met = m.get("metrics", {})
        rows.append(
            {
                "setting": "code-env",
                "stage": m["stage"],
                "version": m["version"],
                "device": m.get("device"),
                "wall_s": m.get("wall_s"),
                "peak_gpu_mib": m.get("peak_gpu_memory_mib"),
                "completions_per_s": met.get("completions_per_s"),
                "heldout_accuracy": met.get("heldout_accuracy"),
            }
        )
        if gpu and str(m.get("device", "")).startswith("cpu"):
            cpu_while_gpu.append(f"code-env/{m['stage']}")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None, help="where models, data and runs go (default: a fresh temp folder)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-env", action="store_true", help="skip the code-env setting (configs/gpu/code-env.yaml)")
    args = ap.parse_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="regimen-gpu-check-"))
    print(f"gpu check: writing under {out}")
    out.mkdir(parents=True, exist_ok=True)
    import torch

    gpu = torch.cuda.is_available()
    print(
        f"torch {torch.__version__}, cuda available: {gpu}" + (f" ({torch.cuda.get_device_name(0)})" if gpu else ""),
        flush=True,
    )
    from regimen.stages.training.model import build_real_shaped_model

    model = build_real_shaped_model(out / "model-qwen3", arch="qwen3", hidden_size=512, num_layers=8)
    data = dataset(out)
    path = recipe(out, model, data, args.quick)
    try:
        import vllm  # noqa: F401

        have_vllm = True
    except ImportError:
        have_vllm = False
    rows, cpu_while_gpu = [], []
    for name, sets in SETTINGS.items():
        if name == "vllm" and not have_vllm:
            print(f"[{name}] skipped: vLLM is not installed here", flush=True)
            continue
        store = out / f"store-{name}"
        cmd = [sys.executable, "-m", "regimen.flows.cli", "run", str(path), "--store", str(store), "--experiment", name]
        for s in sets:
            cmd += ["--set", s]
        t0 = time.perf_counter()
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env={**os.environ, "REGIMEN_MACHINE_SLOTS": "0"}
        )
        wall = time.perf_counter() - t0
        print(f"[{name}] exit {proc.returncode} in {wall:.0f}s", flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], flush=True)
        for manifest in sorted(store.glob(f"{name}/*/v*/manifest.json")):
            m = json.loads(manifest.read_text())
            met = m.get("metrics", {})
            row = {
                "setting": name,
                "stage": m["stage"],
                "version": m["version"],
                "device": m.get("device"),
                "wall_s": m.get("wall_s"),
                "peak_gpu_mib": m.get("peak_gpu_memory_mib"),
                "completions_per_s": met.get("completions_per_s"),
                "heldout_accuracy": met.get("heldout_accuracy"),
            }
            rows.append(row)
            if gpu and str(m.get("device", "")).startswith("cpu"):
                cpu_while_gpu.append(f"{name}/{m['stage']}")
    if not args.no_env:
        rows += code_env(out, args.quick, cpu_while_gpu, gpu)
    print(
        f"\n{'setting':<11} {'stage':<15} {'device':<24} {'wall s':>8} {'peak GPU MiB':>13} {'compl/s':>9} "
        f"{'held-out':>9}"
    )
    for r in rows:
        f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) else "-"  # noqa: E731
        print(
            f"{r['setting']:<11} {r['stage']:<15} {str(r['device']):<24} {f(r['wall_s'], '8.1f')} "
            f"{f(r['peak_gpu_mib'], '13.0f')} {f(r['completions_per_s'], '9.1f')} {f(r['heldout_accuracy'], '9.3f')}"
        )
    (out / "gpu_check.json").write_text(json.dumps(rows, indent=1))
    if cpu_while_gpu:
        print(f"\nFAIL: these stages ran on the CPU although a GPU is present: {', '.join(cpu_while_gpu)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
