"""A stop signal (SIGTERM, Ctrl-C) is never lost while a stage runs.

Python runs a signal handler in the main thread at whatever bytecode it is executing. When that is a finaliser
(`__del__`, a weakref callback, a garbage-collector callback: torch, tokenizers and the HTTP clients have many),
the handler's exception (Prefect's `TerminationSignal` for SIGTERM, `KeyboardInterrupt` for Ctrl-C) is printed as
"Exception ignored in ..." and dropped: training went on to its last step and the run exited 0 after a SIGTERM
(seen once in CI). While a stage runs, `noticed()` wraps the handlers in place so that a handler that raised is
remembered, and `deliver()`, called at safe points (after every training step, and when the stage returns),
raises it again there. A handler that raised and whose exception did propagate ends the stage, and with it the
`noticed()` block: nothing is raised twice. While the block runs, `sys.unraisablehook` stays quiet about the lost
exceptions of these handlers (Python would print "Exception ignored in ..." and a traceback for a condition the user
caused with Ctrl-C, and the stop is delivered anyway); any other unraisable exception goes to the hook in place
before. Written here because no library covers it: the standard library offers no hook for an exception lost in a
finaliser besides `sys.unraisablehook`, which cannot raise.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Callable, Iterator

# (signal number, the handler that raised for it) noticed while a stage runs, not raised where it can stop it yet
_PENDING: list[tuple[int, Callable]] = []
_RAISED: list[BaseException] = []  # what those handlers raised: the unraisable hook stays quiet about these


def _quiet(previous: Callable) -> Callable:
    def hook(unraisable) -> None:
        if any(unraisable.exc_value is exc for exc in _RAISED):
            return  # a stop signal lost in a finaliser: delivered again at the next safe point (`deliver`)
        previous(unraisable)

    return hook


@contextlib.contextmanager
def noticed(signums: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> Iterator[None]:
    """While the block runs, remember every stop signal whose handler raised (see the module doc). Outside the
    main thread (where no handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Callable] = {}
    for signum in signums:
        handler = signal.getsignal(signum)
        if not callable(handler):  # SIG_IGN, SIG_DFL: nothing raises, nothing to remember
            continue
        previous[signum] = handler

        def remembering(num, frame, handler=handler):
            try:
                handler(num, frame)
            except BaseException as exc:
                _PENDING.append((num, handler))
                _RAISED.append(exc)
                raise

        signal.signal(signum, remembering)
    hook = sys.unraisablehook
    sys.unraisablehook = _quiet(hook)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook
        _PENDING.clear()
        _RAISED.clear()


def deliver() -> None:
    """Raise here a stop signal whose exception was lost (see the module doc); nothing when none was."""
    if _PENDING:
        signum, handler = _PENDING[-1]
        _PENDING.clear()
        handler(signum, None)
