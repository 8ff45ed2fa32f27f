"""`probe`: a hidden line f(x) = a*x + b per row; the user asks for f at one point and shows no example, so
the answer cannot be known without the `probe(x)` tool, which returns f(x). The episode is right when the
final answer is f at the asked point. The embedded model learns the tool-call format from the oracle's
traces (`tasks/tool_probe.py`) and GRPO sharpens its use."""

from __future__ import annotations

from regimen.stages.environments.base import Environment, register, tool


@register("probe")
class ProbeEnvironment(Environment):
    max_turns = 2

    @tool
    def probe(self, x: int) -> str:
        """Evaluate the hidden function f at x.

        Args:
            x: the point at which to evaluate f
        """
        row = self.episode.row
        if not isinstance(x, int) or isinstance(x, bool) or abs(x) > 10**6:
            raise ValueError(f"x must be an integer within +-10^6, got {x!r}")
        return str(int(row["a"]) * x + int(row["b"]))

    def _score(self, final_answer: str) -> float:
        return 1.0 if final_answer.strip() == str(self.episode.row["answer"]) else 0.0
