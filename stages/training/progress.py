"""Training progress on the terminal: one bar per training stage, or the libraries' own output.

By default a Trainer's terminal output is one progress bar for the stage (its description the stage's
name, the latest loss and reward beside it), instead of transformers' bar with every logged dictionary
printed under it. `REGIMEN_VERBOSE=1` (`regimen run --verbose`) keeps the libraries' own output. Either
way every logged value goes to the Trainer's log history, hence `train_log.jsonl` and Prefect's log.
The bar is tqdm's, shown only on a terminal (tqdm's `disable=None`), written to stderr.
"""

from __future__ import annotations

import os

from transformers import PrinterCallback, ProgressCallback, TrainerCallback

from regimen.stages.core import signals

SHOWN = ("loss", "reward", "heldout_probe")


def verbose() -> bool:
    return os.environ.get("REGIMEN_VERBOSE", "0") == "1"


class StageProgress(TrainerCallback):
    """One tqdm bar per training run; logged values appear beside it, never as printed dictionaries."""

    def __init__(self, desc: str):
        self.desc = desc
        self.bar = None

    def on_train_begin(self, args, state, control, **kwargs):
        from tqdm.auto import tqdm

        if state.is_world_process_zero:
            self.bar = tqdm(
                total=state.max_steps,
                initial=state.global_step,
                desc=self.desc,
                unit="step",
                leave=False,
                disable=None,
                dynamic_ncols=True,
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.update(state.global_step - self.bar.n)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.bar is not None and logs:
            shown = {k: f"{logs[k]:.3g}" for k in SHOWN if isinstance(logs.get(k), (int, float))}
            if shown:
                self.bar.set_postfix(shown, refresh=False)

    def on_train_end(self, args, state, control, **kwargs):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


class Signals(TrainerCallback):
    """After every step, a stop signal whose exception a finaliser swallowed is raised again
    (`regimen.stages.core.signals`): a SIGTERM always stops training within a step."""

    def on_step_end(self, args, state, control, **kwargs):
        signals.deliver()
        return control


class ForwardLogs(TrainerCallback):
    """Each log entry of the Trainer, as it is written, to whoever watches the stage (`StageDirs.progress`, event
    `log`): the flow mirrors it into the trackers (`tracking:`). A watcher that fails never stops training."""

    def __init__(self, progress):
        self.progress = progress

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and state.log_history:
            try:
                self.progress("log", {"step": state.global_step, "entry": dict(state.log_history[-1])})
            except Exception:  # noqa: BLE001 - the trackers' own warning says what failed; training goes on
                pass


def quiet(trainer, desc: str, progress=None):
    """Give `trainer` one progress bar named `desc` in place of transformers' printing callbacks (unless
    REGIMEN_VERBOSE=1), its log entries to `progress` (the stage's watcher) when given, and a stop signal a finaliser
    swallowed raised after the step it came in. Returns the trainer."""
    trainer.add_callback(Signals())
    if progress is not None:
        trainer.add_callback(ForwardLogs(progress))
    if not verbose():
        trainer.remove_callback(ProgressCallback)
        trainer.remove_callback(PrinterCallback)
        trainer.add_callback(StageProgress(desc))
    return trainer
