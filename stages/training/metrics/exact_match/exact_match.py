"""Exact match, shipped in the repo because `evaluate.load("exact_match")` fetches from the hub.

Loaded by path (`evaluate.load(<this folder>)`). Predictions and references are compared after the
same normalisation the `answer` reward uses (strip, whitespace, case; numbers compared as numbers),
so held-out accuracy and the training reward agree on what "correct" means.
"""

import datasets
import evaluate

from regimen.stages.rewards import first_line, normalize_answer

_DESCRIPTION = "Fraction of predictions whose first line equals the reference after normalisation."
_KWARGS = """
Args:
    predictions (list of str): model outputs.
    references (list of str): reference answers.
Returns:
    exact_match (float): in [0, 1].
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS)
class ExactMatch(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS,
            features=datasets.Features(
                {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
            ),
        )

    def _compute(self, predictions, references):
        if not references:
            return {"exact_match": 0.0}
        hits = 0
        for pred, ref in zip(predictions, references):
            want = normalize_answer(ref)
            hits += want is not None and normalize_answer(first_line(pred or "")) == want
        return {"exact_match": hits / len(references)}
