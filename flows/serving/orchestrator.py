"""Training does not depend on the orchestrator being up.

Prefect's client is built for brief blips: it retries each API call, its log and event services retry
each batch (an event waits about 7 s of reconnect attempts), and both drain their queues when the process
exits. When the server is gone for good that turns into minutes of stalls at every stage boundary, a
terminal full of "Error logging to API" and "EventsWorker failed" tracebacks, and a SIGTERM that takes
minutes to end the process. Nothing Prefect offers switches that off at run time, so this module (written
here for that reason; it uses only public APIs: logging filters, an HTTP health check, daemon threads):

- `watching()`, around a run, keeps a daemon thread asking the API's `/health` every few seconds; while it
  does not answer, `down()` is true, one warning says so (and one line when it answers again);
- while down, records bound for Prefect's API log handler are dropped, and so are the client's own
  connection-error lines (the warning above said it once); Regimen's artifacts are skipped (`Presenter`);
- `finish(result)`, called when a run is over: if the API is down, the CLI's presentation of the result is
  printed and the process ends with the run's exit code at once (`os._exit` after flushing the terminal),
  a served run's process `grace` seconds later, instead of waiting for Prefect's client to retry state
  changes (5 retries, 62 s of back-off per call) and its services to drain queues nobody will take. The
  store already holds everything the run did; the run's final state in Prefect is what the server last
  heard (a served run's, until `regimen serve` is back).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator

log = logging.getLogger("regimen.orchestrator")

_DOWN = threading.Event()
NOISY = (
    "prefect.events.clients",
    "prefect._internal.concurrency",
    "prefect.client",
    "prefect.runner",
    "prefect.flow_runs.runner",
)


def down() -> bool:
    """Whether Prefect's API stopped answering (as the last health check saw it)."""
    return _DOWN.is_set()


class _WhileUp(logging.Filter):
    """Drops records while the API is down (for Prefect's API log handler and the client's own noise)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _DOWN.is_set()


def mark_down() -> None:
    """Someone saw the API fail (a call stuck in retries): down until a health check says otherwise."""
    if not _DOWN.is_set():
        _DOWN.set()
        logging.raiseExceptions = False  # Prefect's log worker prints each failed batch to stderr unless this is off
        log.warning(DOWN_MESSAGE)


DOWN_MESSAGE = (
    "Prefect's API does not answer: training goes on; logs, events and artifacts for Prefect are dropped "
    "until it is back (the store keeps every result)"
)


def _health_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value() or os.environ.get("PREFECT_API_URL")
    return f"{url.rstrip('/')}/health" if url else None


def _headers() -> tuple[dict[str, str], tuple[str, str] | None]:
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_KEY

    key, auth = PREFECT_API_KEY.value(), PREFECT_API_AUTH_STRING.value()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    basic = tuple(auth.split(":", 1)) if auth and ":" in auth else None
    return headers, basic  # type: ignore[return-value]


def answers(timeout: float = 2.0) -> bool:
    """One health check of Prefect's API (True when there is no API to ask)."""
    import httpx

    url = _health_url()
    if url is None:
        return True
    headers, basic = _headers()
    try:
        return httpx.get(url, headers=headers, auth=basic, timeout=timeout).status_code < 500
    except httpx.HTTPError:
        return False


def _install_filters() -> None:
    from prefect.logging.handlers import APILogHandler

    loggers = [
        logging.getLogger(),
        *[lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)],
    ]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, APILogHandler) and not any(isinstance(f, _WhileUp) for f in handler.filters):
                handler.addFilter(_WhileUp())
    for name in NOISY:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _WhileUp) for f in logger.filters):
            logger.addFilter(_WhileUp())


@contextlib.contextmanager
def watching(every_s: float = 2.0) -> Iterator[None]:
    """Health-check the API this run talks to while the block runs (nothing when no API URL is set)."""
    url = _health_url()
    if url is None:
        yield
        return
    _install_filters()
    _DOWN.clear()
    stop = threading.Event()

    def loop() -> None:
        misses = 0
        while not stop.is_set():
            ok = answers(timeout=5.0)
            if stop.is_set():
                return
            misses = 0 if ok else misses + 1
            if misses >= 2:  # two checks in a row: a busy server's slow answer is not an outage
                mark_down()
            elif ok and _DOWN.is_set():
                _DOWN.clear()
                logging.raiseExceptions = True
                log.warning("Prefect's API answers again")
            stop.wait(every_s)

    thread = threading.Thread(target=loop, name="regimen-orchestrator-watch", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


_FINISHER: list = []


def on_finish_while_down(fn) -> None:
    """`fn(result)` presents a run's result (the CLI's table and last line) when `finish` ends the process."""
    _FINISHER[:] = [fn]


def finish(result) -> None:
    """A run is over with `result` (a RunResult). When the API is down: present it (the CLI registered how)
    and end the process with its exit code now, or, in a process nobody presents for (a served run),
    `grace` seconds from now. When it is up: nothing (Prefect records the end as usual)."""
    if not _DOWN.is_set():
        return
    if answers(timeout=3.0):  # back in the meantime: Prefect records the end as usual
        _DOWN.clear()
        return
    if _FINISHER:
        try:
            _FINISHER[0](result)
        finally:
            _exit(result.exit_code)
    exit_soon(result.exit_code, grace=10.0)


def _exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed terminal: exit anyway
            pass
    os._exit(code)


def exit_soon(code: int, grace: float = 3.0) -> None:
    """When the API is down, end the process `grace` seconds from now with `code` (see the module doc)."""
    if not _DOWN.is_set() and answers(timeout=1.0):
        return
    _DOWN.set()

    def later() -> None:
        time.sleep(grace)
        _exit(code)

    threading.Thread(target=later, name="regimen-exit-deadline", daemon=True).start()
