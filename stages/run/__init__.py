"""Running a stage: the runner (reuse, staging, commit, failed attempts), the launcher (one process or
`accelerate launch` / `torchrun` ranks), the ranks' entry point, and the preflight checks run before anything
trains."""
