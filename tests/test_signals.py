"""A stop signal whose exception a finaliser swallowed still stops the stage (stages/core/signals.py): CI once saw a
SIGTERM mid-GRPO print "Exception ignored in ..." and the run train on to exit 0."""

import os
import signal

import pytest

from regimen.stages.core import signals
from regimen.stages.training.progress import Signals


class Stop(BaseException):
    pass


class SignalledInFinaliser:
    """Sends SIGTERM to this process from inside `__del__`: the handler runs there and its exception is lost."""

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # the handler runs at one of these bytecodes, inside the finaliser
            pass


@pytest.fixture
def raising_handler(monkeypatch):
    monkeypatch.setattr("sys.unraisablehook", lambda _: None)  # the "Exception ignored" line, kept off the output

    def handler(signum, frame):
        raise Stop(signum)

    previous = signal.signal(signal.SIGTERM, handler)
    yield handler
    signal.signal(signal.SIGTERM, previous)


def test_without_it_a_signal_in_a_finaliser_is_lost(raising_handler):
    SignalledInFinaliser()  # dropped at once: the finaliser runs, the signal's Stop is swallowed
    signals.deliver()  # nothing noticed outside a stage: nothing raised


def test_a_signal_lost_in_a_finaliser_is_raised_again_at_the_next_step(raising_handler):
    with signals.noticed():
        SignalledInFinaliser()
        with pytest.raises(Stop):
            Signals().on_step_end(None, None, "control")
        Signals().on_step_end(None, None, "control")  # raised once, not at every step after
    assert signal.getsignal(signal.SIGTERM) is raising_handler  # the handler in place before is put back


def test_a_signal_lost_in_a_finaliser_prints_no_traceback(monkeypatch, capfd):
    """Python prints "Exception ignored in ..." and a traceback for an exception lost in a finaliser: for the stop
    signal's, delivered again at the next step, nothing is printed (CI saw a Ctrl-C's traceback from a GC callback)."""
    import sys

    def handler(signum, frame):
        raise Stop(signum)

    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)  # Python's own: it prints
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        with signals.noticed():
            SignalledInFinaliser()
            with pytest.raises(Stop):
                signals.deliver()
    finally:
        signal.signal(signal.SIGTERM, previous)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err
    assert sys.unraisablehook is sys.__unraisablehook__  # the hook in place before is put back


def test_a_signal_that_propagated_is_not_raised_twice(raising_handler):
    with pytest.raises(Stop):
        with signals.noticed():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100_000):
                pass
    signals.deliver()  # the block ended with it: nothing left to raise
    assert signal.getsignal(signal.SIGTERM) is raising_handler


def test_a_stage_whose_signal_was_lost_is_interrupted_not_committed(raising_handler, tmp_path, monkeypatch):
    from regimen.stages.core.errors import StageInterrupted
    from regimen.stages.run import runner

    def stage_run(*args, **kwargs):
        SignalledInFinaliser()
        return "an output that must not be committed"

    monkeypatch.setattr(runner, "_launch", stage_run)
    monkeypatch.setattr(runner, "interruption", lambda exc: "SIGTERM" if isinstance(exc, Stop) else None)
    recorded = []
    monkeypatch.setattr(runner, "_record_failure", lambda *a: recorded.append(a[-1]))

    class Call:
        stage, recipe, inputs = "sft", None, {}

    class Dirs:
        out, checkpoints = tmp_path / "out", tmp_path / "work"

    class Handle:
        def cache_dir(self):
            return tmp_path

    with pytest.raises(StageInterrupted):
        runner._launch_recorded(Call(), None, Dirs(), Handle(), {})
    assert recorded == ["interrupted (SIGTERM)"]
