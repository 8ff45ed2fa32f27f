"""A stop signal (SIGTERM, Ctrl-C) is never lost while a stage runs.

Python runs a signal handler in the main thread at whatever bytecode it is executing. When that is a finaliser
(`__del__`, a weakref callback, a garbage-collector callback: torch, tokenizers and the HTTP clients have many),
the handler's exception (Prefect's `TerminationSignal` for SIGTERM, `KeyboardInterrupt` for Ctrl-C) is printed as
"Exception ignored in ..." and dropped: training went on to its last step and the run exited 0 after a SIGTERM
(seen once in CI). While a stage runs, `noticed()` wraps the handlers in place so that a handler that raised is
remembered, and `deliver()`, called at safe points (after every training step, and when the stage returns),
raises it again there. A handler that raised and whose exception did propagate ends the stage, and with it the
`noticed()` block: nothing is raised twice. Written here because no library covers it: the standard library
offers no hook for an exception lost in a finaliser besides `sys.unraisablehook`, which cannot raise.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator

# (signal number, the handler that raised for it) noticed while a stage runs, not raised where it can stop it yet
_PENDING: list[tuple[int, Callable]] = []


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
            except BaseException:
                _PENDING.append((num, handler))
                raise

        signal.signal(signum, remembering)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _PENDING.clear()


def deliver() -> None:
    """Raise here a stop signal whose exception was lost (see the module doc); nothing when none was."""
    if _PENDING:
        signum, handler = _PENDING[-1]
        _PENDING.clear()
        handler(signum, None)
