"""The cycle's decisions, as pure functions, so every branch is tested without training anything:

- `decide(history, cycle)`: what comes after an evaluation, from the evaluation history and `cycle:`.
  History entries are the SFT result of each cycle (round 0, the baseline; or the base policy's dry run
  when there is no SFT) and each GRPO round's evaluation (round 1, 2, ...).
- `rise_vs_gain(...)`: the guard's rule, written once: the training reward rose by at least `guard.train_rise`
  while held-out accuracy gained less than `guard.heldout_gain`. Between rounds (`hacking_evidence`, on the
  evaluations) and while GRPO trains (`guard_in_training`, on the training-reward curve and the held-out probe's
  curve) it is this function on two different readings of "start" and "now".
- `read_guard(...)`: what the guard sees while GRPO trains, as a `Finding` (kind, step, figures): the data the stage
  records (`guard_evidence`, `guard_stop` in the manifest) and the flow reads (`StageStopped.finding`); no decision
  is taken on the text of a message.
- `finding(evidence, train_probe_curve, guard)`: what the guard sees, named from the greedy probe on
  training prompts: `hacking` (the reward rises while greedy accuracy on training prompts and the
  held-out probe stay flat: it pays for something else), `overfitting` (greedy accuracy on training
  prompts rises, the held-out probe does not) or `sharpening` (the sampled reward climbs toward what greedy
  decoding already scored, both flat: harmless). Only hacking stops a run by default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

CONTINUE = "continue"
BACK_TO_SFT = "back-to-sft"
TARGET_REACHED = "target-reached"
BUDGET_SPENT = "budget-spent"
STALLED = "stalled"
REWARD_HACKING = "reward-hacking-suspected"
OVERFITTING_VERDICT = "overfitting-suspected"
HACKING, OVERFITTING, SHARPENING = "hacking", "overfitting", "sharpening"


@dataclass(frozen=True)
class Evaluation:
    cycle: int
    round: int  # 0: after SFT (the cycle's baseline); 1..: after each GRPO round
    heldout_accuracy: float
    train_reward: float | None = None  # mean training reward over the round's last logging window
    train_reward_first: float | None = None  # ... and over its first logging window
    finding: str | None = None  # what the guard named the round's curves (`finding`), when it could tell

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Evaluation:
        return cls(
            **{
                k: d.get(k)
                for k in ("cycle", "round", "heldout_accuracy", "train_reward", "train_reward_first", "finding")
            }
        )


@dataclass(frozen=True)
class Decision:
    verdict: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    warning: str | None = None  # the guard's finding when it is set to warn instead of stop

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


GUARD_VERDICTS = {HACKING: REWARD_HACKING, OVERFITTING: OVERFITTING_VERDICT}
"""The cycle's verdict when a finding stops a run (sharpening never does)."""


@dataclass(frozen=True)
class Finding:
    """What the guard found: `kind` (hacking, overfitting, sharpening), the GRPO `step` it was seen at (None between
    rounds) and the rule's `figures` (the rise, the gain, their start and end, the curves)."""

    kind: str
    step: int | None
    figures: dict[str, Any]

    @property
    def verdict(self) -> str | None:
        return GUARD_VERDICTS.get(self.kind)

    def stops(self, guard) -> bool:
        return stops(self.kind, guard)

    def as_dict(self) -> dict[str, Any]:
        """As the manifest records it (and as it was recorded before this class: the figures at the top level)."""
        return {**self.figures, "step": self.step, "finding": self.kind, "verdict": self.verdict}

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> Finding | None:
        if not isinstance(d, dict) or not isinstance(d.get("finding"), str):
            return None
        figures = {k: v for k, v in d.items() if k not in ("step", "finding", "verdict")}
        return cls(d["finding"], d.get("step"), figures)


def rise_vs_gain(start: float, now: float, heldout_start: float, heldout_now: float, guard) -> dict[str, Any] | None:
    """The guard's rule: the training reward rose by at least `guard.train_rise` (from `start` to `now`) while held-out
    accuracy gained less than `guard.heldout_gain`. The figures when it holds, else None."""
    rise, gain = now - start, heldout_now - heldout_start
    if rise >= guard.train_rise and gain < guard.heldout_gain:
        return {
            "train_reward_start": start,
            "train_reward_now": now,
            "train_reward_rise": rise,
            "heldout_accuracy_start": heldout_start,
            "heldout_accuracy_now": heldout_now,
            "heldout_gain": gain,
        }
    return None


def hacking_evidence(history: list[Evaluation], guard) -> dict[str, Any] | None:
    """Training reward rose by >= guard.train_rise since the cycle's first GRPO round while held-out
    accuracy (vs. the cycle's SFT baseline) gained < guard.heldout_gain: the evidence, else None."""
    last = history[-1]
    cycle = [e for e in history if e.cycle == last.cycle]
    rounds = [e for e in cycle if e.round >= 1]
    baseline = next((e for e in cycle if e.round == 0), None)
    if not rounds or last.train_reward is None:
        return None
    start = rounds[0].train_reward_first if rounds[0].train_reward_first is not None else rounds[0].train_reward
    if start is None:
        return None
    reference = baseline.heldout_accuracy if baseline else rounds[0].heldout_accuracy
    held = rise_vs_gain(start, last.train_reward, reference, last.heldout_accuracy, guard)
    if held is None:
        return None
    return {
        **held,
        "train_reward_curve": [e.train_reward for e in rounds],
        "heldout_accuracy_curve": ([reference] if baseline else []) + [e.heldout_accuracy for e in rounds],
    }


def guard_in_training(
    train_curve: list[tuple[int, float]], probe_curve: list[tuple[int, float]], guard
) -> dict[str, Any] | None:
    """The guard's rule during training: the training reward rose by at least `guard.train_rise` while the
    held-out probe (the first probe, before training, to the latest) gained less than `guard.heldout_gain`.
    The reward is smoothed: the mean of the first two logged windows against the mean of the last two
    (one each while fewer than four are logged), so one noisy window does not fire it. Returns the
    evidence when it fires, else None. Needs a logged reward and two probes at least. (The probe callback
    also asks for the rule to hold at two probes in a row before it stops a run.)"""
    if not train_curve or len(probe_curve) < 2:
        return None
    k = max(1, min(2, len(train_curve) // 2))
    start = sum(r for _, r in train_curve[:k]) / k
    now = sum(r for _, r in train_curve[-k:]) / k
    now_step = train_curve[-1][0]
    (_, p0), (p_step, p_now) = probe_curve[0], probe_curve[-1]
    held = rise_vs_gain(start, now, p0, p_now, guard)
    if held is None:
        return None
    return {
        **held,
        "train_reward_step": now_step,
        "probe_step": p_step,
        "train_reward_curve": [list(p) for p in train_curve],
        "heldout_probe_curve": [list(p) for p in probe_curve],
    }


def read_guard(
    train_curve: list[tuple[int, float]],
    probe_curve: list[tuple[int, float]],
    train_probe_curve: list[tuple],
    guard,
    *,
    in_a_row: bool,
) -> Finding | None:
    """The guard's reading of GRPO's curves as a `Finding`, or None while the rule does not hold. `in_a_row`: the rule
    must also have held at the probe before (how the probe callback reads it while training, so one noisy probe
    does not end a run); without it, the whole curves' reading once training ended."""
    now = guard_in_training(train_curve, probe_curve, guard)
    if now is None:
        return None
    if in_a_row:
        cut = probe_curve[-2][0] if len(probe_curve) >= 2 else None
        earlier = [t for t in train_curve if cut is None or t[0] <= cut]
        if guard_in_training(earlier, probe_curve[:-1], guard) is None:
            return None
    figures = {**now, "train_probe_curve": [list(p) for p in train_probe_curve]}
    return Finding(finding(now, train_probe_curve, guard), probe_curve[-1][0], figures)


def finding(evidence: dict[str, Any], train_probe_curve: list[tuple], guard) -> str:
    """Name what the guard's rule found (`evidence` from `guard_in_training` or `hacking_evidence`), from the
    greedy probe on training prompts: (step, greedy accuracy, greedy weighted reward[, precision]) per
    probe, precision being the share of correct answers among those the reward pays in full.

    - overfitting: greedy accuracy on training prompts gained at least `guard.heldout_gain` (the held-out
      probe did not: that is the rule's other half);
    - hacking, when greedy accuracy on training prompts did not gain (not overfitting) and the reward pays wrong
      answers in full (latest precision < 0.5): a policy that already collected a gameable reward greedily is not
      "sharpening";
    - sharpening: the sampled reward now is within `guard.sharpening_margin` of the greedy reward at the
      first probe and the greedy reward itself moved less than half of `guard.train_rise`: sampling is
      catching up with what the policy already answered greedily;
    - hacking: anything else (the greedy reward rose too, or the sampled reward passed it, while nothing
      the task measures did). Without a training-prompt probe it cannot tell, and says hacking."""
    if len(train_probe_curve) < 2:
        return HACKING
    first, last = train_probe_curve[0], train_probe_curve[-1]
    (acc0, rew0), (acc1, rew1) = first[1:3], last[1:3]
    paid_right = last[3] if len(last) > 3 else None
    if acc1 - acc0 >= guard.heldout_gain:
        return OVERFITTING
    if paid_right is not None and paid_right < 0.5:
        return HACKING
    if evidence["train_reward_now"] <= rew0 + guard.sharpening_margin and abs(rew1 - rew0) < guard.train_rise / 2:
        return SHARPENING
    return HACKING


def stops(kind: str | None, guard) -> bool:
    """Whether a finding stops the stage: hacking by `guard.action`, overfitting by `guard.on_overfitting`;
    sharpening never."""
    if kind in (None, HACKING):
        return guard.action == "stop"
    if kind == OVERFITTING:
        return guard.on_overfitting == "stop"
    return False


def describe(kind: str | None) -> str:
    return {
        OVERFITTING: "the policy learns its training prompts and it does not carry over to held-out ones (overfitting)",
        SHARPENING: "sampling catches up with what greedy decoding already answered (sharpening: harmless)",
    }.get(
        kind or HACKING,
        "the policy is learning to please the reward, not to solve the task (hacking); read the trajectories and fix "
        "the reward",
    )


def decide(history: list[Evaluation], cfg) -> Decision:
    """The next step after the last evaluation in `history` (cfg: the recipe's `cycle` section)."""
    if not history:
        raise ValueError("decide() needs at least one evaluation")
    last = history[-1]
    cycle = [e for e in history if e.cycle == last.cycle]
    rounds = [e for e in cycle if e.round >= 1]

    warning = None
    evidence = hacking_evidence(history, cfg.guard)
    if evidence is not None:
        kind = last.finding or HACKING  # the GRPO round named it from its training-prompt probe, where it had one
        evidence["finding"] = kind
        reason = (
            f"training reward rose {evidence['train_reward_rise']:+.3f} (from {evidence['train_reward_start']:.3f} to "
            f"{evidence['train_reward_now']:.3f}) while held-out accuracy changed {evidence['heldout_gain']:+.3f} "
            f"(from {evidence['heldout_accuracy_start']:.3f} to {evidence['heldout_accuracy_now']:.3f}): "
            f"{describe(kind)}"
        )
        if stops(kind, cfg.guard):
            return Decision(GUARD_VERDICTS[kind], reason, evidence)
        warning = reason

    if last.heldout_accuracy >= cfg.target:
        return Decision(
            TARGET_REACHED, f"held-out accuracy {last.heldout_accuracy:.3f} >= target {cfg.target}", warning=warning
        )

    # Consecutive evaluations at the end of this cycle without a gain of min_delta over the one before.
    stalls = 0
    for prev, cur in zip(cycle[-2::-1], cycle[::-1]):
        if cur.round == 0 or cur.heldout_accuracy - prev.heldout_accuracy >= cfg.min_delta:
            break
        stalls += 1
    gain = last.heldout_accuracy - cycle[-2].heldout_accuracy if len(cycle) >= 2 else 0.0
    evidence = {"gain": gain, "stalled_evaluations": stalls, "rounds_in_cycle": len(rounds), "cycle": last.cycle}
    stalled = stalls >= cfg.patience
    out_of_rounds = len(rounds) >= cfg.max_rounds

    if not stalled and not out_of_rounds:
        return Decision(
            CONTINUE,
            f"held-out accuracy {last.heldout_accuracy:.3f} (gain {gain:+.3f}); another GRPO round",
            evidence,
            warning,
        )
    why = (
        f"no gain of {cfg.min_delta} for {stalls} evaluation(s) (patience {cfg.patience})"
        if stalled
        else f"all {cfg.max_rounds} GRPO round(s) of cycle {last.cycle} used"
    )
    if last.cycle < cfg.max_cycles:
        return Decision(BACK_TO_SFT, f"{why}; back to SFT for cycle {last.cycle + 1}", evidence, warning)
    if stalled:
        return Decision(STALLED, f"{why}, and all {cfg.max_cycles} cycle(s) are used", evidence, warning)
    return Decision(BUDGET_SPENT, f"{why}, and all {cfg.max_cycles} cycle(s) are used", evidence, warning)
