"""Exact match, shipped in the repo because `evaluate.load("exact_match")` fetches from the hub.

Loaded by path (`evaluate.load(<this folder>)`), for users who measure with `evaluate`. Each prediction is judged by
`regimen.stages.rewards.scoring.exact_correct`, the verdict Regimen's evaluation, probe and dry run use (the
`answer` reward's normalisation: strip, whitespace, case; numbers compared as numbers), so this module and
Regimen's held-out accuracy cannot disagree.
"""

import datasets
import evaluate

from regimen.stages.rewards.scoring import exact_correct

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
        hits = sum(exact_correct(pred, ref) for pred, ref in zip(predictions, references))
        return {"exact_match": hits / len(references)}
