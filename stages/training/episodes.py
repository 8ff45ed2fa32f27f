"""Episodes outside TRL: the dry run, the held-out probe and evaluation run the recipe's environment
turn by turn, as `GRPOTrainer(environment_factory=...)` does inside GRPO.

Per turn, every open episode's conversation (the row's prompt, what the model wrote, what the tools
returned) goes through the chat template with the environment's tools; the model continues it; the reply
is read back with the tokenizer's response parser (TRL's `parse_response`, which falls back to plain text
on a malformed call); each tool call runs on the episode's environment instance (a failure ends the
episode, see `stages/environments`); an answer without a tool call ends it; so does the turn limit.
`complete()` is what the stages call: plain completions for a recipe without an environment, episodes
(completions as lists of messages, plus the `environments` column the `episode` reward reads) with one.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import random
from typing import Any

from regimen.stages.core.errors import InputError
from regimen.stages.environments.base import tools_of
from regimen.stages.environments.bounds import counts, own_episodes
from regimen.stages.environments.registry import factory
from regimen.stages.tasks import EPISODE
from regimen.stages.training.sampling import generate


def complete(
    model,
    tokenizer,
    recipe,
    rows: list[dict[str, Any]],
    *,
    num_return_sequences: int = 1,
    do_sample: bool = False,
    desc: str = "sampling",
    **sampling: Any,
) -> tuple[list[list[Any]], list[list[Any]] | None]:
    """(completions per row, environments per row or None). Without `environment:` these are `generate`'s
    completions; with it, episodes."""
    max_new = sampling.pop("max_new_tokens", recipe.max_new_tokens())
    if recipe.environment is None:
        return generate(
            model,
            tokenizer,
            [r["prompt"] for r in rows],
            num_return_sequences=num_return_sequences,
            do_sample=do_sample,
            max_new_tokens=max_new,
            desc=desc,
            **sampling,
        ), None
    flat = [r for r in rows for _ in range(num_return_sequences)]
    completions, envs = run_episodes(
        model, tokenizer, recipe, flat, do_sample=do_sample, max_new_tokens=max_new, desc=desc, **sampling
    )
    k = num_return_sequences
    return [completions[i : i + k] for i in range(0, len(flat), k)], [envs[i : i + k] for i in range(0, len(flat), k)]


def chat_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows whose text prompt becomes a one-message conversation (TRL's tool loop needs conversations)."""
    return [
        r if isinstance(r["prompt"], list) else {**r, "prompt": [{"role": "user", "content": str(r["prompt"])}]}
        for r in rows
    ]


def prepare_tokenizer(tokenizer) -> None:
    """A response parser for the tokenizer: its own, or the one TRL knows for its chat template."""
    if (
        getattr(tokenizer, "response_template", None) is not None
        or getattr(tokenizer, "response_schema", None) is not None
    ):
        return
    from trl.chat_template_utils import add_response_schema

    try:
        add_response_schema(tokenizer)
    except ValueError as exc:
        raise InputError(
            f"environment: the model's chat template has no tool-call parser ({str(exc).splitlines()[0]}); "
            "use a model TRL knows (Qwen3, Llama 3.1, ...) or give the tokenizer a response_template"
        ) from None


def run_episodes(
    model,
    tokenizer,
    recipe,
    rows: list[dict[str, Any]],
    *,
    do_sample: bool,
    max_new_tokens: int,
    desc: str,
    batch_size: int | None = None,
    **sampling: Any,
) -> tuple[list[list[dict[str, Any]]], list[Any]]:
    """One episode per row: (the messages after the prompt, the environment instance that scored it)."""
    from trl.chat_template_utils import parse_response

    prepare_tokenizer(tokenizer)
    make = factory(recipe.environment)
    envs = [make() for _ in rows]
    prompts = [_reset(env, row) for env, row in zip(envs, rows)]
    completions: list[list[dict[str, Any]]] = [[] for _ in rows]
    # `max_new_tokens` is the whole episode's budget, tool results included, as TRL's max_completion_length
    budget = [max_new_tokens] * len(rows)
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None) or 10**9
    seed = sampling.pop("seed", None)  # sampled episodes are seeded once, not at every turn
    open_ = list(range(len(rows)))
    for turn in range(recipe.environment.max_turns + 1):
        texts, prefixes, keep = [], [], []
        for i in open_:
            text = tokenizer.apply_chat_template(
                prompts[i] + completions[i], tools=tools_of(envs[i]) or None, tokenize=False, add_generation_prompt=True
            )
            prefix = tokenizer(text, add_special_tokens=False)["input_ids"]
            budget[i] = min(budget[i], context - len(prefix) - 1)
            if budget[i] > 0:  # out of budget or context: the episode ends where it is
                texts.append(text), prefixes.append(prefix), keep.append(i)
        if not keep:
            break
        outs = generate(
            model,
            tokenizer,
            texts,
            do_sample=do_sample,
            max_new_tokens=max(budget[i] for i in keep),
            batch_size=batch_size or recipe.eval.batch_size,
            desc=f"{desc} (turn {turn + 1})",
            **({"seed": seed} if turn == 0 and seed is not None else {}),
            **sampling,
        )
        still = []
        for i, prefix, (out,) in zip(keep, prefixes, outs):
            ids = tokenizer(out, add_special_tokens=False)["input_ids"][: budget[i]]
            budget[i] -= len(ids)
            message = parse_response(
                tokenizer,
                ids + ([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []),
                prefix=prefix,
                tools=tools_of(envs[i]) or None,
            )
            message = {k: v for k, v in message.items() if k in ("role", "content", "tool_calls")}
            message.setdefault("content", "")
            completions[i].append(message)
            calls = message.get("tool_calls") or []
            if not calls or turn >= recipe.environment.max_turns:
                continue  # an answer, or the turn limit: the episode is over
            for reply in _tool_replies(envs[i], calls):
                budget[i] -= len(tokenizer(reply["content"], add_special_tokens=False)["input_ids"])
                completions[i].append(reply)
            still.append(i)
        open_ = still
    return completions, envs


def _reset(env, row: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's prompt as messages: the row's, with what `env.reset(**row)` returned (a string) appended. An
    episode row (`tasks.EPISODE`) is reset with Python's and NumPy's global random generators seeded by its number
    (and put back after), so an environment that draws from them (TRL's `Game2048Env` does, with no seed argument)
    gives the same held-out episodes every time."""
    prompt = (
        [dict(m) for m in row["prompt"]]
        if isinstance(row["prompt"], list)
        else [{"role": "user", "content": str(row["prompt"])}]
    )
    if row.get(EPISODE) is None:
        observation = env.reset(**row)
    else:
        with _seeded(int(row[EPISODE])):
            observation = env.reset(**row)
    if isinstance(observation, str):
        prompt[-1] = {**prompt[-1], "content": str(prompt[-1]["content"]) + observation}
    return prompt


@contextlib.contextmanager
def _seeded(episode: int):
    """Python's and NumPy's global generators seeded for one episode, then put back as they were."""
    import numpy as np

    state, np_state = random.getstate(), np.random.get_state()
    random.seed(1_000_003 * episode + 17)
    np.random.seed((1_000_003 * episode + 17) % 2**32)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def _tool_replies(env, calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool messages answering one turn's calls, in order."""
    tools = {t.__name__: t for t in tools_of(env)}
    replies = []
    with own_episodes():  # counted from these messages (bounds.counts), not as GRPO's rollouts
        for call in calls:
            replies.append(_tool_reply(tools, call))
    return replies


def _tool_reply(tools: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
    """The tool message answering one call."""
    fn = call.get("function") or {}
    name, args = fn.get("name"), fn.get("arguments")
    if name in tools and isinstance(args, dict):
        try:
            result = tools[name](**args)
            if inspect.iscoroutine(result):  # an `async def` tool: TRL runs it on its event loop, here on one
                result = asyncio.run(result)
        except Exception as exc:  # noqa: BLE001 - a tool that raises answers the model, as TRL's loop does
            result = {"error": str(exc)}
    else:  # as TRL answers a call to no tool; the `episode` reward counts it as a failed tool
        result = {"error": f"Tool {name} not found." if name not in tools else f"arguments {args!r} are not an object"}
    return {"role": "tool", "name": str(name), "content": str(result)}


def bound_counts(completions: list[Any]) -> dict[str, float]:
    """Tool replies over these episodes that hit a bound (`environments/bounds.counts`): for the stages, which reach
    the environments through the training pieces."""
    return counts(completions)


def tool_errors(completions: list[Any]) -> int:
    """Tool calls answered with an error (a tool that raised, no such tool, bad arguments), as TRL's loop answers
    them (`{'error': ...}`), over these episodes."""
    return sum(
        1
        for c in completions
        if isinstance(c, list)
        for m in c
        if isinstance(m, dict) and m.get("role") == "tool" and str(m.get("content", "")).startswith("{'error': ")
    )


def schema_calls(completions: list[Any], envs: list[Any]) -> float:
    """The share of episodes with at least one tool call that fits the environment's tool schema: a tool it has, called
    with arguments that bind to the tool's signature (what a model learnt of the tool's format)."""

    def fits(completion: Any, env: Any) -> bool:
        tools = {t.__name__: t for t in tools_of(env)} if env is not None else {}
        for m in completion if isinstance(completion, list) else []:
            for call in (m.get("tool_calls") or []) if isinstance(m, dict) and m.get("role") == "assistant" else []:
                fn = call.get("function") or {}
                args = fn.get("arguments")
                if fn.get("name") in tools and isinstance(args, dict):
                    try:
                        inspect.signature(tools[fn["name"]]).bind(**args)
                        return True
                    except TypeError:
                        continue
        return False

    return sum(fits(c, e) for c, e in zip(completions, envs)) / len(completions) if completions else 0.0


def transcript(completion: Any, env: Any | None = None) -> dict[str, Any]:
    """A trajectory's turns, for people: each tool call with its arguments and what came back (or why it
    failed), and the final answer."""
    if not isinstance(completion, list):
        return {}
    turns = []
    for m in completion:
        if m.get("role") == "assistant":
            for call in m.get("tool_calls") or []:
                fn = call.get("function") or {}
                turns.append({"call": fn.get("name"), "arguments": fn.get("arguments")})
            if m.get("content"):
                turns.append({"say": m["content"]})
        elif m.get("role") == "tool":
            turns.append({"result": m.get("content")})
    out: dict[str, Any] = {"turns": turns}
    if env is not None and callable(getattr(getattr(env, "episode", None), "record", None)):
        out["episode"] = env.episode.record()
    return out


def reset_environments(recipe, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, list[Any]]]:
    """The rows as an episode starts them (chat prompts with the `reset()` observation appended, as TRL does) and one
    fresh environment per row, reset on it: what a reward that reads `environments` can be called with before any
    episode has run (the door)."""
    make = factory(recipe.environment)
    envs, shown = [], []
    for i, r in enumerate(chat_rows(rows), 1):
        env = make()
        try:
            shown.append({**r, "prompt": _reset(env, r)})
        except InputError as exc:
            raise InputError(f"{exc} (data: training row {i})") from None
        except Exception as exc:  # noqa: BLE001 - the user's class: its error, named with the row
            raise InputError(
                f"environment: {recipe.environment.name}.reset failed on training row {i}: {type(exc).__name__}: {exc}"
            ) from None
        envs.append(env)
    return shown, {"environments": envs}


def try_environment(recipe, train: list[dict[str, Any]], heldout: list[dict[str, Any]]) -> list[str]:
    """The door's try of the recipe's environment, before anything trains: one instance made as training makes them,
    reset on the first training row and on the first held-out row, and its tools rendered as the chat template will
    render them (transformers' `get_json_schema`, which TRL uses: a tool without a docstring for an argument fails
    there). InputError naming the class, the row and the error; the tools' names when it can."""
    from transformers.utils import get_json_schema

    name = recipe.environment.name
    try:
        env = factory(recipe.environment)()
    except InputError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's class: its error, named
        raise InputError(f"environment: {name} could not be made: {type(exc).__name__}: {exc}") from None
    for where, rows in (("training row 1", train), ("held-out row 1", heldout)):
        if rows:
            try:
                _reset(env, chat_rows(rows[:1])[0])
            except InputError as exc:
                raise InputError(f"{exc} (data: {where})") from None
    tools = tools_of(env)
    if not tools:
        raise InputError(
            f"environment: {name} has no tools (public methods other than reset and get_reward): the model would have "
            "nothing to call"
        )
    for tool in tools:
        try:
            get_json_schema(tool)
        except Exception as exc:  # noqa: BLE001 - transformers' DocstringParsingException and kin: named
            raise InputError(
                f"environment: {name}: tool {tool.__name__} cannot be shown to the model: {str(exc).splitlines()[0]}"
            ) from None
    return [t.__name__ for t in tools]
