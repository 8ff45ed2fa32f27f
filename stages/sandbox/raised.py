"""The solution's exceptions on the judge's side of the channel: the classes J makes for those the
solution defines (`solution_exceptions`), the exception J raises for what S reports it raised
(`_exception`), and how J names a test's own exception to S (a callable of the test's that raised).

Only names cross: every class here is J's own, made from names, so a claim S makes about its classes'
bases can give the tests no more than an exception S could have raised anyway (never StopIteration,
which would end a test's loop early, nor anything that is not an Exception, which would end the test).

Stdlib only: the server imports it by path (`python -I -S`).
"""

from __future__ import annotations

import builtins

_NEVER_RAISE = (StopIteration, StopAsyncIteration)
CLAIMS_DEPTH = 50
"""Reported bases followed in a row: the solution defines a class's bases before it, so honest code
needs one; a longer chain is a claim built to exhaust the judge's stack."""


class SolutionError(Exception):
    """An exception raised by the solution whose class is not a builtin one, or a failed call."""


class SolutionEnded(SolutionError):
    """The solution's process ended (it exited, crashed, was killed or broke the protocol)."""


def _exception_names(exc: BaseException) -> list:
    """The names of the builtin classes an exception of J's derives from, its own class's first."""
    return [type(exc).__name__] + [
        c.__name__ for c in type(exc).__mro__[1:8] if getattr(builtins, c.__name__, None) is c
    ]


def _text(exc: BaseException) -> str:
    try:
        return str(exc)[:2000]
    except Exception:
        return ""


def solution_exceptions(reported: dict) -> dict:
    """J's own classes for the solution's top-level exception classes, from the names S reported
    ({name: [its name, its bases' names...]}), so that tests can catch them (`except MyError`,
    `pytest.raises(MyError)`) and as their builtin bases. Each derives from J's class for the first base
    that is also reported, else from the first builtin base that is an Exception (never StopIteration,
    nor anything that is not an Exception: a claim of SystemExit is ignored), else from SolutionError (and
    is then named SolutionError, as the exception always arrived). Only names are taken from S: the
    classes, their methods and their hierarchy are J's, so a lie about the bases can make the class no
    more than an exception S could have raised anyway."""
    made: dict = {}
    reported = {
        k: v for k, v in list(reported.items())[:1000] if type(k) is str and k.isidentifier() and type(v) is list
    }

    def make(name: str, depth: int = 0):
        if name in made:
            return made[name]  # None while being made: a cycle in the claims
        if depth > CLAIMS_DEPTH:  # a chain of claims deeper than honest code makes (its bases come first): not followed
            return None
        made[name] = None
        parent_cls = builtin_cls = None
        for parent in reported[name][1:8]:
            if type(parent) is not str or parent == name:
                continue
            if parent in reported:
                parent_cls = parent_cls or make(parent, depth + 1)
                continue
            cls = getattr(builtins, parent, None)
            if (
                builtin_cls is None
                and isinstance(cls, type)
                and issubclass(cls, Exception)
                and cls is not Exception
                and not issubclass(cls, _NEVER_RAISE)
            ):
                builtin_cls = cls
        bases = tuple(b for b in (parent_cls, builtin_cls) if b is not None)
        if parent_cls is not None and builtin_cls is not None and issubclass(parent_cls, builtin_cls):
            bases = (parent_cls,)
        attrs = {"__module__": "solution", "solution_name": name}
        if not bases:
            made[name] = type("SolutionError", (SolutionError,), attrs)
        else:
            try:
                made[name] = type(name, bases, attrs)
            except TypeError:  # bases whose layouts do not mix (OSError and KeyError): the first one
                made[name] = type(name, bases[:1], attrs)
        return made[name]

    for name in reported:
        make(name)
    return {k: v for k, v in made.items() if v is not None}


def _exception(names: list, message: str, classes: dict | None = None) -> Exception:
    own = classes.get(names[0]) if classes and names and type(names[0]) is str else None
    if own is not None:
        try:
            return own(
                f"{names[0][:100]}: {message}"
                if issubclass(own, SolutionError) and own.__name__ == "SolutionError"
                else message
            )
        except Exception:
            pass
    for name in names[:8]:
        cls = getattr(builtins, name, None) if type(name) is str else None
        if (
            isinstance(cls, type)
            and issubclass(cls, Exception)
            and cls is not Exception
            and not issubclass(cls, _NEVER_RAISE)
        ):
            try:
                return cls(message)
            except Exception:  # a constructor that wants other arguments: try the next base
                continue
    first = names[0] if names and type(names[0]) is str else "Exception"
    return SolutionError(f"{first[:100]}: {message}")
