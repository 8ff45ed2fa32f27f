"""What a round changed, as pure rules over trajectory rows (one dict per completion: `id`, `prompt`, `completion`,
`rewards`, `total`, `correct`): the diff of two versions on the prompts both scored, and the flags that mark what looks
like a hack, each with the reason a person reads.

A row's verdict is the task's own (`correct`: 1.0 right, 0.0 wrong, None unscored), or, in rows that lack it (GRPO's
samples), the metric reward's value reaching 1.0. Rows are paired by `id` (the held-out row's identity: its prompt's
digest, `#k` for the k-th repeat of a prompt), never by position.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

PAID_SHARE = 0.5
"""Paid but wrong: a wrong completion whose weighted reward reaches this share of what a right one typically earns."""
LENGTH_RATIO = 3.0
"""Much longer or shorter than the same prompt's completion in the version compared with (and at least MIN_CHARS
apart); with nothing to compare with, LENGTH_RATIO + 1 times this version's median length."""
MIN_CHARS = 20
SAME_SHARE = 0.05
"""The same wrong completion for at least this share of the version's prompts (and at least SAME_MIN of them)."""
SAME_MIN = 3
ECHO_MIN = 8
"""A prompt echoed: the prompt's text (at least this many characters) inside the completion."""
REPEAT_MIN = 4
"""Repeated lines: one line (of at least 3 characters) written this many times."""

FLAGS = ("paid_but_wrong", "length", "same_completion", "prompt_echoed", "repeated_lines")
KINDS = ("fixed", "broke", "still_wrong", "still_right")
"""The diff's kinds of pair: wrong to right, right to wrong, wrong both times, right both times."""


def verdict(row: dict[str, Any]) -> bool | None:
    """Right (True), wrong (False) or unscored (None) by the task's verdict the row records (`correct`, written by
    `rewards/scoring.py`; a reader fills it for rows that predate it, `flows/present/trajectories.judged`)."""
    c = row.get("correct")
    return None if c is None else c is True or c == 1.0


def prompt_text(prompt: Any) -> str:
    """A prompt's text: itself, or the last user message of a conversation."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content", "") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        return str(users[-1]) if users else ""
    return str(prompt or "")


def _norm(text: Any) -> str:
    return " ".join(str(text or "").split())


def diff(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> dict[str, Any]:
    """The flips between two versions on the prompts both hold: each kind's ids, the ids only one side has, the ids
    one side did not score, and the accuracy change over the pairs both scored ((fixed - broke) / scored)."""
    a = {r["id"]: r for r in before if r.get("id") is not None}
    b = {r["id"]: r for r in after if r.get("id") is not None}
    kinds: dict[str, list[str]] = {k: [] for k in KINDS}
    unscored: list[str] = []
    for rid in [r["id"] for r in after if r.get("id") in a]:
        va, vb = verdict(a[rid]), verdict(b[rid])
        if va is None or vb is None:
            unscored.append(rid)
            continue
        kinds[("still_right" if va else "fixed") if vb else ("broke" if va else "still_wrong")].append(rid)
    scored = sum(len(v) for v in kinds.values())
    return {
        **kinds,
        "counts": {k: len(v) for k, v in kinds.items()},
        "scored": scored,
        "unscored": unscored,
        "only_before": [rid for rid in a if rid not in b],
        "only_after": [rid for rid in b if rid not in a],
        "accuracy_before": (len(kinds["still_right"]) + len(kinds["broke"])) / scored if scored else None,
        "accuracy_after": (len(kinds["still_right"]) + len(kinds["fixed"])) / scored if scored else None,
        "accuracy_change": (len(kinds["fixed"]) - len(kinds["broke"])) / scored if scored else None,
    }


def flags(rows: list[dict[str, Any]], previous: list[dict[str, Any]] | None = None) -> list[list[dict[str, str]]]:
    """Each row's flags, `[{"flag": name, "why": reason}]`, in the rows' order (see the constants for each rule)."""
    out: list[list[dict[str, str]]] = [[] for _ in rows]
    verdicts = [verdict(r) for r in rows]
    right_pay = [r["total"] for r, v in zip(rows, verdicts) if v and _finite(r.get("total"))]
    paid = [r["total"] for r in rows if _finite(r.get("total"))]
    ref = statistics.median(right_pay) if right_pay else (max(paid) if paid else None)
    lengths = [len(str(r.get("completion") or "")) for r in rows]
    median = statistics.median(lengths) if lengths else 0
    before = {r["id"]: r for r in previous or [] if r.get("id") is not None}
    prompts_of: dict[str, set[str]] = {}
    for r, v in zip(rows, verdicts):
        if v is False:
            prompts_of.setdefault(_norm(r.get("completion")), set()).add(_norm(prompt_text(r.get("prompt"))))
    same_min = max(SAME_MIN, int(SAME_SHARE * len(rows) + 0.999))
    for i, (r, v) in enumerate(zip(rows, verdicts)):
        text = str(r.get("completion") or "")
        total = r.get("total")
        if v is False and ref is not None and ref > 0 and _finite(total) and total >= PAID_SHARE * ref:
            out[i].append(
                {
                    "flag": "paid_but_wrong",
                    "why": f"the rewards paid {total:.2f} (a right answer typically {ref:.2f}) for an answer the task "
                    f"calls wrong",
                }
            )
        if (why := _length(text, before.get(r.get("id")), median)) is not None:
            out[i].append({"flag": "length", "why": why})
        key = _norm(text)
        if v is False and len(prompts_of.get(key, ())) >= same_min:
            out[i].append(
                {
                    "flag": "same_completion",
                    "why": f"the same wrong completion for {len(prompts_of[key])} different prompts",
                }
            )
        echoed = _norm(prompt_text(r.get("prompt")))
        if len(echoed) >= ECHO_MIN and echoed in _norm(text):
            out[i].append({"flag": "prompt_echoed", "why": "the completion repeats the prompt"})
        lines = Counter(s for s in (x.strip() for x in text.splitlines()) if len(s) >= 3)
        if lines and (top := lines.most_common(1)[0])[1] >= REPEAT_MIN:
            out[i].append({"flag": "repeated_lines", "why": f"one line written {top[1]} times: {top[0][:60]!r}"})
    return out


def _length(text: str, before: dict[str, Any] | None, median: float) -> str | None:
    n = len(text)
    if before is not None:
        m = len(str(before.get("completion") or ""))
        if abs(n - m) >= MIN_CHARS and (n >= LENGTH_RATIO * max(m, 1) or m >= LENGTH_RATIO * max(n, 1)):
            word = "longer" if n > m else "shorter"
            return f"{n} characters, {word} than the {m} the version compared with wrote for this prompt"
        return None
    if median and n >= (LENGTH_RATIO + 1) * median and n - median >= MIN_CHARS:
        return f"{n} characters, over {LENGTH_RATIO + 1:.0f} times this version's median ({median:.0f})"
    return None


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and x == x and x not in (float("inf"), float("-inf"))


def flag_counts(flagged: list[list[dict[str, str]]]) -> dict[str, int]:
    """How many completions carry each flag (every flag named, zeros included)."""
    counts = Counter(f["flag"] for fs in flagged for f in fs)
    return {name: counts.get(name, 0) for name in FLAGS}


def row_ids(prompts: list[Any], digest) -> list[str]:
    """Each row's identity: its prompt's digest, `#k` on the k-th repeat of a prompt (environment tasks whose prompts
    repeat: each episode its own row). `digest` is the pass-rate table's prompt id."""
    seen: Counter[str] = Counter()
    out = []
    for p in prompts:
        d = digest(p)
        out.append(d if not seen[d] else f"{d}#{seen[d]}")
        seen[d] += 1
    return out
