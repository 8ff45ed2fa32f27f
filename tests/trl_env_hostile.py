"""Environment classes written to TRL's `environment_factory` protocol (nothing of Regimen is imported) that an
attacker or an unlucky user writes: a tool that never returns, one that floods, one whose result cannot be made
text, an async tool that hangs, a reset that raises, a class with no tools. Used by tests/test_environments.py."""

import asyncio
import threading

from trl_env_for_tests import HiddenLine

RELEASE = threading.Event()  # set by a test to let the hung calls end (their threads are daemons either way)
FOREVER = threading.Event()  # set only when a test ends


class Unprintable:
    def __str__(self):
        raise RuntimeError("no text for you")


class Hostile:
    """Each tool is one way a tool call goes wrong."""

    def __init__(self):
        self.row = {}
        self.calls = 0

    def reset(self, **row):
        self.row = row
        return None

    def hang(self, x: int) -> str:
        """Never return (until the test releases it).

        Args:
            x: anything
        """
        self.calls += 1
        RELEASE.wait()
        return "late"

    def flood(self, mb: int) -> str:
        """Return mb megabytes of text.

        Args:
            mb: how many megabytes
        """
        return "y" * (mb * 1_000_000)

    def opaque(self) -> object:
        """Return an object whose str() raises."""
        return Unprintable()

    async def slow(self, x: int) -> str:
        """An async tool that awaits forever.

        Args:
            x: anything
        """
        await asyncio.sleep(3600)
        return "late"

    def fine(self, x: int) -> int:
        """Return x plus one.

        Args:
            x: a number
        """
        return x + 1


class HangingLine(HiddenLine):
    """HiddenLine whose probe sleeps 2 s (ten times a 0.2 s limit) at a point x = 1 (mod 4): an episode that asks there
    times out, the others answer, so groups still differ. A probe that never returns at all would hold the class's
    eight abandoned calls for good, and every later call would be refused: the run would still finish, but its smoke
    test would see no reward variation (tests/test_environments.py covers that cap with a tool that never returns)."""

    def probe(self, x: int) -> str:
        """Evaluate the hidden function f at x.

        Args:
            x: the point at which to evaluate f
        """
        if isinstance(x, int) and x % 4 == 1:
            FOREVER.wait(2)
        return super().probe(x)


class BrokenReset(HiddenLine):
    """A class whose reset raises on every row."""

    def reset(self, **row):
        raise KeyError("no such board")


class NoTools:
    """A class with reset and nothing else: the model has no tool to call."""

    def reset(self, **row):
        return None


class SelfCalling:
    """Tools that call the class's own public methods, a static tool, and a get_reward built on a tool: a bounded
    call's inner calls are plain method calls (numbers stay numbers)."""

    def __init__(self):
        self.points = 0

    def reset(self, **row):
        self.points = self.score()  # a public method called from reset
        return None

    def score(self) -> int:
        """The points so far."""
        return self.points

    def add(self, n: int) -> int:
        """Add n points.

        Args:
            n: points to add
        """
        self.points = self.score() + n
        return self.points

    @staticmethod
    def double(n: int) -> int:
        """Twice n.

        Args:
            n: a number
        """
        return 2 * n

    def get_reward(self) -> float:
        return float(self.score())
