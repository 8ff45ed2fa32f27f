"""The reward audit: a search for a counterexample to one property of the recipe's rewards, before anything trains.

**The property.** A policy that does not know the answer cannot earn a material share of what knowing it earns. On
rows with a reference answer, the audit builds answer-blind completions (from the row's prompt, other rows'
references, numbers in the answer's range, lists and lines of candidates, abstentions, format tokens, padding;
never from the row's own reference) and compares what the recipe's weighted reward pays them with what the task's
own verdict grants them (`correct`: the task's scorer where it has one, else exact match after the normalisation
evaluation uses). A blind strategy (the same plan rendered on every row) whose completions the verdict calls wrong
and that earns, on the typical row (the median), at least `material` (0.1) of the way from a wrong answer's pay
(another row's reference) to the reference's, each in its best-paid dress, is a **finding**; a blind guess that
happens to be right is right for both (a yes/no task's coin flip is no finding), and one lucky row is not typical.

**The search** is Hypothesis's (targeted property-based testing: `target()` steers it toward higher pay, shrinking
gives the minimal witness, `@example` seeds it with the fixed probes an earlier audit used), run outside a test
runner: no example database, seeded (`seed`: the same seed, the same search and report), no deadline, health checks
it cannot meet suppressed, and a budget counted in completions (its generated examples; the seed examples and the
shrinking come on top and are counted in `tried`; 0: no search). Hypothesis caps its own shrinking by time, so a
slow reward's witness is the smallest one reached in that time.

Beside the property:
- **the total cannot tell right from wrong**: the weighted total pays another row's reference, on average, as much
  as the reference (`digits` alone, `code_block` alone);
- **a reward is a function**: the same completions scored again after the search, in another order and one at a
  time, must get the same values; a reward whose pay drifts with its calls or its batch is **stateful** (a finding:
  what it pays in training is not what was audited). Hypothesis's `Flaky` (an example that failed, then passed) is
  the same finding. Callers hand the audit its own instances of the rewards (`from_specs` again), so a reward that
  keeps state is left as training will get it;
- **no opinion is not a pass**: a reward that gives None to every reference is searched alone for a wrong
  completion it pays; a reward that cannot be called outside an episode (it reads `environments`) is listed as not
  probed, with that reason;
- **strictness** (the reference repeated, prefixed, suffixed) is reported, never a finding: a lenient reward still
  needs the answer;
- **abstention**: a finding whose witness abstains (empty, whitespace, "I don't know") is a finding like any other
  (a policy below that pass rate learns to abstain), unless the recipe says it wants abstention
  (`dry_run.abstention: true`): then it is reported as a warning.

Each finding names the reward(s), the row, the witness, what it earned against the reference and a wrong answer,
and how many completions the search tried. The reward dry run and `regimen reward-check` run it;
`dry_run.gameable` says whether a finding stops the run. Written here: no library audits a reward function (reward
model benchmarks score model outputs); the search itself is Hypothesis's.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.rewards.registry import RewardFn, score, trl_shaped
from regimen.stages.rewards.scoring import PASS, exact_correct, weighted_total

KINDS = ("reference", "wrong", "empty", "candidates", "repeated", "prefixed", "suffixed")
STRICTNESS = ("repeated", "prefixed", "suffixed")
MAX_ROWS = 8
CANDIDATES = 9
DEFAULT_BUDGET = 2400
MATERIAL = 0.1
DRESS = (
    "<answer>{}</answer>",
    "<think>\n</think>\n<answer>{}</answer>",
    "\\boxed{{{}}}",
    "```\n{}\n```",
    "The answer is {}",
    "#### {}",
)
EPS = 1e-9
ABSTAIN = ("", " ", "\n", "I don't know", "I do not know", "unknown", "N/A", "none", "pass")
FORMAT = (
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "```",
    "```python",
    "\\boxed{",
    "}",
    "Answer:",
    "Final answer:",
    "#### ",
)
SEPARATORS = (" ", ", ", "\n", ",", " or ", "; ", "")


class _Found(Exception):
    """A counterexample: raised inside the search so Hypothesis shrinks it; the last one raised is the minimal."""

    def __init__(self, case: dict[str, Any]):
        super().__init__(case.get("completion"))
        self.case = case


def probes(references: list[str]) -> dict[str, list[str | None]]:
    """The fixed made-up completions for each row, by kind (None: that probe does not apply to the row). `empty` and
    `candidates` also seed the search; `reference` and `wrong` are its baselines; the rest is strictness."""
    one_line = all("\n" not in r.strip() for r in references)
    out: dict[str, list[str | None]] = {k: [] for k in KINDS}
    for i, ref in enumerate(references):
        others = _others(references, i)
        out["reference"].append(ref)
        out["wrong"].append(others[0] if others else None)
        out["empty"].append("")
        if one_line and others:
            listed = others[:CANDIDATES]
            listed.insert(max(1, len(listed) // 2), ref)
            out["candidates"].append("\n".join(listed))
        else:
            out["candidates"].append(None)
        for dress in DRESS if one_line else ():
            for base, text in (("reference", ref), ("wrong", others[0] if others else None)):
                out.setdefault(f"{base}:{dress}", []).append(None if text is None else dress.format(text))
        out["repeated"].append(f"{ref}\n{ref}" if "\n" in ref else f"{ref} {ref}")
        out["prefixed"].append(f"The answer is {ref}")
        out["suffixed"].append(f"{ref} and that is my final answer")
    return out


def _others(references: list[str], i: int) -> list[str]:
    n, ref = len(references), references[i]
    others = [references[(i + k) % n] for k in range(1, n)]
    return list(dict.fromkeys(o for o in others if o.strip().lower() != ref.strip().lower()))


def _mean(values: list[float | None]) -> float | None:
    scored = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.fmean(scored) if scored else None


def exact_verdict(completion: Any, row: dict[str, Any], reference: str) -> bool:
    """The held-out metric's verdict where a task has no scorer of its own (`scoring.exact_correct`)."""
    return exact_correct(completion, reference) >= PASS


class Audit:
    """One audit's state: the rows, the rewards, what they paid, the calls made (see the module doc)."""

    def __init__(self, fns, weights, rows, refs, correct, material, abstention):
        self.fns, self.rows, self.refs = fns, rows, refs
        self.best: dict[str, list[tuple[float, str | None]]] = {}
        self.weights = {n: weights.get(n, 1.0) for n in fns}
        self.training = {n: w for n, w in self.weights.items() if w > 0}
        self.correct, self.material, self.abstention = correct, material, abstention
        self.columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("prompt", "completion")}
        self.prompts = [r["prompt"] for r in rows]
        self.raised: dict[str, str] = {}
        self.tried = 0

    def score(
        self, idx: list[int], completions: list[Any], names=None, *, whole: bool = False
    ) -> dict[str, list[float | None]]:
        """Each reward (not yet found raising) on these rows' completions, in one batch. `whole` (the search): every
        named reward or nothing ({} when one raises, noted in `raised`), so an example never loses a reward its
        baselines had."""
        out: dict[str, list[float | None]] = {}
        for name in names or self.fns:
            if name in self.raised and not whole:
                continue
            try:
                out[name] = score(
                    {name: self.fns[name]},
                    [self.prompts[i] for i in idx],
                    [self.shaped(i, c) for i, c in zip(idx, completions)],
                    {k: [v[i] for i in idx] for k, v in self.columns.items()},
                )[name]
            except InputError as exc:  # it cannot score text it did not expect: said, not judged here
                self.raised.setdefault(name, f"{_clip(completions[0] if completions else '', 60)!r}: {exc}")
                if whole:
                    return {}
        return out

    def shaped(self, i: int, completion: Any) -> Any:
        """A completion in TRL's shape for row `i`: text after a text prompt; after a chat prompt (a list of messages)
        the assistant's message list, `[{"role": "assistant", "content": ...}]`, as GRPOTrainer hands it to rewards."""
        return trl_shaped([self.prompts[i]], [completion])[0]

    def verdict(self, completion: Any, i: int) -> bool | None:
        """The task's verdict on a completion for row `i`, in the recipe's shape."""
        return self.correct(self.shaped(i, completion), self.rows[i], self.refs[i])

    def total(self, values: dict[str, list[float | None]], k: int) -> float:
        scored = {n: [values[n][k]] for n in self.training if n in values}
        return weighted_total(scored, self.training)[0] if scored else math.nan


def audit(
    fns: dict[str, RewardFn],
    weights: dict[str, float],
    rows: list[dict[str, Any]],
    reference_of: Callable[[dict[str, Any]], str | None],
    *,
    correct: Callable[[Any, dict[str, Any], str], bool | None] | None = None,
    budget: int = DEFAULT_BUDGET,
    material: float = MATERIAL,
    abstention: bool = False,
    seed: int = 0,
    max_rows: int = MAX_ROWS,
) -> dict[str, Any]:
    """The audit over up to `max_rows` rows that have a reference (see the module doc). `correct(completion, row,
    reference)` is the task's verdict (default: `exact_verdict`); `budget`: completions the search tries."""
    picked = [(r, ref) for r in rows if (ref := reference_of(r)) not in (None, "")][:max_rows]
    if len(picked) < 2:
        return {"rows": len(picked), "skipped": "fewer than two rows with a reference answer", "findings": []}
    rows_, refs = [r for r, _ in picked], [str(ref) for _, ref in picked]
    a = Audit(fns, weights, rows_, refs, correct or exact_verdict, material, abstention)
    made = probes(refs)
    values = _fixed(a, made)
    report = _report(a, values, made)
    findings: list[dict[str, Any]] = list(report["findings"])
    if a.training and not report["findings"]:
        findings += _search(a, values, made, budget, seed)
    for name in _no_opinion(a, values):
        findings += _search(a, values, made, max(budget // 3, 20), seed, alone=name)
    findings += _stateful(a, made, values)
    report["findings"] = [f for f in findings if not (f.get("abstention") and abstention)]
    report["warnings"] = [f for f in findings if f.get("abstention") and abstention]
    report["gameable"] = sorted({n for f in report["findings"] for n in f.get("rewards", [f["reward"]])})
    report["rows"] = len(rows_)
    report["raised"] = dict(a.raised)
    report["not_probed"] = sorted({*report["not_probed"], *a.raised})
    report["search"] = {"budget": budget, "seed": seed, "tried": a.tried, "material": material}
    return report


def _fixed(a: Audit, made: dict[str, list[str | None]]) -> dict[str, dict[str, list[float | None]]]:
    """Every reward on the fixed probes, per kind: {kind: {reward: value per row}}."""
    values: dict[str, dict[str, list[float | None]]] = {}
    for kind, completions in made.items():
        keep = [i for i, c in enumerate(completions) if c is not None]
        if keep:
            got = a.score(keep, [completions[i] for i in keep])
            values[kind] = {name: _spread(v, keep, len(a.rows)) for name, v in got.items()}
    return values


def _spread(vals: list[float | None], keep: list[int], n: int) -> list[float | None]:
    out: list[float | None] = [None] * n
    for i, v in zip(keep, vals):
        out[i] = v
    return out


def _report(a: Audit, values, made) -> dict[str, Any]:
    """What the fixed probes paid, each row's baselines (`a.best`: the reference and a wrong answer, each in its
    best-paid dress, so a format reward pays both alike), and the one finding the fixed probes make on their own: the
    total cannot tell right from wrong."""
    paid = {kind: {name: _mean(v) for name, v in by.items()} for kind, by in values.items() if ":" not in kind}
    not_probed = [name for name in a.fns if all(paid[k].get(name) is None for k in paid)]
    training = {n: w for n, w in a.training.items() if n not in not_probed and n in values.get("reference", {})}
    for base in ("reference", "wrong"):
        a.best[base] = []
        for i in range(len(a.rows)):
            dressed = [
                (t, made[k][i])
                for k in values
                if k.split(":")[0] == base and made[k][i] is not None and not math.isnan(t := a.total(values[k], i))
            ]
            a.best[base].append(max(dressed, key=lambda tc: tc[0]) if dressed else (math.nan, None))
    totals = {k: [t for t, _ in v] for k, v in a.best.items()} if training else {}
    total = {k: _mean(v) for k, v in totals.items()}
    findings = []
    if (
        total.get("reference") is not None
        and total.get("wrong") is not None
        and total["wrong"] >= total["reference"] - EPS
    ):
        findings.append(_total_finding(training, total, totals, a.best, a.rows))
    return {"paid": paid, "total": total, "not_probed": not_probed, "findings": findings}


def _no_opinion(a: Audit, values) -> list[str]:
    """Training rewards that gave None to every reference and every wrong answer: searched alone."""
    return [
        n
        for n in a.training
        if n not in a.raised
        and all(v is None for kind in ("reference", "wrong") for v in values.get(kind, {}).get(n, [None]))
    ]


def _baseline(a: Audit, values, i: int, alone: str | None) -> tuple[float, float]:
    """(a wrong answer's pay, the reference's pay) on row i: the weighted total, or one reward's value."""
    if alone is not None:
        return 0.0, 1.0  # no opinion on either: any pay for a wrong completion is what it pays without the answer
    ref, wrong = a.best["reference"][i][0], a.best["wrong"][i][0]
    if math.isnan(wrong):
        wrong = 0.0
    return wrong, ref


def _search(a: Audit, values, made, budget: int, seed: int, alone: str | None = None) -> list[dict[str, Any]]:
    """Hypothesis's search for an answer-blind strategy (a completion made the same way on every row, from what a
    policy sees: the prompt, other rows' answers, constants; see `_strategy`) that the rewards pay and the verdict
    calls wrong, on the typical row (the median of the rows' shares, so one lucky hit is no finding): [] or one
    finding with its minimal witness. `budget` counts completions: each example scores every row once."""
    from hypothesis import HealthCheck, Phase, Verbosity, example, given, settings, target
    from hypothesis import seed as seeded
    from hypothesis.errors import Flaky

    rows = [i for i in range(len(a.rows)) if _span(a, values, i, alone) > EPS]
    if len(rows) < 2 or budget <= 0:
        return []
    names = [alone] if alone else list(a.training)

    def prop(plan: tuple) -> None:
        blind = [_render(plan, a, i) for i in rows]
        a.tried += len(rows)
        got = a.score(rows, blind, names, whole=True)
        if not got:
            return  # a reward raised on it: said in the report, no finding made of a partial total
        shares = []
        for k, i in enumerate(rows):
            pay = got[alone][k] if alone else a.total(got, k)
            wrong, ref = _baseline(a, values, i, alone)
            if pay is None or math.isnan(pay) or a.verdict(blind[k], i):
                shares.append(0.0)  # no opinion, or right by the task's own verdict: earned, not gamed
            else:
                share = (pay - wrong) / (ref - wrong)
                shares.append(share if math.isfinite(share) else 0.0)
        shares = [max(-1e6, min(1e6, x)) for x in shares]  # a reward paying 1e308 still steers a finite target
        typical = statistics.median(shares)
        target(statistics.fmean(shares), label="mean share of the reference's pay")
        if typical >= a.material - EPS:
            k = max(range(len(rows)), key=lambda j: shares[j])
            i = rows[k]
            wrong, ref = _baseline(a, values, i, alone)
            pay = got[alone][k] if alone else a.total(got, k)
            raise _Found(
                {
                    "row": i,
                    "completion": blind[k],
                    "paid": pay,
                    "wrong_paid": wrong,
                    "reference_paid": ref,
                    "share": typical,
                    "rows_paid": sum(1 for x in shares if x >= a.material - EPS),
                    "rows": len(rows),
                    "values": {n: v[k] for n, v in got.items()},
                }
            )

    test = given(_strategy(a))(prop)
    low, high = _answer_range(a)
    seeds = [
        *SEEDS,
        *((((sep, (("range", low, high),)),), ("", 0)) for sep in (" ", "\n")),  # the whole answer space listed
        *((((" ", (("text", t),)),), ("", 0)) for t in ABSTAIN + FORMAT),
    ]
    for plan in reversed(seeds):  # the fixed probes, abstentions and format tokens alone: the search's first examples
        test = example(plan)(test)
    test = settings(
        max_examples=max(1, budget // len(rows)),
        database=None,
        deadline=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        phases=(Phase.explicit, Phase.generate, Phase.target, Phase.shrink),
        report_multiple_bugs=False,
        verbosity=Verbosity.quiet,
        print_blob=False,
    )(seeded(seed)(test))
    try:
        test()
    except _Found as found:
        return [_blind_finding(a, found.case, alone)]
    except Flaky as exc:  # an example that failed, then passed: the reward's pay moved under the search
        return [_stateful_finding(alone or ", ".join(names), f"Hypothesis: {str(exc).splitlines()[0][:200]}", a)]
    return []


def _span(a: Audit, values, i: int, alone: str | None) -> float:
    wrong, ref = _baseline(a, values, i, alone)
    return ref - wrong if not math.isnan(ref) else 0.0


# A plan is a tuple of lines, a line a tuple (separator, pieces), a piece one of:
#   ("text", s): a constant (a number, an abstention, a format token, a word of the first row's prompt)
#   ("prompt",): the row's own prompt          ("other", k): the k-th other row's answer (never the row's own)
#   ("others", m): m other rows' answers        ("range", lo, hi): every integer from lo to hi (an answer space)
#   ("upper", k) / ("lower", k): another row's answer in upper or lower case
# followed by padding (character, count). The same plan is rendered for every row: a policy that does not know the
# answer can only do the same thing everywhere, with what it sees.
SEEDS = (
    ((("", (("text", ""),)),), ("", 0)),  # the empty answer
    ((("\n", (("others", 9),)),), ("", 0)),  # a list of other rows' answers, one per line
)


def _strategy(a: Audit):
    """Hypothesis's strategy over plans (see above), built from the rows' answer shape and the first prompt."""
    from hypothesis import strategies as st

    n = len(a.refs)
    low, high = _answer_range(a)
    words = sorted({w for w in _text(a.prompts[0]).replace("\n", " ").split(" ") if w})[:40] or ["x"]
    multi_line = any("\n" in r.strip() for r in a.refs)
    piece = st.one_of(
        st.tuples(st.just("text"), st.integers(0, 20).map(str)),
        st.tuples(st.just("text"), st.integers(min(low, 0), max(high, 20)).map(str)),
        st.tuples(st.just("text"), st.sampled_from(ABSTAIN + FORMAT)),
        st.tuples(st.just("text"), st.sampled_from(words)),
        st.tuples(st.just("prompt")),
        st.tuples(st.sampled_from(("other", "upper", "lower")), st.integers(0, max(0, n - 2))),
        st.tuples(st.just("others"), st.integers(1, max(1, n - 1))),
        st.tuples(st.just("range"), st.integers(min(low, 0), max(high, 20)), st.integers(min(low, 0), max(high, 20))),
    )
    line = st.tuples(
        st.sampled_from(SEPARATORS), st.lists(piece, min_size=1, max_size=2 if multi_line else 6).map(tuple)
    )
    padding = st.one_of(st.just(("", 0)), st.tuples(st.sampled_from((" ", "x", ".", "a ", "\n")), st.integers(0, 800)))
    constant = st.one_of(  # one value on every row: the commonest answers, an abstention, a token
        st.integers(0, 20).map(str),
        st.integers(min(low, 0), max(high, 20)).map(str),
        st.sampled_from(ABSTAIN + FORMAT + tuple(words)),
    )
    return st.one_of(
        constant.map(lambda text: (((" ", (("text", text),)),), ("", 0))),
        st.tuples(st.lists(line, min_size=1, max_size=4).map(tuple), padding),
    )


def _answer_range(a: Audit) -> tuple[int, int]:
    """The integers around the answers where they are numbers (the answer space a list can cover), else 0 to 100."""
    numeric = [v for r in a.refs if (v := _number(r)) is not None]
    return (int(min(numeric)) - 10, int(max(numeric)) + 10) if numeric else (0, 100)


def _render(plan: tuple, a: Audit, i: int) -> str:
    """A plan's completion for row i."""
    lines, (pad, count) = plan
    others = _others(a.refs, i) or ["0"]
    out = []
    for sep, pieces in lines:
        parts: list[str] = []
        for p in pieces:
            kind = p[0]
            if kind == "text":
                parts.append(p[1])
            elif kind == "prompt":
                parts.append(_text(a.prompts[i]))
            elif kind in ("other", "upper", "lower"):
                text = others[p[1] % len(others)]
                parts.append(text.upper() if kind == "upper" else text.lower() if kind == "lower" else text)
            elif kind == "others":
                parts += others[: p[1]]
            elif kind == "range":
                lo, hi = sorted(p[1:])
                parts += [str(v) for v in range(lo, min(hi, lo + 400) + 1)]
        out.append(sep.join(parts))
    return "\n".join(out) + pad * count


def _number(text: str) -> float | None:
    try:
        value = float(text.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and isinstance(prompt[-1], dict):
        return str(prompt[-1].get("content", ""))
    return str(prompt)


def _stateful(a: Audit, made, values) -> list[dict[str, Any]]:
    """The references and wrong answers scored again after the search, in reverse order and one at a time: a
    reward whose values changed is not a function of its completion."""
    out = []
    for kind in ("reference", "wrong"):
        keep = [i for i, c in enumerate(made[kind]) if c is not None]
        if not keep:
            continue
        again = a.score(list(reversed(keep)), [made[kind][i] for i in reversed(keep)])
        single = {n: [] for n in again}
        for i in keep[:2]:
            for n, v in a.score([i], [made[kind][i]], list(again)).items():
                single[n].append((i, v[0]))
        for name, vals in again.items():
            before = values.get(kind, {}).get(name)
            if before is None or any(n == name for n in (f["reward"] for f in out)):
                continue
            now = _spread(list(reversed(vals)), keep, len(a.rows))
            moved = [i for i in keep if not _same(before[i], now[i])]
            moved += [i for i, v in single.get(name, []) if not _same(before[i], v)]
            if moved:
                i = moved[0]
                why = (
                    f"scored {made[kind][i]!r} {before[i]} first and {now[i]} after {a.tried} more completions "
                    "(or alone)"
                )
                out.append(_stateful_finding(name, why, a, row=i))
    return out


def _same(x: float | None, y: float | None) -> bool:
    if x is None or y is None:
        return x is y
    return abs(x - y) <= 1e-9


def _abstains(text: str) -> bool:
    return text.strip().lower().rstrip(".") in {s.strip().lower() for s in ABSTAIN}


def _blind_finding(a: Audit, case: dict[str, Any], alone: str | None) -> dict[str, Any]:
    i, blind = case["row"], case["completion"]
    payers = [alone] if alone else sorted(n for n, v in case["values"].items() if v and n in a.training)
    names = ", ".join(payers) or ", ".join(a.training)
    what = "answers nothing (an abstention)" if _abstains(blind) else "does not know the answer"
    return {
        "reward": names,
        "rewards": payers,
        "kind": "blind",
        "abstention": _abstains(blind),
        "paid": case["paid"],
        "reference_paid": case["reference_paid"],
        "wrong_paid": case["wrong_paid"],
        "share": case["share"],
        "tried": a.tried,
        "message": (
            f"{'reward ' + repr(names) if alone else 'the weighted total (' + names + ')'} pays a completion that "
            f"{what} {case['paid']:.3f} on a row, {case['share']:.0%} of the way from a wrong answer's pay "
            f"({case['wrong_paid']:.3f}) to the reference's ({case['reference_paid']:.3f}) on the typical row "
            f"({case.get('rows_paid', 1)} of {case.get('rows', 1)} rows): a policy can earn it without knowing the "
            f"answer (found after {a.tried} completions)"
        ),
        "row": _clip(a.rows[i]["prompt"]),
        "completion": blind,
        "value": case["paid"],
    }


def _stateful_finding(name: str, why: str, a: Audit, row: int = 0) -> dict[str, Any]:
    return {
        "reward": name,
        "rewards": [n.strip() for n in name.split(",")],
        "kind": "stateful",
        "abstention": False,
        "message": f"reward {name!r} is not a function of its completion: {why}; what it pays in training is not "
        "what was audited",
        "row": _clip(a.rows[row]["prompt"]),
        "completion": None,
        "value": None,
        "tried": a.tried,
    }


def _total_finding(training, total, totals, best, rows) -> dict[str, Any]:
    def margin(k: int) -> float:
        gap = totals["wrong"][k] - totals["reference"][k]
        return gap if gap == gap else -1e9  # NaN: a row no reward scored

    i = max(range(len(rows)), key=margin)
    names = ", ".join(training)
    return {
        "reward": names,
        "rewards": list(training),
        "kind": "wrong",
        "abstention": False,
        "paid": total["wrong"],
        "reference_paid": total["reference"],
        "message": f"the weighted total of {names} pays a wrong answer {total['wrong']:.3f} on average, as much as the "
        f"reference ({total['reference']:.3f}): together the rewards cannot tell right from wrong",
        "row": _clip(rows[i]["prompt"]),
        "completion": best["wrong"][i][1],
        "reference": best["reference"][i][1],
        "value": totals["wrong"][i],
        "tried": 0,
    }


def _clip(prompt: Any, width: int = 160) -> str:
    text = prompt if isinstance(prompt, str) else str((prompt or [{}])[-1].get("content", prompt))
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def summary(report: dict[str, Any]) -> list[str]:
    """The audit in lines for a terminal: what each reward paid for each fixed probe, the search, the findings."""
    if report.get("skipped"):
        return [f"reward audit: skipped ({report['skipped']})"]
    lines = [f"reward audit over {report['rows']} rows (mean paid per made-up completion):"]
    for kind, by in report["paid"].items():
        shown = ", ".join(f"{n}={'-' if v is None else f'{v:.3f}'}" for n, v in by.items())
        tag = " (strictness: reported, never stopped)" if kind in STRICTNESS else ""
        lines.append(f"  {kind}: {shown}{tag}")
    search = report.get("search") or {}
    if search:
        lines.append(
            f"  searched {search.get('tried', 0)} answer-blind completions (budget {search.get('budget')}, seed "
            f"{search.get('seed')}) for one the task calls wrong that earns {search.get('material', MATERIAL):.0%} of "
            "the reference's pay"
        )
    if report["not_probed"]:
        lines.append(f"  not probed (no opinion on any made-up completion): {', '.join(report['not_probed'])}")
    for name, why in (report.get("raised") or {}).items():
        lines.append(f"  {name} raised on a made-up completion ({why[:200]}): it would on a policy's text too")
    for f in report["findings"]:
        lines.append(f"  GAMEABLE: {f['message']}; witness: row {f['row']!r}, completion {f['completion']!r}")
    for f in report.get("warnings") or []:
        lines.append(f"  warning (dry_run.abstention allows it): {f['message']}; witness {f['completion']!r}")
    return lines
