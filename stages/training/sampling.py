"""Sampling completions from a policy with plain `generate` (dry run, evaluation, teacher traces).

GRPO's own generation happens inside TRL; this is for the stages around it, batched, with a
progress bar, for plain-text or chat prompts.
"""

from __future__ import annotations

from typing import Any


def encode_prompts(tokenizer, prompts: list[Any]) -> list[str]:
    """Chat prompts (lists of messages) go through the tokenizer's chat template; text passes as is."""
    texts = []
    for p in prompts:
        if isinstance(p, str):
            texts.append(p)
        else:
            texts.append(tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True))
    return texts


def generate(
    model,
    tokenizer,
    prompts: list[Any],
    *,
    num_return_sequences: int = 1,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    max_new_tokens: int = 16,
    batch_size: int = 256,
    desc: str = "sampling",
    seed: int | None = None,
    synced_gpus: bool = False,
    extra: dict[str, Any] | None = None,
) -> list[list[str]]:
    """For each prompt, `num_return_sequences` completions (decoded, special tokens removed)."""
    import torch
    from tqdm.auto import tqdm

    if seed is not None:
        torch.manual_seed(seed)
    texts = encode_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    out: list[list[str]] = []
    per_call = max(1, batch_size // num_return_sequences)
    kwargs: dict[str, Any] = {
        "max_new_tokens": max_new_tokens,
        "do_sample": do_sample,
        "num_return_sequences": num_return_sequences,
        "pad_token_id": tokenizer.pad_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    if synced_gpus:
        kwargs["synced_gpus"] = True
    if do_sample and extra:
        kwargs.update(extra)  # GRPO's other sampling settings (min_p, repetition_penalty, generation_kwargs)
    if do_sample:
        kwargs.update(temperature=temperature, top_p=top_p, top_k=top_k or None)
    else:
        kwargs.update(temperature=None, top_p=None, top_k=None)
    with torch.inference_mode(), tqdm(total=len(texts), desc=desc, unit="prompt", leave=False, disable=None) as bar:
        for i in range(0, len(texts), per_call):
            chunk = texts[i : i + per_call]
            enc = tokenizer(chunk, return_tensors="pt", padding=True, add_special_tokens=False).to(device)
            ids = model.generate(**enc, **kwargs)
            decoded = tokenizer.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            for j in range(len(chunk)):
                out.append(decoded[j * num_return_sequences : (j + 1) * num_return_sequences])
            bar.update(len(chunk))
    model.train(was_training)
    return out
