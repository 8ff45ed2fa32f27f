"""What a run prints on the terminal: quiet by default, everything with `--verbose`.

Quiet: one line when each stage starts and one when it ends, with its key figures (the `regimen.run`
logger), a progress bar per training stage (`stages/training/progress.py`), warnings and errors, then the
run's table. Prefect's console lines below WARNING, the libraries' progress bars (datasets, transformers'
weight loading and saving) and the deprecation notices transformers and TRL raise from their own code are
not shown. Prefect's log (the UI) keeps every line either way: only the terminal is quieter.

Verbose (`REGIMEN_VERBOSE=1`, what `--verbose` sets): everything the libraries print, as they print it.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from contextlib import contextmanager

LIBRARIES = r"(transformers|trl|accelerate|peft|datasets|torch|huggingface_hub)(\.|$)"


class QuietFailures(logging.Filter):
    """Keep Prefect's tracebacks and 'Finished in state Failed' lines off the terminal (they stay in
    Prefect's log, which uses another handler): the CLI prints one line of its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.levelno >= logging.ERROR:
            return False
        msg = record.getMessage()
        if record.levelno >= logging.ERROR and "Traceback (most recent call last)" in msg:
            return False
        return not ("Finished in state" in msg and any(s in msg for s in ("Failed", "Cancelled", "Crashed")))


class QuietShutdown(logging.Filter):
    """Quiet mode: Prefect's queue services (its events worker) report "Still processing items: N items remaining..."
    while they send what is left as a run ends; that progress note came before a refused run's one-line error. The
    events are still sent, and `--verbose` shows the note."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno == logging.WARNING and record.getMessage().startswith("Still processing items"))


def _terminal_handlers():
    from prefect.logging.configuration import ensure_logging_setup
    from prefect.logging.handlers import PrefectConsoleHandler

    ensure_logging_setup()  # Prefect configures its handlers lazily: make them exist, then adjust them
    names = [""] + [n for n in list(logging.root.manager.loggerDict) if n.startswith("prefect")]
    for logger in (logging.getLogger(n) for n in names):
        for handler in logger.handlers:
            if isinstance(handler, PrefectConsoleHandler) or (
                isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler)
            ):
                yield handler


class StageLines(logging.Handler):
    """The `regimen.run` logger's lines (a stage started, a stage ended), printed plainly."""

    def __init__(self, console):
        super().__init__(logging.INFO)
        self.console = console

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:  # Prefect's console handler prints warnings already: once is enough
            return
        try:
            self.console.print(record.getMessage(), markup=False, highlight=False, soft_wrap=True)
        except Exception:  # noqa: BLE001 - the terminal is never worth failing a run
            self.handleError(record)


@contextmanager
def terminal(console, *, verbose: bool):
    """Quiet (or verbose) terminal output for one run; restores what it changed when the run ends."""
    previous_env = os.environ.get("REGIMEN_VERBOSE")
    os.environ["REGIMEN_VERBOSE"] = "1" if verbose else "0"
    changed: list[tuple[logging.Handler, int]] = []
    quieted: list[logging.Handler] = []

    for handler in _terminal_handlers():
        if getattr(handler, "console", None) is not None and getattr(handler.console, "file", None) is not sys.stderr:
            handler.console.file = sys.stderr  # the terminal of this run (a process that runs several: the tests)
        if not any(isinstance(f, QuietFailures) for f in handler.filters):
            handler.addFilter(QuietFailures())
        if not verbose and handler.level < logging.WARNING:
            changed.append((handler, handler.level))
            handler.setLevel(logging.WARNING)
        if not verbose and not any(isinstance(f, QuietShutdown) for f in handler.filters):
            handler.addFilter(QuietShutdown())
            quieted.append(handler)
    lines = StageLines(console)
    run_log = logging.getLogger("regimen.run")
    run_log.addHandler(lines)
    with warnings.catch_warnings():
        if not verbose:
            for category in (FutureWarning, DeprecationWarning, UserWarning):
                warnings.filterwarnings("ignore", category=category, module=LIBRARIES)
            _library_bars(enabled=False)
        try:
            yield
        finally:
            run_log.removeHandler(lines)
            for handler, level in changed:
                handler.setLevel(level)
            for handler in quieted:
                handler.removeFilter(next(f for f in handler.filters if isinstance(f, QuietShutdown)))
            if not verbose:
                _library_bars(enabled=True)
            if previous_env is None:
                os.environ.pop("REGIMEN_VERBOSE", None)
            else:
                os.environ["REGIMEN_VERBOSE"] = previous_env


def _library_bars(*, enabled: bool) -> None:
    """The progress bars datasets, transformers and the hub show (map, weight loading and saving)."""
    import datasets
    import huggingface_hub.utils as hub
    from transformers.utils import logging as tf_logging

    (datasets.enable_progress_bars if enabled else datasets.disable_progress_bars)()
    (hub.enable_progress_bars if enabled else hub.disable_progress_bars)()
    (tf_logging.enable_progress_bar if enabled else tf_logging.disable_progress_bar)()
    (tf_logging.set_verbosity_warning if enabled else tf_logging.set_verbosity_error)()
