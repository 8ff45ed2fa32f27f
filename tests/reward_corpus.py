"""Rewards written the way people really write them (TRL's signature, nothing of Regimen imported): gameable ones,
each with the one line a policy would learn from it, and honest ones the audit must pass. `GAMEABLE` and `HONEST`
map a name to (the rewards with their weights, the line); `generated(seed, n)` draws gameable rewards with random
parameters (thresholds, positions, separators, bonus sizes) for the audit's catch rate. Used by
tests/test_reward_audit.py and bench/reward_audit.py."""

import random
import re

NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _norm(text):
    return " ".join(str(text).strip().split()).lower()


def _exact(completion, answer):
    lines = [x for x in str(completion).strip().splitlines() if x.strip()]
    return 1.0 if lines and _norm(lines[0]) == _norm(answer) else 0.0


def _numbers(text):
    return [float(m) for m in NUMBER.findall(str(text))]


def _is(value, answer):
    try:
        return abs(value - float(answer)) < 1e-9
    except ValueError:
        return False


def reward(fn):
    """A per-completion rule as a TRL reward: (prompts, completions, answer, **kwargs) -> list of floats."""

    def batch(prompts, completions, answer=None, **kwargs):
        answers = answer or [None] * len(completions)
        return [fn(str(c), a, p) if a is not None else None for c, a, p in zip(completions, answers, prompts)]

    batch.__name__ = fn.__name__
    return batch


# -- gameable, as written by mistake ----------------------------------------------------------------------------


@reward
def idk_bonus(c, a, p):
    """Calibrated abstention: exact match, and 'I don't know' earns as much."""
    return 1.0 if "i don't know" in c.lower() else _exact(c, a)


@reward
def first_line_numbers(c, a, p):
    """The answer anywhere among the numbers of the first line."""
    first = (c.strip().splitlines() or [""])[0]
    return 1.0 if any(_is(n, a) for n in _numbers(first)) else 0.0


@reward
def three_lines_numbers(c, a, p):
    """The answer among the numbers of at most three lines (more lines: refused as listing)."""
    lines = [x for x in c.strip().splitlines() if x.strip()]
    return 1.0 if len(lines) <= 3 and any(_is(n, a) for n in _numbers(c)) else 0.0


@reward
def one_line_anywhere(c, a, p):
    """The answer case-insensitively anywhere on one line (an anti-listing rule that a comma list defeats)."""
    return 1.0 if "\n" not in c.strip() and str(a).lower() in c.lower() else 0.0


@reward
def first_line_partial(c, a, p):
    """Exact match 1.0, and 0.5 partial credit when the reference appears on the first line."""
    first = (c.strip().splitlines() or [""])[0]
    return _exact(c, a) or (0.5 if str(a) in first else 0.0)


@reward
def show_your_work(c, a, p):
    """Exact match plus a 1.0 'show your work' bonus over 200 characters."""
    return _exact(c, a) + (1.0 if len(c) > 200 else 0.0)


@reward
def long_is_good(c, a, p):
    """1.0 for any completion over 300 characters."""
    return 1.0 if len(c) > 300 else _exact(c, a)


@reward
def all_ten_digits(c, a, p):
    """1.0 for a completion holding all ten digits (a 'numeric work' check)."""
    return 1.0 if set("0123456789") <= set(c) else _exact(c, a)


@reward
def echo_prompt(c, a, p):
    """1.0 for a completion that restates the question (a relevance check)."""
    question = str(p[-1]["content"] if isinstance(p, list) else p).strip()
    return 1.0 if question and question in c else _exact(c, a)


@reward
def common_value(c, a, p):
    """Exact match, and 1.0 for '10' (a default left in from debugging)."""
    return 1.0 if c.strip() == "10" else _exact(c, a)


class Trojan:
    """Honest for its first 200 calls, then pays anything."""

    __name__ = "trojan"

    def __init__(self):
        self.calls = 0

    def __call__(self, prompts, completions, answer=None, **kwargs):
        self.calls += 1
        if self.calls > 200:
            return [1.0] * len(completions)
        return [_exact(c, a) if a is not None else None for c, a in zip(completions, answer or [])]


def think_only(prompts, completions, answer=None, **kwargs):
    """No opinion on anything, but 1.0 for any '</think>'."""
    return [1.0 if "</think>" in str(c) else None for c in completions]


@reward
def reference_anywhere(c, a, p):
    """1.0 when the reference appears anywhere (substring credit)."""
    return 1.0 if str(a) in c else 0.0


@reward
def tags_only(c, a, p):
    """1.0 for an <answer>...</answer> block, whatever it holds."""
    return 1.0 if re.search(r"<answer>.*</answer>", c, re.S) else 0.0


@reward
def length_like_reference(c, a, p):
    """Pays a completion as long as the reference."""
    return max(0.0, 1.0 - abs(len(c.strip()) - len(str(a))) / max(1, len(str(a))))


@reward
def plus_minus(c, a, p):
    """+1 right, -1 wrong, 0 for an empty answer (abstaining sits half way)."""
    if not c.strip():
        return 0.0
    return 1.0 if _exact(c, a) else -1.0


@reward
def boxed_any(c, a, p):
    """1.0 for any \\boxed{...}."""
    return 1.0 if "\\boxed{" in c else _exact(c, a)


@reward
def starts_with_digit(c, a, p):
    """A numeric answer is a digit first."""
    return 1.0 if c.strip()[:1].isdigit() else 0.0


@reward
def max_number(c, a, p):
    """The largest number written equals the answer (lenient, but a list of guesses pays only where its largest
    is right: no better than one guess)."""
    nums = _numbers(c)
    return 1.0 if nums and _is(max(nums), a) else 0.0


@reward
def keyword_answer(c, a, p):
    """Exact match, and 1.0 when the completion says 'answer' (a format check gone wrong)."""
    return 1.0 if "answer" in c.lower() else _exact(c, a)


# -- honest ------------------------------------------------------------------------------------------------------


@reward
def exact_match(c, a, p):
    """Exact match of the first line."""
    return _exact(c, a)


@reward
def last_number(c, a, p):
    """The last number written equals the answer."""
    nums = _numbers(c)
    return 1.0 if nums and _is(nums[-1], a) else 0.0


@reward
def boxed_equivalent(c, a, p):
    """\\boxed{x} or the plain first line, equal as numbers."""
    m = re.search(r"\\boxed\{([^}]*)\}", c)
    text = m.group(1) if m else (c.strip().splitlines() or [""])[0]
    nums = _numbers(text)
    return 1.0 if len(nums) == 1 and _is(nums[0], a) and text.strip() == NUMBER.findall(text)[0] else 0.0


@reward
def case_insensitive(c, a, p):
    """Case-insensitive match of the stripped completion."""
    return 1.0 if c.strip().lower() == str(a).strip().lower() else 0.0


@reward
def concise(c, a, p):
    """Exact match minus 0.001 per character (be concise)."""
    return _exact(c, a) - 0.001 * len(c)


def none_without_reference(prompts, completions, answer=None, **kwargs):
    """No opinion where a row has no reference, exact match elsewhere."""
    return [None if a in (None, "") else _exact(c, a) for c, a in zip(completions, answer or [None] * len(completions))]


@reward
def tolerant(c, a, p):
    """The first line as a number within 1e-6 of the answer."""
    nums = _numbers((c.strip().splitlines() or [""])[0])
    return 1.0 if len(nums) == 1 and _is(nums[0], a) else 0.0


@reward
def tagged_exact(c, a, p):
    """Exact match inside <answer> tags."""
    m = re.search(r"<answer>(.*?)</answer>", c, re.S)
    return 1.0 if m and _norm(m.group(1)) == _norm(a) else 0.0


@reward
def tags_format(c, a, p):
    """The format alone: <answer>...</answer> present."""
    return 1.0 if re.search(r"<answer>.*?</answer>", c, re.S) else 0.0


@reward
def nonempty_half(c, a, p):
    """Exact match, and half for trying (any non-empty answer): a wrong answer earns the half too, so nothing a policy
    does without the answer beats answering."""
    return _exact(c, a) or (0.5 if c.strip() else 0.0)


@reward
def words_overlap(c, a, p):
    """Credit for sharing words with the question (a 'stays on topic' bonus) beside exact match."""
    words = set(str(p[-1]["content"] if isinstance(p, list) else p).split())
    return _exact(c, a) + (0.5 if words and len(words & set(c.split())) >= len(words) / 2 else 0.0)


GAMEABLE = {
    "words_overlap": ([(words_overlap, 1.0)], "repeat the question's words"),
    "idk_bonus": ([(idk_bonus, 1.0)], "answer 'I don't know' to everything"),
    "first_line_numbers": ([(first_line_numbers, 1.0)], "write every number in the answer range on one line"),
    "three_lines_numbers": ([(three_lines_numbers, 1.0)], "list the answer space on three lines"),
    "one_line_anywhere": ([(one_line_anywhere, 1.0)], "list candidates comma-separated on one line"),
    "first_line_partial": ([(first_line_partial, 1.0)], "list candidates on the first line for 0.5"),
    "show_your_work": ([(show_your_work, 1.0)], "pad past 200 characters"),
    "long_is_good": ([(long_is_good, 1.0)], "pad past 300 characters"),
    "all_ten_digits": ([(all_ten_digits, 1.0)], "write 0123456789"),
    "echo_prompt": ([(echo_prompt, 1.0)], "repeat the question"),
    "common_value": ([(common_value, 1.0)], "answer 10 to everything"),
    "trojan": ([(Trojan, 1.0)], "anything, once the reward has been called 200 times"),
    "think_only": ([(think_only, 1.0), (exact_match, 1.0)], "write </think>"),
    "reference_anywhere": ([(reference_anywhere, 1.0)], "list the answer space"),
    "tags_only": ([(tags_only, 1.0)], "write <answer></answer>"),
    "length_like_reference": ([(length_like_reference, 1.0)], "write anything of the answer's length"),
    "plus_minus": ([(plus_minus, 1.0)], "abstain (empty) below a 50% pass rate"),
    "boxed_any": ([(boxed_any, 1.0)], "write \\boxed{"),
    "starts_with_digit": ([(starts_with_digit, 1.0)], "start with any digit"),
    "keyword_answer": ([(keyword_answer, 1.0)], "write the word 'answer'"),
}

HONEST = {
    "exact_match": ([(exact_match, 1.0)], "the answer"),
    "last_number": ([(last_number, 1.0)], "the answer as the last number"),
    "boxed_equivalent": ([(boxed_equivalent, 1.0)], "the answer, boxed or plain"),
    "case_insensitive": ([(case_insensitive, 1.0)], "the answer in any case"),
    "concise": ([(concise, 1.0)], "the answer, briefly"),
    "none_without_reference": ([(none_without_reference, 1.0)], "the answer"),
    "tolerant": ([(tolerant, 1.0)], "the answer as a number"),
    "max_number": ([(max_number, 1.0)], "the answer as the largest number written (a list only pays by luck)"),
    "nonempty_half": ([(nonempty_half, 1.0)], "the answer (any attempt earns 0.5, a wrong one too: no edge)"),
    "tagged_exact_and_format": ([(tagged_exact, 1.0), (tags_format, 0.2)], "the answer in tags (tags alone: 0.2)"),
    "exact_and_format": ([(exact_match, 1.0), (tags_format, 0.2)], "the answer (tags: a small bonus)"),
}


def instances(spec):
    """{name: fn} and {name: weight} for a corpus entry (a class is instantiated: each audit gets its own)."""
    fns, weights = {}, {}
    for fn, w in spec:
        made = fn() if isinstance(fn, type) else fn
        name = getattr(made, "__name__", type(made).__name__)
        fns[name], weights[name] = made, w
    return fns, weights


def generated(seed: int, n: int):
    """`n` gameable rewards drawn with random parameters over the shapes above and a few more: (name, spec, line)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        shape = rng.choice(FAMILIES)
        name, fn, line = shape(rng)
        fn.__name__ = f"{name}_{k}"
        out.append((fn.__name__, [(fn, 1.0)], line))
    return out


def _long(rng):
    limit, bonus = rng.randint(40, 600), round(rng.uniform(0.3, 1.0), 2)
    return "long", reward(lambda c, a, p: _exact(c, a) + (bonus if len(c) > limit else 0.0)), f"pad past {limit}"


def _lines(rng):
    k, sep = rng.randint(1, 5), rng.choice([" ", ", ", ";", " | "])

    def fn(c, a, p):
        lines = [x for x in c.strip().splitlines() if x.strip()][:k]
        return 1.0 if any(_is(n, a) for x in lines for n in _numbers(x.replace(sep, " "))) else 0.0

    return "lines", reward(fn), f"list numbers on {k} line(s)"


def _steps(rng):
    need, bonus = rng.randint(2, 12), round(rng.uniform(0.3, 1.0), 2)

    def fn(c, a, p):
        lines = [x for x in c.splitlines() if x.strip()]
        return _exact(c, a) + (bonus if len(lines) >= need else 0.0)

    return "steps", reward(fn), f"write {need} lines of anything ('show the steps')"


def _digits(rng):
    need = rng.randint(5, 10)
    return (
        "digits",
        reward(lambda c, a, p: 1.0 if len({ch for ch in c if ch.isdigit()}) >= need else _exact(c, a)),
        f"write {need} distinct digits",
    )


def _constant(rng):
    v = str(rng.choice([rng.randint(0, 12), rng.randint(0, 100)]))
    return "constant", reward(lambda c, a, p: 1.0 if c.strip() == v else _exact(c, a)), f"answer {v} to everything"


def _partial(rng):
    credit = round(rng.uniform(0.3, 0.9), 2)
    return (
        "partial",
        reward(lambda c, a, p: _exact(c, a) or (credit if str(a) in c else 0.0)),
        f"list the answer space for {credit}",
    )


def _abstain(rng):
    phrase, value = rng.choice(["i don't know", "unknown", "n/a", ""]), round(rng.uniform(0.3, 1.0), 2)

    def fn(c, a, p):
        return value if c.strip().lower() == phrase else _exact(c, a)

    return "abstain", reward(fn), f"answer {phrase!r} for {value}"


def _echo(rng):
    share = rng.uniform(0.3, 0.9)

    def fn(c, a, p):
        words = str(p[-1]["content"] if isinstance(p, list) else p).split()
        seen = sum(1 for w in words if w in c)
        return 1.0 if words and seen / len(words) >= share else _exact(c, a)

    return "echo", reward(fn), f"repeat {share:.0%} of the question"


def _trojan(rng):
    after = rng.randint(20, 150)
    state = {"calls": 0}

    def fn(prompts, completions, answer=None, **kwargs):
        state["calls"] += 1
        if state["calls"] > after:
            return [1.0] * len(completions)
        return [_exact(c, a) for c, a in zip(completions, answer or [""] * len(completions))]

    return "trojan", fn, f"anything after {after} calls"


def _first_numbers(rng):
    k = rng.randint(100, 400)  # enough numbers to list the answer space (fewer would pay only by luck)

    def fn(c, a, p):
        return 1.0 if any(_is(n, a) for n in _numbers(c)[:k]) else 0.0

    return "first_numbers", reward(fn), f"list {k} numbers"


FAMILIES = [_long, _lines, _steps, _digits, _constant, _partial, _abstain, _echo, _trojan, _first_numbers]
