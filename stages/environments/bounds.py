"""Bounds on an environment's tool calls: a time limit and a size limit on the reply, in every episode.

TRL's tool loop (`GRPOTrainer._tool_call_loop`) calls the tools of the instances `environment_factory` makes, with
no time limit and no size limit, and turns the result into text (`str(result)`) outside its own `try`. So the bounds
belong on the class the environment registry hands TRL (`registry.adapted`): a subclass whose public methods are
wrapped, keeping their names, signatures, annotations and docstrings (TRL and the chat template read those), and
the same wrapped class serves Regimen's own episodes (the dry run, the probe, the evaluation). Per call:

- **time** (`environment.tool_timeout_s`): a call still running after the limit is answered with an error the model
  sees, as TRL answers a tool that raises (`{'error': 'f timed out (30 s)'}`), and the step goes on;
- **size** (`environment.tool_max_chars`): a longer reply is cut to the limit, with a last line saying so
  (`[truncated: 5000000 chars, the first 20000 kept]`);
- **text**: a result whose `str()` raises (or hangs) is an error reply too, not a crash of the step.
Each is counted from the tool messages (`counts`): `tool_timeouts` and `tool_truncated` in GRPO's training log (via
TRL's `log_metric`), in its manifest, and in the dry run's and the evaluation's metrics.

How a call is stopped, and what it costs (written here rather than taken from a library: none stops a Python call
in the same process):
- a **thread** runs each call, and the caller waits for it at most the limit. A Python thread cannot be killed, so a
  call past the limit is abandoned, not stopped: it runs on in the background (a daemon thread: it never holds the
  process's exit) and may still change its instance later. At most `MAX_ABANDONED` abandoned calls of one class
  may still be running at once: past that its calls are refused at once with a timeout reply, so a tool that hangs
  every call costs eight threads, not one per call. The reply's text is made in the thread too, so a `__str__` that
  hangs is bounded like the call;
- a **subprocess** per call would stop a call for good, but the tool would then run on a copy of the instance:
  rewards that read the environment's attributes after the episode (TRL's 2048 example reads `env.score`) would read
  a state the tool never changed;
- **SIGALRM** interrupts only the main thread, and only Python code between bytecodes (not a C call), and it would
  take the process's one alarm from whoever else uses it.
An `async def` tool gets `asyncio.wait_for` instead (TRL runs it on its own event loop); a coroutine that blocks
without awaiting cannot be interrupted there either.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any

DEFAULT_TIMEOUT_S = 30.0
DEFAULT_MAX_CHARS = 20_000
MAX_ABANDONED = 8
TIMEOUT_MARK = " timed out ("  # in the error reply; short, so that it fits a small completion budget (TRL drops a
TRUNCATED_MARK = "[truncated: "  # tool reply that would push an episode past max_completion_length)
_lock = threading.Lock()
_inside = threading.local()  # set while the class's own code runs (a tool, reset, get_reward): its calls of its own
# public methods are plain method calls, not tool calls (no thread, no text, no count)
_own_episodes = contextvars.ContextVar("regimen_own_episodes", default=False)
_rollouts = {"tool_timeouts": 0.0, "tool_truncated": 0.0}


class ToolTimeout(Exception):
    """A tool call past its time limit (answered to the model as a tool error)."""


class ToolReplyError(Exception):
    """A tool result that cannot be turned into text (answered to the model as a tool error)."""


def bounded(cls: type, timeout_s: float | None, max_chars: int | None) -> dict[str, Callable[..., Any]]:
    """The wrapped tools of `cls` (its public methods but `reset` and `get_reward`, as TRL finds tools), by name.
    The class's abandoned calls are counted together (a class whose tools hang does not stop another's)."""
    abandoned: list[threading.Thread] = []
    out: dict[str, Any] = {}
    for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction):
        if name in ("reset", "get_reward") or name.startswith("_"):
            continue
        static = isinstance(inspect.getattr_static(cls, name), staticmethod)
        made = wrap(fn, timeout_s, max_chars, abandoned, static=static)
        out[name] = staticmethod(made) if static else made
    return out


@contextlib.contextmanager
def inside() -> Iterator[None]:
    """The class's own code runs (reset, get_reward): a public method it calls is a plain method call."""
    before = getattr(_inside, "active", False)
    _inside.active = True
    try:
        yield
    finally:
        _inside.active = before


def plain(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` (reset, get_reward) run `inside()`."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with inside():
            return fn(*args, **kwargs)

    return call


def wrap(
    fn: Callable[..., Any],
    timeout_s: float | None,
    max_chars: int | None,
    abandoned: list[threading.Thread],
    *,
    static: bool = False,
) -> Callable[..., Any]:
    """`fn` (a method, or a static method's function) called within the bounds; its name, signature, annotations and
    docstring kept. Called from the class's own code (`_inside`), it is the plain method."""
    name = fn.__name__
    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def call_async(*args: Any, **kwargs: Any) -> Any:
            if getattr(_inside, "active", False):
                return await fn(*args, **kwargs)
            try:
                result = await asyncio.wait_for(fn(*args, **kwargs), timeout_s)
            except TimeoutError:
                _count("tool_timeouts")
                raise ToolTimeout(_timed_out(name, timeout_s)) from None
            return _counted(text_of(name, result, max_chars))

        return call_async

    def run(args: tuple, kwargs: dict) -> Any:
        with inside():
            return text_of(name, fn(*args, **kwargs), max_chars)

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if getattr(_inside, "active", False):
            return fn(*args, **kwargs)
        try:
            reply = within(name, lambda: run(args, kwargs), timeout_s, abandoned)
        except ToolTimeout:
            _count("tool_timeouts")
            raise
        return _counted(reply)

    return call


def within(name: str, run: Callable[[], Any], timeout_s: float | None, abandoned: list[threading.Thread]) -> Any:
    """`run()` in a daemon thread, waited for at most `timeout_s` (see the module doc); its value or its exception.
    `abandoned`: this class's calls that timed out and may still run."""
    if timeout_s is None:
        return run()
    with _lock:
        abandoned[:] = [t for t in abandoned if t.is_alive()]
        if len(abandoned) >= MAX_ABANDONED:
            raise ToolTimeout(f"{name}{TIMEOUT_MARK}not run: {len(abandoned)} calls still hang)")
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller, who answers the model with it
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"regimen-tool-{name}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        with _lock:
            abandoned.append(thread)
        raise ToolTimeout(_timed_out(name, timeout_s))
    if "error" in box:
        raise box["error"]
    return box["value"]


def _timed_out(name: str, timeout_s: float | None) -> str:
    return f"{name}{TIMEOUT_MARK}{timeout_s:g} s)"


def text_of(name: str, result: Any, max_chars: int | None) -> Any:
    """The reply as TRL will put it in a tool message: text, cut to `max_chars`; a list of content blocks (a
    multimodal reply) passes with its text parts cut. A result whose `str()` raises is a ToolReplyError."""
    if isinstance(result, list) and result and all(isinstance(p, dict) for p in result):
        return [{**p, "text": _cut(str(p["text"]), max_chars)} if isinstance(p.get("text"), str) else p for p in result]
    try:
        text = str.__str__(result) if isinstance(result, str) else str(result)
    except Exception as exc:  # noqa: BLE001 - a tool's object whose __str__ fails: the model is told, the step goes on
        raise ToolReplyError(
            f"tool {name} returned a {type(result).__name__} that cannot be turned into text "
            f"({type(exc).__name__}: {str(exc)[:200]})"
        ) from None
    if not isinstance(text, str):
        raise ToolReplyError(f"tool {name} returned a {type(result).__name__} whose str() is not text")
    return _cut(text, max_chars)


def _cut(text: str, max_chars: int | None) -> str:
    if max_chars is None or len(text) <= max_chars:
        return text
    return f"{text[:max_chars]}\n{TRUNCATED_MARK}{len(text)} chars, the first {max_chars} kept]"


def _counted(reply: Any) -> Any:
    if isinstance(reply, str) and TRUNCATED_MARK in reply[-80:]:
        _count("tool_truncated")
    return reply


def _count(key: str) -> None:
    """A bound hit in GRPO's rollouts (TRL's tool loop), counted here: TRL drops a tool reply that would push an
    episode past its completion budget, so its messages alone would miss some. Regimen's own episodes count theirs
    from their messages (`counts`), which they never drop."""
    if not _own_episodes.get():
        with _lock:
            _rollouts[key] += 1


def rollout_counts() -> dict[str, float]:
    """The bounds hit in TRL's rollouts in this process so far (a caller takes differences)."""
    with _lock:
        return dict(_rollouts)


@contextlib.contextmanager
def own_episodes() -> Iterator[None]:
    """Tool calls of Regimen's own episodes (the dry run, the probe, the evaluation): not counted as rollouts."""
    token = _own_episodes.set(True)
    try:
        yield
    finally:
        _own_episodes.reset(token)


def counts(completions: list[Any]) -> dict[str, float]:
    """Tool replies over these episodes (message lists) that hit a bound: `tool_timeouts`, `tool_truncated`."""
    timeouts = truncated = 0
    for c in completions:
        if not isinstance(c, list):
            continue
        for m in c:
            if not (isinstance(m, dict) and m.get("role") == "tool"):
                continue
            content = m.get("content")
            text = content if isinstance(content, str) else str(content)
            if text.startswith("{'error': ") and TIMEOUT_MARK in text:
                timeouts += 1
            elif TRUNCATED_MARK in text:
                truncated += 1
    return {"tool_timeouts": float(timeouts), "tool_truncated": float(truncated)}
