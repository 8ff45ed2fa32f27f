"""The pipeline as Prefect flows: the cycle (`cycle.py`), the sweep, the champion's decision in the flow, and the
artifacts each run publishes to the Prefect UI (`publish.py`). The work is in `regimen.stages`; a flow reads like
the pipeline's table of contents."""
