"""An environment and a reward written as TRL's own 2048 example writes them (`examples/scripts/grpo_2048.py`):
nothing of Regimen is imported. `reset()` draws from the global `random` (no seed argument), its one tool changes the
game's state, and the reward is `reward_score(environments, **kwargs)`, reading each episode's environment."""

import random


class GuessGame:
    """A digit is hidden at each reset; the model guesses it with the `guess` tool, told higher or lower."""

    def __init__(self):
        self.secret = None
        self.solved = False

    def reset(self, **kwargs):
        self.secret = random.randint(0, 9)
        self.solved = False
        return " I picked a digit from 0 to 9."

    def guess(self, digit: int) -> str:
        """Guess the hidden digit.

        Args:
            digit: a digit from 0 to 9
        """
        if int(digit) == self.secret:
            self.solved = True
            return "correct"
        return "higher" if self.secret > int(digit) else "lower"


def reward_score(environments, **kwargs):
    """1.0 for an episode that found the digit (TRL's 2048 reward reads its environments the same way)."""
    return [1.0 if env.solved else 0.0 for env in environments]
