"""Rewards written as open-r1 writes them (`open_r1/rewards.py`), for the tests: no Regimen import; each reads
`completion[0]["content"]`, the assistant's message that TRL's GRPOTrainer hands a reward after a chat prompt."""

import re


def format_reward(completions, **kwargs):
    """open-r1's shape: the content is `<answer>...</answer>` (here without the think block, for a tiny model)."""
    pattern = r"^<answer>.*?</answer>$"
    contents = [completion[0]["content"] for completion in completions]
    return [1.0 if re.match(pattern, c.strip(), re.DOTALL) else 0.0 for c in contents]


def tag_count_reward(completions, **kwargs):
    """open-r1's shape: a quarter for each tag written once."""

    def count(text):
        return 0.5 * (text.count("<answer>") == 1) + 0.5 * (text.count("</answer>") == 1)

    return [count(completion[0]["content"]) for completion in completions]


def accuracy_reward(completions, answer, **kwargs):
    """open-r1's shape, with the task's `answer` column as the gold (a plain number: compared as text)."""
    rewards = []
    for completion, gold in zip(completions, answer):
        content = completion[0]["content"]
        found = re.search(r"<answer>(.*?)</answer>", content, re.DOTALL)
        rewards.append(1.0 if found and found.group(1).strip() == str(gold).strip() else 0.0)
    return rewards


SEEN = []


def kwargs_seen(prompts, completions, completion_ids=None, trainer_state=None, log_extra=None, log_metric=None, **kw):
    """Records what it was handed (as TRL 1.16 hands it: the columns, trainer_state, log_extra, log_metric)."""
    SEEN.append(
        {
            "completion": completions[0],
            "state_step": getattr(trainer_state, "global_step", "missing"),
            "log_extra": callable(log_extra),
            "log_metric": callable(log_metric),
            "columns": sorted(kw),
        }
    )
    if callable(log_metric):
        log_metric("seen", 1.0)
    return [0.0 for _ in completions]
