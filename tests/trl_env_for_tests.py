"""An environment written for TRL's `environment_factory`, as TRL's documentation writes one: nothing of Regimen
is imported. `reset(**row)` takes the dataset row, the public method is the tool (its docstring is its
schema), `get_reward()` scores the episode from the environment's own state."""


class HiddenLine:
    """f(x) = a*x + b is hidden in each row; the model may ask for f at a point with the `probe` tool."""

    def __init__(self):
        self.row = {}
        self.asked = []

    def reset(self, **row):
        self.row = row
        self.asked = []
        return None

    def probe(self, x: int) -> str:
        """Evaluate the hidden function f at x.

        Args:
            x: the point at which to evaluate f
        """
        if not isinstance(x, int) or isinstance(x, bool):
            raise ValueError(f"x must be an integer, got {x!r}")
        self.asked.append(x)
        return str(int(self.row["a"]) * x + int(self.row["b"]))

    def get_reward(self) -> float:
        """1.0 when the episode probed the very point the question asks about."""
        return 1.0 if self.row.get("x") in self.asked else 0.0


def final_answer_is_f(prompts, completions, environments=None, **kwargs):
    """A reward of the user's that reads the environments: the last assistant message is f at the asked point."""
    out = []
    for completion, env in zip(completions, environments or [None] * len(completions)):
        last = next((m for m in reversed(completion) if m.get("role") == "assistant"), {})
        if env is None or last.get("tool_calls"):
            out.append(0.0)
            continue
        out.append(1.0 if str(last.get("content", "")).strip() == str(env.row.get("answer")) else 0.0)
    return out
