"""Serving the flows: deployments served by one process (`deploy.py`) or a work pool of hosts (`pool.py`), the
allow-list of what a UI run may set (`boundary.py`), the temporary Prefect server a plain run starts
(`server.py`) and the API's health, so training never waits on Prefect (`orchestrator.py`). Serving is handed the
flow it serves; it never imports the pipeline."""
