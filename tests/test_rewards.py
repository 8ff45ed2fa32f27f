"""The reward library in stages/rewards/: answer, format, digits, weighted totals, the registry, value checks."""

from __future__ import annotations

import math

import pytest

from regimen.stages.core.errors import InputError
from regimen.stages.rewards import (
    answer,
    completion_text,
    digits,
    format_reward,
    get_reward,
    is_gameable,
    known_rewards,
    normalize_answer,
    score,
    weighted_total,
)
from regimen.stages.rewards.text import format_


def test_normalize_answer():
    assert normalize_answer(" 85 ") == normalize_answer("85.0") == normalize_answer("+85") == 85.0
    assert normalize_answer("1,000") == 1000.0
    assert normalize_answer("  Hello   World ") == "hello world"
    assert normalize_answer("") is None and normalize_answer(None) is None and normalize_answer("   ") is None
    assert normalize_answer("1e400") is None  # not finite


def test_completion_text_plain_and_chat():
    assert completion_text("hi") == "hi"
    assert (
        completion_text(
            [
                {"role": "assistant", "content": "a"},
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "b"},
            ]
        )
        == "ab"
    )
    assert completion_text({"content": "c"}) == "c"


def test_answer_exact_match_and_none_semantics():
    completions = ["4", "  4.0\nbecause 2+2", "5", [{"role": "assistant", "content": "1,000"}], "7", "7"]
    refs = ["4", 4, "4", "1000", None, "  "]
    assert answer([""] * 6, completions, answer=refs) == [1.0, 1.0, 0.0, 1.0, None, None]
    # a missing column is no opinion, never a free 1.0
    assert answer(["", ""], ["4", "x"]) == [None, None]
    # text answers compare case- and whitespace-insensitively; the first non-empty line counts
    assert answer([""] * 2, ["\n  Paris \nis the capital", "London"], answer=["paris", "Paris"]) == [1.0, 0.0]


def test_format_rewards():
    assert format_([""] * 3, ["42", "two\nlines", ""]) == [1.0, 0.0, 0.0]
    digits_only = get_reward("format", pattern=r"\d+")
    assert digits_only([""] * 3, ["42", " 42 ", "42a"]) == [1.0, 1.0, 0.0]
    assert digits_only.__name__ == "format" and not is_gameable(digits_only)
    with pytest.raises(InputError, match="not a valid regular expression"):
        format_reward("(unclosed")


def test_digits_is_gameable():
    assert is_gameable(get_reward("digits")) and "GAMEABLE ON PURPOSE" in digits.__doc__
    assert digits([""] * 3, ["123\nmore", "12a", "wrong 5"]) == [1.0, 0.0, 0.0]
    assert not is_gameable(get_reward("answer"))


def test_weighted_total_skips_none():
    per = {"answer": [1.0, None, 0.0, None], "format": [1.0, 1.0, None, None]}
    totals = weighted_total(per, {"answer": 1.0, "format": 0.1})
    assert totals[:3] == [pytest.approx(1.1), pytest.approx(0.1), 0.0]
    assert math.isnan(totals[3])  # nothing scored this sample
    assert weighted_total({}, {}) == []


def test_registry():
    names = known_rewards()
    assert {"answer", "format", "digits", "unit_tests", "code_block"} <= set(names)
    with pytest.raises(InputError, match="unknown reward"):
        get_reward("no_such_reward")
    with pytest.raises(InputError, match="takes no options"):
        get_reward("answer", pattern="x")
    fn = get_reward("regimen.stages.rewards:digits")
    assert fn is digits
    with pytest.raises(InputError, match="cannot load"):
        get_reward("regimen.stages.rewards:nope")


def test_score_checks_lengths():
    out = score({"answer": get_reward("answer")}, ["", ""], ["4", "5"], {"answer": ["4", "4"]})
    assert out == {"answer": [1.0, 0.0]}
    with pytest.raises(InputError, match="returned 1 values for 2"):
        score({"bad": lambda prompts, completions, **kw: [1.0]}, ["", ""], ["a", "b"], {})
