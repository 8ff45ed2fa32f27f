"""Champion and challenger: which model of an experiment is the one in use, and when a new one replaces it.

Each run trains a challenger. Before the run ends, the challenger and the champion are evaluated on the
experiment's frozen held-out set (same prompts, same greedy decoding; the champion's evaluation is
reused when nothing about it changed), and the challenger is promoted only when

- every gate passed and the reward-hacking guard did not fire (a run that stopped promotes nothing), and
  no reward it trained on (weight > 0) is gameable by design (it pays for the shape of an answer),
- it is not a model a person rolled back from (`regimen rollback`: only a person promotes it again),
- it measured on the same frozen set as the champion,
- its held-out accuracy is higher by at least `promote.min_gain`, and
- an exact one-sided McNemar test over the prompts where the two disagree says the gain is not luck:
  p ≤ 1 − `promote.confidence` (with b prompts only the challenger solves and c only the champion does,
  p = P[X ≥ b] for X ~ Binomial(b + c, 1/2)).

Otherwise the champion stays and the reason is recorded. The first run's result becomes the first
champion. `champion.json` (beside the experiment's stages) holds the current champion and its history:
every promotion, keep, promotion by a person and rollback, with the figures (accuracy and its 95%
Wilson interval on the frozen set), when and why. Hand-written: the test is a binomial tail (`math.comb`)
and the interval a closed formula; nothing here needs scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

RECORD = "champion.json"


def wilson(successes: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar(challenger: list[float | None], champion: list[float | None]) -> dict[str, Any]:
    """Exact one-sided McNemar test on paired per-prompt outcomes (1 solved, 0 not, None unscored)."""
    pairs = [(a, b) for a, b in zip(challenger, champion) if a is not None and b is not None]
    only_challenger = sum(1 for a, b in pairs if a >= 1 and b < 1)
    only_champion = sum(1 for a, b in pairs if b >= 1 and a < 1)
    n = only_challenger + only_champion
    p = sum(math.comb(n, k) for k in range(only_challenger, n + 1)) / 2**n if n else 1.0
    return {"only_challenger": only_challenger, "only_champion": only_champion, "paired": len(pairs), "p_value": p}


@dataclass
class Measured:
    """A policy and its evaluation on the frozen held-out set."""

    policy: dict[str, Any]  # the policy reference (stage, version, fingerprint, content, model)
    eval_version: int
    heldout_set: int  # the frozen set's version
    accuracy: float
    correct: list[float | None] = field(default_factory=list)  # per prompt, in the frozen set's order

    def figures(self) -> dict[str, Any]:
        scored = [c for c in self.correct if c is not None]
        low, high = wilson(sum(1 for c in scored if c >= 1), len(scored))
        return {
            "policy": f"{self.policy['stage']} v{self.policy['version']}",
            "eval_version": self.eval_version,
            "heldout_set": self.heldout_set,
            "heldout_accuracy": round(self.accuracy, 4),
            "interval_95": [round(low, 4), round(high, 4)],
            "prompts": len(scored),
        }


@dataclass
class Decision:
    promote: bool
    reason: str
    figures: dict[str, Any]


def same_policy(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        a.get("stage") == b.get("stage")
        and a.get("version") == b.get("version")
        and a.get("fingerprint") == b.get("fingerprint")
    )


def decide(
    challenger: Measured,
    champion: Measured | None,
    *,
    min_gain: float,
    confidence: float,
    stopped: str | None = None,
    gameable: list[str] | None = None,
    vetoed: list[dict[str, Any]] | None = None,
) -> Decision:
    """Promote the challenger, or keep the champion, and why (see the module doc)."""
    ch = challenger.figures()
    if any(same_policy(challenger.policy, v) for v in vetoed or []):
        return Decision(
            False,
            f"{ch['policy']} is a model a person rolled back from: the flow does not promote it again "
            "(a person can, with `regimen promote`)",
            {"challenger": ch},
        )
    if stopped:
        return Decision(False, f"the run stopped ({stopped}): its policy is not a candidate", {"challenger": ch})
    if gameable:
        return Decision(
            False,
            f"trained on gameable reward(s) {', '.join(gameable)} (they pay for the shape of an answer): "
            "its gains cannot be trusted, so it is never promoted by the flow",
            {"challenger": ch},
        )
    if champion is None:
        return Decision(True, "the experiment's first champion", {"challenger": ch})
    figures = {"challenger": ch, "champion": champion.figures()}
    if same_policy(challenger.policy, champion.policy):
        return Decision(False, "the challenger is the champion (nothing new was trained)", figures)
    if challenger.heldout_set != champion.heldout_set:
        return Decision(
            False,
            f"measured on held-out set v{challenger.heldout_set}, the champion on v{champion.heldout_set}: not "
            f"comparable",
            figures,
        )
    gain = challenger.accuracy - champion.accuracy
    test = mcnemar(challenger.correct, champion.correct)
    figures.update(gain=round(gain, 4), mcnemar=test, min_gain=min_gain, confidence=confidence)
    if gain < min_gain:
        return Decision(
            False,
            f"held-out {challenger.accuracy:.3f} vs the champion's {champion.accuracy:.3f}: a gain of {gain:+.3f}, "
            f"below promote.min_gain {min_gain}",
            figures,
        )
    if test["p_value"] > 1 - confidence:
        return Decision(
            False,
            f"a gain of {gain:+.3f} ({test['only_challenger']} prompts only the challenger solves, "
            f"{test['only_champion']} only "
            f"the champion), McNemar p = {test['p_value']:.3g} > {1 - confidence:.3g}: could be luck",
            figures,
        )
    return Decision(
        True,
        f"held-out {challenger.accuracy:.3f} vs {champion.accuracy:.3f} ({gain:+.3f}; McNemar p = "
        f"{test['p_value']:.3g})",
        figures,
    )


# -- the record -------------------------------------------------------------------------------------


def empty() -> dict[str, Any]:
    return {"champion": None, "history": []}


def entry(
    event: str, measured: Measured | None, *, by: str, reason: str, at: str, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One line of the history: promoted / kept / promoted-by-person / rolled-back."""
    out: dict[str, Any] = {"event": event, "by": by, "reason": reason, "at": at}
    if measured is not None:
        out.update(
            measured.figures(),
            policy_ref={k: measured.policy.get(k) for k in ("stage", "version", "fingerprint", "content")},
        )
    out.update(extra or {})
    return out


def champion_entry(
    record: dict[str, Any], measured: Measured, *, trained_from: dict[str, Any] | None, data: str | None
) -> dict[str, Any]:
    """The `champion` field: the policy, its figures, and what it was trained from on which data (so a
    night whose data did not change replays the same training and reuses every stage)."""
    return {
        **measured.figures(),
        "policy_ref": dict(measured.policy),
        "trained_from": trained_from,
        "data": data,
        "correct": measured.correct,
    }
