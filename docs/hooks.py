"""mkdocs hook: the reference and benchmark pages are generated from the code before every build
(`docs/gen_reference.py`), so the site cannot drift from what it describes."""

from __future__ import annotations

import sys
from pathlib import Path


def on_pre_build(config, **kwargs) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import gen_reference

    gen_reference.generate()
