"""`code`: a code problem (MBPP-style rows: `prompt`, `tests` or `test_list`, optional `entry_point`) as an
environment. `run_tests(code)` runs the candidate in the sandbox against the row's first test only, the
visible example, and says whether it passed (rows of other formats have no separate visible test: the
tool says so rather than reveal the hidden tests' verdict); the episode's reward is the `unit_tests` reward of
the final answer on all of the row's tests (hidden ones included). The sandboxed judge is the tool."""

from __future__ import annotations

from typing import Any

from regimen.stages.environments.base import Environment, register, tool
from regimen.stages.rewards import get_reward

TEST_COLUMNS = ("tests", "test_list")


def _columns(row: dict[str, Any], *, visible_only: bool) -> dict[str, list[Any]]:
    cols = {k: [v] for k, v in row.items() if k not in ("prompt", "completion", "prompt_id")}
    if visible_only:
        for key in TEST_COLUMNS:
            if isinstance(row.get(key), list) and row[key]:
                cols[key] = [row[key][:1]]
    return cols


@register("code")
class CodeEnvironment(Environment):
    max_turns = 3

    def __init__(self, max_turns: int | None = None, **options: Any):
        super().__init__(max_turns)

        self._judge = get_reward("unit_tests", **options)

    @tool
    def run_tests(self, code: str) -> str:
        """Run Python code against the problem's visible example test in a sandbox.

        Args:
            code: the complete solution, as Python source
        """
        if not isinstance(code, str) or not code.strip():
            raise ValueError("code must be non-empty Python source")
        row = self.episode.row
        if not any(isinstance(row.get(k), list) and row[k] for k in TEST_COLUMNS):
            # other formats (HumanEval's `test`, stdin/stdout cases) carry no separate visible example: running
            # them would show the hidden tests' verdict, so the tool says so instead
            return "this problem has no visible example test to run"
        fenced = f"```python\n{code}\n```"
        value = self._judge(prompts=[row.get("prompt")], completions=[fenced], **_columns(row, visible_only=True))[0]
        if value is None:
            return "the example test could not be run (the row has no visible test)"
        return "the example test passed" if value >= 1.0 else "the example test failed"

    def _score(self, final_answer: str) -> float:
        row = self.episode.row
        value = self._judge(
            prompts=[row.get("prompt")], completions=[final_answer], **_columns(row, visible_only=False)
        )[0]
        return float(value or 0.0)
