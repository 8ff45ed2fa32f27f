"""The reward audit: made-up completions a gameable reward pays, scored before anything trains.

Where rows have reference answers, each reward is scored on completions made from them (never from a model):

- `reference`: the row's own reference answer;
- `wrong`: another row's reference (a wrong answer in the reference's own shape);
- `empty`: nothing at all;
- `candidates`: many other rows' references, one per line, with the row's own among them (never first): an
  answer space a policy could cover by listing. Probed where references are one line (a value, a word); a
  multi-line reference (a program) has no answer space to list;
- strictness, reported and never stopped: `repeated` (the reference twice), `prefixed` (text before it),
  `suffixed` (text after it).

Two findings make a reward gameable (`findings`):
- (i) a reward that trains (weight > 0) pays `empty` or `candidates` more, on average, than `wrong`: a policy
  earns it without knowing the answer;
- (ii) the recipe's weighted total pays `wrong` as much as `reference`: its rewards together cannot tell right
  from wrong (a format reward beside a correctness reward is fine; `digits` or `code_block` alone is not).

Each finding names the reward, what paid, the row, the completion and the values. A reward that gives no
opinion on any made-up completion (None: `episode` judges an environment's episodes) is listed as not probed.
The reward dry run and `regimen reward-check` run it; `dry_run.gameable` says whether a finding stops the run.

Written here: no library audits a reward function this way (reward-model benchmarks score model outputs, not
a reward's response to adversarial text); the probes are the ones GRPO practitioners use by hand.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.rewards.registry import RewardFn, score, weighted_total

KINDS = ("reference", "wrong", "empty", "candidates", "repeated", "prefixed", "suffixed")
STRICTNESS = ("repeated", "prefixed", "suffixed")
MAX_ROWS = 8
CANDIDATES = 9
EPS = 1e-9


def probes(references: list[str]) -> dict[str, list[str | None]]:
    """The made-up completions for each row, by kind (None: that probe does not apply to the row)."""
    n = len(references)
    one_line = all("\n" not in r.strip() for r in references)
    out: dict[str, list[str | None]] = {k: [] for k in KINDS}
    for i, ref in enumerate(references):
        others = [references[(i + k) % n] for k in range(1, n)]
        others = list(dict.fromkeys(o for o in others if o.strip() != ref.strip()))
        out["reference"].append(ref)
        out["wrong"].append(others[0] if others else None)
        out["empty"].append("")
        if one_line and others:
            listed = others[:CANDIDATES]
            listed.insert(max(1, len(listed) // 2), ref)
            out["candidates"].append("\n".join(listed))
        else:
            out["candidates"].append(None)
        out["repeated"].append(f"{ref}\n{ref}" if "\n" in ref else f"{ref} {ref}")
        out["prefixed"].append(f"The answer is {ref}")
        out["suffixed"].append(f"{ref} and that is my final answer")
    return out


def _mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None]
    return statistics.fmean(scored) if scored else None


def audit(
    fns: dict[str, RewardFn],
    weights: dict[str, float],
    rows: list[dict[str, Any]],
    reference_of: Callable[[dict[str, Any]], str | None],
    *,
    max_rows: int = MAX_ROWS,
) -> dict[str, Any]:
    """Score the probes of up to `max_rows` rows that have a reference with every reward; the report (see the
    module doc): per kind and reward the mean paid, the weighted total's means, the findings."""
    picked = [(r, ref) for r in rows if (ref := reference_of(r)) not in (None, "")][:max_rows]
    if len(picked) < 2:
        return {"rows": len(picked), "skipped": "fewer than two rows with a reference answer", "findings": []}
    rows_, refs = [r for r, _ in picked], [str(ref) for _, ref in picked]
    made = probes(refs)
    columns = {k: [r.get(k) for r in rows_] for k in rows_[0] if k not in ("prompt", "completion")}
    prompts = [r["prompt"] for r in rows_]
    values: dict[str, dict[str, list[float | None]]] = {}
    raised: dict[str, str] = {}
    for kind, completions in made.items():
        keep = [i for i, c in enumerate(completions) if c is not None]
        if not keep:
            continue
        values[kind] = {}
        for name, fn in fns.items():
            if name in raised:
                continue
            try:
                got = score(
                    {name: fn},
                    [prompts[i] for i in keep],
                    [completions[i] for i in keep],
                    {k: [v[i] for i in keep] for k, v in columns.items()},
                )[name]
            except InputError as exc:  # it cannot score text it did not expect: said, not judged here
                raised[name] = f"{kind}: {exc}"
                continue
            values[kind][name] = _spread(got, keep, len(rows_))
    report = _report({n: f for n, f in fns.items() if n not in raised}, weights, values, made, rows_)
    report["rows"] = len(rows_)
    report["raised"] = raised
    report["not_probed"] += list(raised)
    return report


def _spread(vals: list[float | None], keep: list[int], n: int) -> list[float | None]:
    out: list[float | None] = [None] * n
    for i, v in zip(keep, vals):
        out[i] = v
    return out


def _report(fns, weights, values, made, rows) -> dict[str, Any]:
    paid = {kind: {name: _mean(v) for name, v in by.items()} for kind, by in values.items()}
    not_probed = [name for name in fns if all(paid[k].get(name) is None for k in paid)]
    findings = []
    for name in fns:
        if weights.get(name, 1.0) <= 0 or name in not_probed:
            continue
        wrong = paid.get("wrong", {}).get(name)
        for kind in ("empty", "candidates"):
            got = paid.get(kind, {}).get(name)
            if got is not None and got > (wrong or 0.0) + EPS:
                findings.append(_finding(name, kind, got, wrong, values, made, rows))
    training = {n: w for n, w in weights.items() if w > 0 and n in fns and n not in not_probed}
    totals = {}
    for kind in ("reference", "wrong"):
        if kind in values and training:
            totals[kind] = weighted_total({n: values[kind][n] for n in training}, training)
    clean = {k: [t for t in v if t == t] for k, v in totals.items()}  # NaN: no reward scored the row
    total = {k: (statistics.fmean(v) if v else None) for k, v in clean.items()}
    if (
        total.get("reference") is not None
        and total.get("wrong") is not None
        and total["wrong"] >= total["reference"] - EPS
    ):
        findings.append(_total_finding(training, total, totals, made, rows))
    return {
        "paid": paid,
        "total": total,
        "not_probed": not_probed,
        "findings": findings,
        "gameable": sorted({f["reward"] for f in findings}),
    }


def _finding(name, kind, got, wrong, values, made, rows) -> dict[str, Any]:
    by_row = values[kind][name]
    wrong_row = values.get("wrong", {}).get(name) or [None] * len(rows)
    i = max(range(len(rows)), key=lambda k: -1 if by_row[k] is None else by_row[k] - (wrong_row[k] or 0))
    what = "the empty answer" if kind == "empty" else "a list of candidate answers (the reference among them)"
    return {
        "reward": name,
        "kind": kind,
        "paid": got,
        "wrong_paid": wrong,
        "message": f"reward {name!r} pays {what} {got:.3f} on average, more than a wrong answer ({wrong or 0:.3f}): "
        f"a policy can earn it without knowing the answer",
        "row": _clip(rows[i]["prompt"]),
        "completion": made[kind][i],
        "value": by_row[i],
    }


def _total_finding(training, total, totals, made, rows) -> dict[str, Any]:
    def margin(k: int) -> float:
        gap = totals["wrong"][k] - totals["reference"][k]
        return gap if gap == gap else -1e9  # NaN: a row no reward scored

    i = max(range(len(rows)), key=margin)
    names = ", ".join(training)
    return {
        "reward": names,
        "kind": "wrong",
        "paid": total["wrong"],
        "reference_paid": total["reference"],
        "message": f"the weighted total of {names} pays a wrong answer {total['wrong']:.3f} on average, as much as the "
        f"reference ({total['reference']:.3f}): together the rewards cannot tell right from wrong",
        "row": _clip(rows[i]["prompt"]),
        "completion": made["wrong"][i],
        "reference": made["reference"][i],
        "value": totals["wrong"][i],
    }


def _clip(prompt: Any, width: int = 160) -> str:
    text = prompt if isinstance(prompt, str) else str((prompt or [{}])[-1].get("content", prompt))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(report: dict[str, Any]) -> list[str]:
    """The audit in lines for a terminal: what each reward paid for each probe, then the findings."""
    if report.get("skipped"):
        return [f"reward audit: skipped ({report['skipped']})"]
    lines = [f"reward audit over {report['rows']} rows (mean paid per made-up completion):"]
    for kind, by in report["paid"].items():
        shown = ", ".join(f"{n}={'-' if v is None else f'{v:.3f}'}" for n, v in by.items())
        tag = " (strictness: reported, never stopped)" if kind in STRICTNESS else ""
        lines.append(f"  {kind}: {shown}{tag}")
    if report["not_probed"]:
        lines.append(f"  not probed (no opinion on any made-up completion): {', '.join(report['not_probed'])}")
    for name, why in (report.get("raised") or {}).items():
        lines.append(f"  {name} raised on a made-up completion ({why[:200]}): it would on a policy's text too")
    for f in report["findings"]:
        lines.append(
            f"  GAMEABLE: {f['message']}; e.g. row {f['row']!r}, completion {f['completion']!r} paid {f['value']}"
        )
    return lines
