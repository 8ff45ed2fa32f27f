"""Number formatting shared by every table Regimen shows (terminal, Prefect artifacts, markdown)."""

from __future__ import annotations

import json
import math
from typing import Any


def num(v: Any) -> str:
    """A value for a table cell: integers plain, other floats with 3 decimals, NaN as 'nan'."""
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        return f"{v:.0f}" if v.is_integer() or abs(v) >= 1000 else f"{v:.3f}"
    return "" if v is None else str(v)


def rounded(v: Any, digits: int = 4) -> Any:
    """A value for a JSON table (Prefect's table artifacts): floats rounded, NaN as 'nan'."""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else round(v, digits)
    return v


def cell(v: Any, width: int = 120) -> str:
    """A markdown table cell: JSON for non-strings, pipes escaped, newlines shown as ⏎, bounded width."""
    text = json.dumps(v, ensure_ascii=False) if not isinstance(v, str) else v
    return text.replace("|", "\\|").replace("\n", "⏎")[:width]
