"""The trackers a recipe may name (`tracking: [...]`) and the options each takes (`tracking_options.<name>`): the
one list of tracker names. The recipe's schema validates against it; the adapters live in the flows.

Why the names live here and the adapters there: a tracker is the flow's business (`flows/pipeline/tracking.py`
opens the run group, mirrors every stage call, moves the champion), and `stages/` never imports `flows/` or Prefect
(tests/test_layout.py), so the schema cannot read the flows' registry. Names and options are what a recipe may say,
checked at the door by `regimen check` and `regimen run` alike, so they belong to the recipe. The flows' registry
registers one adapter per name listed here (`@register_tracker("<name>")`), and a test checks that the two sets
are equal, so neither side can drift.

Adding a tracker is one module and one registration:

1. `flows/pipeline/tracker_<name>.py`: a subclass of `regimen.flows.pipeline.tracking.Tracker`, decorated
   `@register_tracker("<name>")`; the flows find `tracker_*` modules themselves (nothing imports it by name).
2. its line here: `"<name>": ("option", ...)`, the options `tracking_options.<name>` takes (the schema's
   `tracking` and `tracking_options` fields, their error messages and the docs' recipe reference follow).
"""

from __future__ import annotations

TRACKERS: dict[str, tuple[str, ...]] = {
    "mlflow": ("tracking_uri", "experiment_name", "registered_model"),
    "trackio": ("project", "dir"),
    "tensorboard": ("dir",),
    "wandb": ("project", "mode"),
}
"""Each tracker's name, as a recipe writes it, and the options `tracking_options.<name>` takes."""

NAMES: tuple[str, ...] = tuple(TRACKERS)


def options_text() -> str:
    """The options per tracker, in words (the `tracking_options` field's description)."""
    return ", ".join(f"{name} {{{', '.join(options)}}}" for name, options in TRACKERS.items())
