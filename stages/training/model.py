"""Model and tokenizer loading: a hub id or local folder like any TRL user, or the embedded tiny model.

The embedded default cannot download anything, so it builds a character-level tokenizer and a tiny
Llama from a spec, saves both with `save_pretrained` into a folder keyed by the spec's hash, and from
then on every stage loads it by path exactly as it would load a real model.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import string
import uuid
from pathlib import Path
from typing import Any

from regimen.stages.core.errors import StoreError
from regimen.stages.core.fingerprint import file_digest
from regimen.stages.recipe.trl import device_for

TINY = "tiny"  # model.name_or_path value that selects the embedded model
SPECIAL_TOKENS = {"pad": "<pad>", "eos": "</s>", "bos": "<s>", "unk": "<unk>"}
CHARSET = string.digits + string.ascii_letters + string.punctuation + " \n"


# The embedded model's chat template, when its spec asks for one (`model.tiny.chat`, for environments):
# compact, because every character is a token: `U:` a user turn, `A:` an assistant turn (its text, then
# each tool call as `<c>{json}</c>`, then the end-of-sequence token), `T:` a tool's result. Assistant turns
# are marked for `assistant_only_loss`. Tool descriptions are not rendered: the tiny model learns its
# tools from the teacher's traces. `TOOL_RESPONSE` is the matching parser (transformers' response
# templates, as TRL's `add_response_schema` sets for known models).
TOOL_CHAT_TEMPLATE = (
    "{%- for m in messages -%}{%- if m['role'] == 'system' -%}S:{{ m['content'] }}"
    "{%- elif m['role'] == 'user' -%}U:{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' -%}A:{% generation %}{{ m['content'] or '' }}"
    "{%- for tc in m.get('tool_calls') or [] -%}<c>{{ tc['function'] | tojson }}</c>{%- endfor -%}</s>{% endgeneration "
    "%}{%- elif m['role'] == 'tool' -%}T:{{ m['content'] }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}A:{%- endif -%}"
)
TOOL_RESPONSE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "A:",
    "fields": {
        "tool_calls": {
            "open": "<c>",
            "close_pattern": r"</c>",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"</s>\s*", "content": "text"},
    },
}


def tiny_spec_hash(spec: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def build_char_tokenizer():
    """One token per character (WordLevel over single characters), left padding for generation."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS.values())}
    for ch in CHARSET:
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=SPECIAL_TOKENS["unk"]))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=SPECIAL_TOKENS["pad"],
        eos_token=SPECIAL_TOKENS["eos"],
        bos_token=SPECIAL_TOKENS["bos"],
        unk_token=SPECIAL_TOKENS["unk"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return fast


def build_tiny_model(spec: dict[str, Any], out_dir: Path) -> Path:
    """Build the tiny Llama + char tokenizer from `spec` into `out_dir` (atomically)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    if out_dir.is_symlink() or (out_dir / "config.json").exists():
        return check_built(out_dir)
    tokenizer = build_char_tokenizer()
    if spec.get("chat"):
        tokenizer.chat_template = TOOL_CHAT_TEMPLATE
    torch.manual_seed(int(spec.get("seed", 0)))
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["intermediate_size"],
        num_hidden_layers=spec["num_hidden_layers"],
        num_attention_heads=spec["num_attention_heads"],
        num_key_value_heads=spec["num_attention_heads"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    model = LlamaForCausalLM(config)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    staging = out_dir.parent / f".{out_dir.name}.{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        try:
            model.save_pretrained(staging)
            tokenizer.save_pretrained(staging)
            (staging / "regimen_tiny_spec.json").write_text(json.dumps(spec, sort_keys=True, indent=1))
            (staging / DIGEST).write_text(json.dumps({"files": _file_digests(staging)}, indent=1))
        except Exception as exc:  # safetensors reports a full disk as its own error, without the path
            free = shutil.disk_usage(out_dir.parent).free
            from regimen.stages.core.errors import StoreError

            raise StoreError(
                f"could not write the base model to {staging}: "
                f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
                + (
                    f" (no space left on the device holding {out_dir.parent}: {free / 2**20:.1f} MiB free)"
                    if free < 64 * 2**20
                    else ""
                )
            ) from None
        try:
            os.rename(staging, out_dir)
        except OSError:  # another process built it first
            if not (out_dir / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out_dir


DIGEST = "regimen_digest.json"
"""Beside a built base model: each file's sha256, checked before every use (`check_built`)."""


def _file_digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): file_digest(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != DIGEST
    }


def check_built(out_dir: Path) -> Path:
    """A built base model, as built: no link the store did not make (the folder or anything in it), and
    every file matching the digest written when it was built. Raises StoreError naming the path."""
    from regimen.stages.store.files import check_tree_no_links

    if out_dir.is_symlink():
        raise StoreError(
            f"{out_dir} is a symbolic link inside the store; the base model is never read through a link the store did "
            f"not make (remove it: it is rebuilt)"
        )
    check_tree_no_links(out_dir)
    try:
        recorded = json.loads((out_dir / DIGEST).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        recorded = None
    if recorded != _file_digests(out_dir):
        raise StoreError(
            f"{out_dir}: the base model's files do not match the digest recorded when it was built "
            f"({'no readable ' + DIGEST if recorded is None else 'changed since'}); remove the folder: it is rebuilt"
        )
    return out_dir


def resolve_base_model(name_or_path: str, tiny_spec: dict[str, Any], cache_dir: Path) -> str:
    """The base model as something `from_pretrained` takes: a hub id, a local folder, or the tiny
    model built into `cache_dir`."""
    if name_or_path == TINY:
        return str(build_tiny_model(tiny_spec, Path(cache_dir) / f"tiny-{tiny_spec_hash(tiny_spec)}"))
    return name_or_path


def load_tokenizer(path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    if tok.chat_template == TOOL_CHAT_TEMPLATE and getattr(tok, "response_template", None) is None:
        tok.response_template = TOOL_RESPONSE  # how tool calls are read back from what the model wrote
    return tok


def load_model(path: str, *, dtype: str = "float32", device: str | None = None):
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    if device:
        model.to(device)
    return model


def load_policy(path: str, recipe):
    """(model, tokenizer) for generation outside TRL: on the device the Trainer uses, in the recipe's dtype."""
    return load_model(path, dtype=recipe.model.dtype, device=device_for(recipe)), load_tokenizer(path)


# ---------------------------------------------------------------------------------------------
# A real-shaped model, built locally: the path a user with a hub model takes, exercised without a hub.

CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' "
    "}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
REAL_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def _corpus() -> list[str]:
    """Text the BPE tokenizer learns its merges from: numbers, arithmetic, code and a few English words."""
    rng = random.Random(0)
    words = (
        "what is the sum of and answer with number only question write a python function that returns def return "
        "if else for in range print true false none assert you are helpful assistant system user"
    ).split()
    lines = []
    for _ in range(1500):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        lines.append(f"What is {a}+{b}? {a + b}")
        lines.append(" ".join(rng.choice(words) for _ in range(8)))
        lines.append(f"def f(x):\n    return {rng.randint(1, 9)}*x+{rng.randint(0, 50)}\n")
    lines.append(string.printable)
    return lines


def build_real_shaped_model(
    out: str | Path,
    *,
    arch: str = "qwen3",
    hidden_size: int = 64,
    num_layers: int = 2,
    seed: int = 0,
    chat_template: str | None = None,
) -> Path:
    """A small standard-architecture causal LM with a BPE tokenizer trained here (byte-level, so any text
    encodes) that carries a chat template, saved with `save_pretrained` like a hub snapshot. `arch`:
    `qwen3` (Qwen3ForCausalLM) or `llama` (LlamaForCausalLM)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    out = Path(out)
    if (out / "config.json").exists():
        return out
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1024, special_tokens=REAL_SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|pad|>",
        bos_token=None,
        unk_token=None,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = chat_template or CHAT_TEMPLATE  # e.g. TRL's qwen3_chat_template, for tool calls
    kind = {"qwen3": "qwen3", "llama": "llama"}.get(arch)
    if kind is None:
        raise ValueError(f"arch {arch!r}: use qwen3 or llama")
    config = AutoConfig.for_model(
        kind,
        vocab_size=len(fast),
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden_size // 4,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.generation_config.eos_token_id = fast.eos_token_id
    model.generation_config.pad_token_id = fast.pad_token_id
    staging = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}"
    staging.mkdir(parents=True)
    try:
        model.save_pretrained(staging)
        fast.save_pretrained(staging)
        os.rename(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out
