"""A user's `pkg.module:attr` name (a reward, an environment class) imported before its registry loads it, so that a
module that raises while it loads is one line naming the field, wherever the name came from (a recipe, `reward-check
--reward`). The registries catch what a name can get wrong (a missing module or attribute); this catches what the
module's own code can do at import. It lives here, outside every stage's code version, so that the registries (which
are inside them) keep theirs."""

from __future__ import annotations

import importlib


def import_problem(name: str) -> str | None:
    """Import the module of `name` (`pkg.module:attr`); what it raised while loading (any exception, a syntax error,
    `sys.exit`), as one line, else None. A missing module is left to the registry that loads the name."""
    if ":" not in name:
        return None
    module = name.partition(":")[0]
    try:
        importlib.import_module(module)
    except ImportError:
        return None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - a user's module may raise anything at import
        said = (str(exc).strip().splitlines() or [""])[0]
        return f"{name!r}: importing {module} raised {type(exc).__name__}: {said}"
    return None
