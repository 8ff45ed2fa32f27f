"""Environments: multi-turn episodes with tools, rewarded at their end (`environment:` in a recipe).

An environment is a class in TRL's `environment_factory` shape, so `GRPOTrainer` runs it unchanged: its
public methods are the tools (type hints and a docstring with `Args:` give each its JSON schema), and
`reset(**row)` starts an episode for a dataset row (a returned string is appended to the user's message).
Regimen's own stages (the teacher's traces, the dry run, the probe, evaluation) run the same class through
`training/episodes.py`, so an episode means the same thing everywhere.

What Regimen adds, in `Environment` (subclass it) and the `tool` decorator:

- **Failures end the episode, never the stage.** A tool that raises, returns something that is not text
  or a number, or returns more than `MAX_RESULT_CHARS`, ends the episode: the model is told
  `error: ...`, the episode's reward is 0, and the trajectory records which tool failed and why. A call
  after the end, or past the turn limit (`max_turns` tool calls), gets an error too and changes nothing.
- **The episode's reward** is `Episode.reward(final_answer)`: 0 after a failure, else the environment's
  `score(final_answer)` (its own judgement of the final assistant message; the `episode` reward hands it
  to GRPO like any other reward, so weights, monitors, trajectories and the guard work as for
  single-turn rewards).
- **Bookkeeping stays off the tool list.** TRL turns every public method into a tool, so an episode's
  state lives in the `episode` attribute (an `Episode`), and everything else is private.

`base.py` holds the pieces, `registry.py` maps names to classes (`register`), or a recipe names `pkg.module:Class` (the
CLI's full power only, like rewards; the UI cannot choose code)."""
