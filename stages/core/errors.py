"""The kinds of failure a user must tell apart: their input is wrong, a stage said stop, the run was
interrupted, or the machine failed (disk full, store not writable)."""

from __future__ import annotations

from typing import Any


class RegimenError(Exception):
    """Base class: an error whose message is meant for a person, shown without a traceback."""

    exit_code = 1


class InputError(RegimenError):
    """Bad recipe, bad arguments or bad input file (exit 2). The message names the field, file or line."""

    exit_code = 2


class StageStopped(RegimenError):
    """A gate or a stage stopped the flow (exit 1): the message says which, why and what to do."""

    exit_code = 1

    def __init__(self, stage: str, message: str, finding: dict[str, Any] | None = None):
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.reason = message
        self.finding = finding  # the guard's finding when it stopped the run (`verdicts.Finding.as_dict`), as data


class StageInterrupted(RegimenError):
    """Ctrl-C (exit 130), SIGTERM (143) or a cancel from the UI (130) while a stage ran."""

    def __init__(self, stage: str, how: str, hint: str):
        super().__init__(f"{stage}: interrupted by {how}; {hint}")
        self.stage, self.how, self.hint = stage, how, hint
        self.exit_code = 143 if how == "SIGTERM" else 130


class StoreError(RegimenError):
    """The store cannot be read or written as asked (full disk, read-only, a planted link, a damaged
    manifest): exit 1, with the path named."""

    exit_code = 1
