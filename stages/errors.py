"""The two kinds of failure a user must tell apart: their input is wrong, or a stage said stop."""


class RegimenError(Exception):
    """Base class: an error whose message is meant for a person, shown without a traceback."""

    exit_code = 1


class InputError(RegimenError):
    """Bad recipe, bad arguments or bad input file (exit 2). The message names the field, file or line."""

    exit_code = 2


class StageStopped(RegimenError):
    """A gate or a stage stopped the flow (exit 1): the message says which, why and what to do."""

    exit_code = 1

    def __init__(self, stage: str, message: str):
        super().__init__(f"{stage}: {message}")
        self.stage = stage
        self.reason = message
