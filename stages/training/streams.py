"""GRPO's training set as a live stream: an endless `datasets.IterableDataset` whose generator asks an object (the
curriculum, the levels, the screen) for each next row as training goes, on TRL's public surface.

`datasets` hashes a generator's `gen_kwargs`, so the generator finds its source by a token rather than holding it;
the token's table is weak, so a finished stage's rows do not outlive it.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import Any

_LIVE: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()


def _generate(token: str) -> Iterator[dict[str, Any]]:
    yield from _LIVE[token].stream()


def dataset(source):
    """An endless `datasets.IterableDataset` of `source.stream()`'s rows."""
    from datasets import IterableDataset

    token = f"{type(source).__name__}-{os.getpid()}-{id(source)}"
    _LIVE[token] = source
    return IterableDataset.from_generator(_generate, gen_kwargs={"token": token})
