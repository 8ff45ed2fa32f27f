"""Environments: tools whose failures end the episode (never the stage), the turn limit, the episode
runner the dry run, probe and evaluation use (driven here by a scripted model), the chat template and
parser of the embedded model, the door; and a shrunken environment run through every stage that resumes
mid-GRPO (slow)."""

from __future__ import annotations

import json

import pytest
from conftest import ROOT

from regimen.stages.core.errors import InputError
from regimen.stages.environments.base import Environment, register, tool
from regimen.stages.environments.probe import ProbeEnvironment
from regimen.stages.rewards.text import episode, final_answer

ROW = {"prompt": [{"role": "user", "content": "#7 f(3)=?"}], "answer": "11", "a": 3, "b": 2, "x": 3}


@register("test-flaky")
class Flaky(Environment):
    """A tool that raises on 0, returns junk on 1 and a novel on 2."""

    max_turns = 3

    @tool
    def look(self, n: int) -> str:
        """Look.

        Args:
            n: what to look at
        """
        if n == 0:
            raise RuntimeError("the tool broke")
        if n == 1:
            return {"not": "text"}  # type: ignore[return-value]
        if n == 2:
            return "x" * 10_000
        return "fine"

    def _score(self, final_answer: str) -> float:
        return 1.0


def test_a_probe_episode_is_rewarded_for_the_right_answer_only():
    env = ProbeEnvironment(max_turns=2)
    env.reset(**ROW)
    assert env.probe(x=3) == "11" and env.probe(x=0) == "2"
    assert env.episode.reward("11") == 1.0 and env.episode.reward(" 11 ") == 1.0 and env.episode.reward("12") == 0.0
    assert [c["result"] for c in env.episode.calls] == ["11", "2"]


@pytest.mark.parametrize(
    "n, why",
    [
        (0, "raised RuntimeError: the tool broke"),
        (1, "returned dict, not text or a number"),
        (2, "returned 10000 characters"),
    ],
)
def test_a_tool_that_raises_or_returns_junk_ends_the_episode_with_reward_0(n, why):
    env = Flaky()
    env.reset(**ROW)
    out = env.look(n=n)
    assert out.startswith("error: ") and why in out
    assert env.episode.failure and why in env.episode.failure
    assert env.episode.reward("anything") == 0.0  # the episode is over: nothing the model says later counts
    assert env.look(n=3).startswith("error: the episode ended")  # ... and later calls change nothing
    record = env.episode.record()
    assert record["failure"] == env.episode.failure and record["calls"][0]["error"] == env.episode.failure


def test_wrong_arguments_are_a_failed_tool_not_a_crash():
    env = ProbeEnvironment(max_turns=2)
    env.reset(**ROW)
    assert env.probe(y=3).startswith("error: probe raised TypeError")
    env.reset(**ROW)
    assert env.probe(x="3").startswith("error: probe raised ValueError")
    assert env.episode.reward("11") == 0.0


def test_the_turn_limit_ends_the_episode():
    env = ProbeEnvironment(max_turns=2)
    env.reset(**ROW)
    env.probe(x=1), env.probe(x=2)
    assert env.probe(x=3).startswith("error: turn limit")
    assert env.episode.reward("11") == 0.0


def test_the_episode_reward_reads_the_final_assistant_message():
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "probe", "arguments": {"x": 3}}}],
    }
    done = [call, {"role": "tool", "name": "probe", "content": "11"}, {"role": "assistant", "content": "11"}]
    assert final_answer(done) == "11"
    # ended on a call (the turn limit): no answer
    assert final_answer([call, {"role": "tool", "content": "11"}]) is None
    envs = [ProbeEnvironment(), ProbeEnvironment()]
    for e in envs:
        e.reset(**ROW)
    assert episode(None, [done, [call]], environments=envs) == [1.0, 0.0]
    assert episode(None, ["11"]) == [None]  # no environment: no opinion


def test_the_embedded_chat_template_renders_and_parses_tool_calls():
    from trl.chat_template_utils import parse_response, supports_tool_calling

    from regimen.stages.training.model import TOOL_CHAT_TEMPLATE, TOOL_RESPONSE, build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template, tok.response_template = TOOL_CHAT_TEMPLATE, TOOL_RESPONSE
    assert supports_tool_calling(tok)
    from regimen.stages.tasks.tool_probe import oracle

    messages = ROW["prompt"] + oracle(ROW)
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = "".join(tok.decode([i]) for i, m in zip(out["input_ids"], out["assistant_masks"]) if m)
    # assistant turns only: not the tool's result
    assert trained == '<c>{"name": "probe", "arguments": {"x": 3}}</c></s>11</s>'
    prefix = tok.apply_chat_template(ROW["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)
    ids = tok('<c>{"name": "probe", "arguments": {"x": 3}}</c></s>', add_special_tokens=False)["input_ids"]
    assert parse_response(tok, ids, prefix=prefix)["tool_calls"][0]["function"] == {
        "name": "probe",
        "arguments": {"x": 3},
    }
    junk = tok('<c>{"name": "pro', add_special_tokens=False)["input_ids"]
    # a malformed call is text: the episode ends on it
    assert "tool_calls" not in parse_response(tok, junk, prefix=prefix)


class Scripted:
    """Stands in for `generate`: replies from a script by turn (the same for every open episode)."""

    def __init__(self, replies):
        self.replies, self.turn, self.seen = replies, 0, []

    def __call__(self, model, tokenizer, texts, **kw):
        self.seen.append(list(texts))
        reply = self.replies[min(self.turn, len(self.replies) - 1)]
        self.turn += 1
        return [[reply] for _ in texts]


def _recipe(tmp_path, max_turns=2, name="probe"):
    from regimen.stages.recipe import load_recipe

    path = tmp_path / "env.yaml"
    path.write_text(
        "experiment: t\nmodel: {name_or_path: tiny, tiny: {chat: true, max_position_embeddings: 128}}\n"
        "data: {task: tool_probe, train_size: 20, heldout_size: 10}\n"
        f"environment: {{name: {name}, max_turns: {max_turns}}}\nrewards: [{{name: episode}}]\neval: {{metric: "
        f"episode}}\n"
    )
    path.chmod(0o600)
    return load_recipe(str(path))


@pytest.fixture
def tokenizer():
    from regimen.stages.training.model import TOOL_CHAT_TEMPLATE, TOOL_RESPONSE, build_char_tokenizer

    tok = build_char_tokenizer()
    tok.chat_template, tok.response_template = TOOL_CHAT_TEMPLATE, TOOL_RESPONSE
    return tok


def test_episodes_call_the_tool_read_the_result_and_answer(tmp_path, monkeypatch, tokenizer):
    from regimen.stages.training import episodes

    script = Scripted(['<c>{"name": "probe", "arguments": {"x": 3}}</c>', "11"])
    monkeypatch.setattr(episodes, "generate", script)  # where run_episodes looks it up
    completions, envs = episodes.run_episodes(
        None, tokenizer, _recipe(tmp_path), [ROW], do_sample=False, max_new_tokens=60, desc="t"
    )
    assert [m["role"] for m in completions[0]] == ["assistant", "tool", "assistant"]
    assert completions[0][1]["content"] == "11" and envs[0].episode.reward(final_answer(completions[0])) == 1.0
    assert script.seen[1][0].endswith("T:11A:")  # the second turn saw the tool's result
    t = episodes.transcript(completions[0], envs[0])
    assert t["turns"] == [{"call": "probe", "arguments": {"x": 3}}, {"result": "11"}, {"say": "11"}]


def test_episodes_end_at_the_turn_limit(tmp_path, monkeypatch, tokenizer):
    from regimen.stages.training import episodes

    script = Scripted(['<c>{"name": "probe", "arguments": {"x": 1}}</c>'])  # calls the tool forever
    monkeypatch.setattr(episodes, "generate", script)  # where run_episodes looks it up
    completions, envs = episodes.run_episodes(
        None, tokenizer, _recipe(tmp_path, max_turns=2), [ROW, ROW], do_sample=False, max_new_tokens=400, desc="t"
    )
    for c, e in zip(completions, envs):
        # two answered calls, then the limit: the third is never run
        assert sum(m["role"] == "assistant" for m in c) == 3
        assert len(e.episode.calls) == 2 and final_answer(c) is None
    assert episode(None, completions, environments=envs) == [0.0, 0.0]
    assert all("turn limit" in e.episode.record()["failure"] for e in envs)  # the trajectory says why
    assert script.turn == 3


def test_a_broken_tool_in_an_episode_is_a_zero_and_a_trajectory_entry(tmp_path, monkeypatch, tokenizer):
    from regimen.stages.training import episodes

    script = Scripted(['<c>{"name": "look", "arguments": {"n": 0}}</c>', "done"])
    monkeypatch.setattr(episodes, "generate", script)  # where run_episodes looks it up
    completions, envs = episodes.run_episodes(
        None, tokenizer, _recipe(tmp_path, 3, "test-flaky"), [ROW], do_sample=False, max_new_tokens=60, desc="t"
    )
    assert episode(None, completions, environments=envs) == [0.0]
    t = episodes.transcript(completions[0], envs[0])
    assert t["episode"]["failure"] == "look raised RuntimeError: the tool broke"
    assert {"result": "error: look raised RuntimeError: the tool broke"} in t["turns"]


def test_the_weak_tool_teacher_calls_the_tool_on_a_third_and_guesses_the_rest(tmp_path):
    """tiny-env's teacher: the oracle's trace on about a third of the questions, picked by a digest of the
    question (nothing the student reads), a one-turn guess without the tool on the rest; as SFT traces."""
    from regimen.stages.recipe import load_recipe
    from regimen.stages.tasks import tool_probe
    from regimen.stages.training.teacher import traces

    task = tool_probe.load(tool_probe.Options())
    made = [tool_probe.weak_solution(r) for r in task.train]
    tools = [m for m in made if len(m) == 3]
    assert 0.30 < len(tools) / len(made) < 0.40
    for row, m in zip(task.train, made):
        if len(m) == 3:
            assert m == tool_probe.oracle(row)
        else:
            assert m == [{"role": "assistant", "content": str(row["x"])}] and "tool_calls" not in m[0]
    assert [tool_probe.weak_solution(r) for r in task.train[:50]] == made[:50]  # the same question, the same trace
    recipe = load_recipe(ROOT / "configs" / "tiny-env.yaml", {"store": str(tmp_path)})
    assert recipe.teacher.kind == "weak"
    rows, counts = traces(recipe, task, cycle=1, policy_path="")
    assert counts["traces_kept"] == counts["traces_generated"] == 2000 and len(rows) == 2000


def test_the_door_refuses_environment_recipes_that_cannot_work(tmp_path):
    from regimen.stages.core.errors import InputError
    from regimen.stages.recipe import load_recipe

    def bad(text: str, match: str) -> None:
        p = tmp_path / "bad.yaml"
        p.write_text(text)
        p.chmod(0o600)
        with pytest.raises(InputError, match=match):
            load_recipe(str(p))

    base = (
        "experiment: t\nmodel: {name_or_path: tiny, tiny: {chat: true}}\ndata: {task: tool_probe}\n"
        "rewards: [{name: episode}]\n"
    )
    bad(
        base + "environment: {name: nowhere}\neval: {metric: episode}\n",
        "environment.name: unknown environment 'nowhere'",
    )
    bad(base + "environment: {name: probe}\n", "eval.metric: with an environment")
    bad(
        base.replace("chat: true", "chat: false") + "environment: {name: probe}\neval: {metric: episode}\n",
        "model.tiny.chat",
    )
    bad(base + "environment: {name: probe, max_turns: 0}\neval: {metric: episode}\n", "environment.max_turns")
    bad(base + "environment: {name: probe, args: {color: red}}\neval: {metric: episode}\n", "environment.args")
    # teacher.kind self and model run their episodes through the environment now (issue 48): not refused
    from regimen.stages.recipe import load_recipe as load

    p = tmp_path / "self.yaml"
    p.write_text(base + "environment: {name: probe}\neval: {metric: episode}\nteacher: {kind: self}\n")
    assert load(str(p), check_trl=False).teacher.kind == "self"


# -- a shrunken environment run ----------------------------------------------------------------------
@pytest.mark.slow
def test_an_environment_run_goes_through_every_stage_and_resumes_mid_grpo(tmp_path, monkeypatch):
    """SFT on multi-turn traces, the dry run's episodes, the smoke test and GRPO through TRL's
    environment_factory, the probe and evaluation on held-out episodes; a crash mid-GRPO resumes; the
    trajectories show tool calls and results."""
    from conftest import ROOT, run_flow

    from regimen.stages.core.errors import RegimenError

    overrides = {
        "sft.max_steps": 250,
        "teacher.max_prompts": 1000,
        "data.train_size": 1200,
        "data.heldout_size": 32,
        "grpo.max_steps": 6,
        "grpo.save_steps": 2,
        "grpo.per_device_train_batch_size": 16,
        "probe.steps": 2,
        "probe.prompts": 8,
        "probe.train_prompts": 8,
        "dry_run.min_mean_reward": 0.0,
        "dry_run.max_mean_reward": 1.0,
        "dry_run.max_frac_zero_std": 1.0,
        "dry_run.num_prompts": 4,
    }
    config = ROOT / "configs" / "tiny-env.yaml"
    monkeypatch.setenv("REGIMEN_FAULT", "grpo@3")
    with pytest.raises(RegimenError):
        run_flow(config, tmp_path, overrides=overrides)
    monkeypatch.delenv("REGIMEN_FAULT")
    results = run_flow(config, tmp_path, overrides=overrides)
    by = {r["stage"]: r for r in results}
    assert by["grpo"]["resumed_from_step"] == 2
    exp = tmp_path / "tiny-env"
    sft = [json.loads(line) for line in (exp / "sft" / "v1" / "trajectories.jsonl").read_text().splitlines()]
    assert any(
        isinstance(r["completion"], list) and r["completion"][0].get("tool_calls")
        for r in sft
        if r.get("kind") == "trace"
    )
    for stage in ("reward-dry-run", "grpo", "eval"):
        rows = [json.loads(line) for line in (exp / stage / "v1" / "trajectories.jsonl").read_text().splitlines()]
        assert rows and all("episode" in r and "turns" in r["episode"] for r in rows), stage
    grpo_rows = [json.loads(line) for line in (exp / "grpo" / "v1" / "trajectories.jsonl").read_text().splitlines()]
    # GRPO's own episodes called the tool
    assert any(t.get("call") == "probe" for r in grpo_rows for t in r["episode"]["turns"])
    assert any("result" in t for r in grpo_rows for t in r["episode"]["turns"])
    assert 0.0 <= by["eval"]["metrics"]["heldout_accuracy"] <= 1.0

    # issue 48: `teacher: model` writes its traces through the environment: the SFT model above as the teacher, its
    # episodes run with the tool and judged by their own environment, kept when they pass teacher.min_reward
    from regimen.stages.recipe import load_recipe
    from regimen.stages.run.runner import StageCall, execute
    from regimen.stages.store import Store
    from regimen.stages.training.policy import base_policy

    teacher = {"kind": "model", "name_or_path": str(exp / "sft" / "v1" / "model"), "samples_per_prompt": 2}
    recipe = load_recipe(config, {**overrides, "teacher": {**teacher, "max_prompts": 48}, "sft.max_steps": 4})
    store = Store(tmp_path)
    taught = execute(StageCall("sft", recipe, {"policy": base_policy(recipe, store)}, experiment="by-model"), store)
    metrics = taught.manifest["metrics"]
    lines = (taught.path / "trajectories.jsonl").read_text().splitlines()
    kept = [json.loads(line) for line in lines if json.loads(line).get("kind") == "trace"]
    print(
        f"teacher: model through the environment kept {metrics['traces_kept']:.0f} of {metrics['traces_generated']:.0f}"
    )
    assert metrics["traces_generated"] == 96 and 0 < metrics["traces_kept"] <= 96, metrics
    assert kept and all(isinstance(t["completion"], list) for t in kept)  # conversations, as the episodes ran
    assert any(t["completion"][0].get("tool_calls") for t in kept)  # with the tool's calls and replies


def test_an_episode_ends_when_its_token_budget_is_spent(tmp_path, monkeypatch, tokenizer):
    """`max_new_tokens` is the whole episode's budget (tool results included), as TRL's max_completion_length."""
    from regimen.stages.training import episodes

    script = Scripted(['<c>{"name": "probe", "arguments": {"x": 1}}</c>'])
    monkeypatch.setattr(episodes, "generate", script)  # where run_episodes looks it up
    completions, envs = episodes.run_episodes(
        None, tokenizer, _recipe(tmp_path, max_turns=4), [ROW], do_sample=False, max_new_tokens=60, desc="t"
    )
    # the call's tokens and the result's leave a few: the second turn's call is cut there, read as text, and ends it
    assert len(envs[0].episode.calls) == 1 and script.turn == 2
    cut = completions[0][-1]["content"]
    assert "tool_calls" not in completions[0][-1] and 0 < len(cut) < 20 and '<c>{"name": "probe"'.startswith(cut[:19])
    assert episode(None, completions, environments=envs) == [0.0]


def test_a_call_the_trainer_could_not_make_fails_the_episode():
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "nope", "arguments": {}}}],
    }
    env = ProbeEnvironment()
    env.reset(**ROW)
    completion = [
        call,
        {"role": "tool", "name": "nope", "content": "{'error': 'Tool nope not found.'}"},
        {"role": "assistant", "content": "11"},
    ]
    assert episode(None, [completion], environments=[env]) == [0.0]
    assert "Tool nope not found" in env.episode.failure


def test_the_ui_shows_an_episode_turn_by_turn():
    from regimen.flows.pipeline.publish import turns_text

    ep = {
        "turns": [{"call": "probe", "arguments": {"x": 3}}, {"result": "11"}, {"say": "11"}],
        "episode": {"failure": None},
    }
    assert turns_text(ep) == "probe(x=3) → 11 says '11'"
    assert turns_text(
        {
            "turns": [{"call": "look", "arguments": {"n": 0}}, {"result": "error: boom"}],
            "episode": {"failure": "look raised"},
        }
    ).endswith("[ended: look raised]")


def test_a_ui_run_cannot_choose_an_environment():
    """`environment.*` chooses code: not a UI parameter unless the operator allows it; the curriculum is."""
    from regimen.flows.serving.boundary import check_overrides
    from regimen.stages.core.errors import InputError

    for key in ("environment.name", "environment.args", "environment"):
        with pytest.raises(InputError, match="is not a UI parameter"):
            check_overrides({key: "os:system"}, [])
    assert check_overrides({"curriculum.enabled": False, "cycle.start_from": "champion"}, [])
    with pytest.raises(InputError, match="promote.min_gain"):
        check_overrides({"promote.min_gain": 0}, [])


def test_a_trl_protocol_class_is_taken_as_it_is_and_its_tool_errors_answer_the_model():
    """Issue 44: a class written for TRL's environment_factory (tests/trl_env_for_tests.py imports nothing of
    Regimen) is made with no arguments; a tool that raises answers `{'error': ...}` and is counted; its
    get_reward() is the `get_reward` reward, hidden from TRL's own look-up so GRPO counts it once."""
    import trl_env_for_tests

    from regimen.stages.environments.registry import adapted, factory
    from regimen.stages.recipe.schema import EnvironmentSection
    from regimen.stages.rewards import get_reward
    from regimen.stages.training.episodes import _tool_replies, tool_errors

    spec = EnvironmentSection(name="trl_env_for_tests:HiddenLine", max_turns=2)
    env = factory(spec)()
    assert isinstance(env, trl_env_for_tests.HiddenLine) and type(env) is adapted(trl_env_for_tests.HiddenLine)
    assert type(env).get_reward is None  # TRL's look-up (inspect.isfunction on the class) finds no get_reward
    env.reset(a=2, b=3, x=5, answer="13")
    replies = _tool_replies(env, [{"function": {"name": "probe", "arguments": {"x": "five"}}}])
    assert replies[0]["content"].startswith("{'error': ") and "x must be an integer" in replies[0]["content"]
    replies += _tool_replies(env, [{"function": {"name": "probe", "arguments": {"x": 5}}}])
    assert replies[1]["content"] == "13"
    assert tool_errors([[{"role": "assistant", "content": ""}, *replies]]) == 1
    assert get_reward("get_reward")(None, ["13"], environments=[env]) == [1.0]
    with pytest.raises(InputError, match="takes no args"):
        factory(EnvironmentSection.model_construct(name="trl_env_for_tests:HiddenLine", max_turns=2, args={"k": 1}))


TRL_ENV = {
    "environment": {"name": "trl_env_for_tests:HiddenLine", "max_turns": 2},
    "rewards": [
        {"name": "trl_env_for_tests:final_answer_is_f", "weight": 1.0, "as": "final_answer"},
        {"name": "get_reward", "weight": 0.2},
    ],
    "eval": {"metric": "final_answer", "batch_size": 64},
}


def test_the_door_refuses_episode_with_a_trl_protocol_class_and_get_reward_without_one():
    from regimen.stages.recipe import load_recipe

    cfg = ROOT / "configs" / "tiny-env.yaml"
    with pytest.raises(InputError, match="follows TRL's protocol: list get_reward"):
        load_recipe(str(cfg), {"environment": TRL_ENV["environment"]}, check_trl=False)
    with pytest.raises(InputError, match="has no get_reward"):
        load_recipe(str(cfg), {"rewards": [{"name": "episode"}, {"name": "get_reward", "weight": 0}]}, check_trl=False)


@pytest.mark.slow
def test_a_trl_protocol_environment_runs_through_the_gated_cycle(tmp_path):
    """SFT on the task's multi-turn traces, the dry run's episodes (and its reward audit), the smoke test and GRPO
    through TRL's environment_factory, evaluation on held-out episodes: all with the class as written for TRL.

    Issue 51: its tool never returns at an odd point (trl_env_hostile.HangingLine), in every episode (the dry run's,
    GRPO's rollouts through TRL's own tool loop, the evaluation's): the run finishes, and the timeouts are in GRPO's
    training log, its manifest and the evaluation's metrics."""
    import trl_env_hostile
    from conftest import run_flow

    overrides = {
        **TRL_ENV,
        "environment": {"name": "trl_env_hostile:HangingLine", "max_turns": 2, "tool_timeout_s": 0.2},
        "grpo.logging_steps": 1,
        "sft.max_steps": 250,
        "teacher.max_prompts": 1000,
        "data.train_size": 1200,
        "data.heldout_size": 32,
        "grpo.max_steps": 4,
        "grpo.save_steps": 2,
        "grpo.per_device_train_batch_size": 16,
        "probe.steps": 2,
        "probe.prompts": 8,
        "probe.train_prompts": 8,
        "dry_run.min_mean_reward": 0.0,
        "dry_run.max_mean_reward": 10.0,
        "dry_run.max_frac_zero_std": 1.0,
        "dry_run.num_prompts": 4,
    }
    try:
        results = run_flow(ROOT / "configs" / "tiny-env.yaml", tmp_path, overrides=overrides)
    finally:
        trl_env_hostile.FOREVER.set()  # the abandoned calls end with the test
    by = {r["stage"]: r for r in results}
    assert {"sft", "reward-dry-run", "grpo-smoke", "grpo", "eval"} <= set(by)
    assert "tool_errors" in by["eval"]["metrics"] and "heldout_reward/get_reward" in by["eval"]["metrics"]
    assert by["eval"]["metrics"]["tool_timeouts"] > 0, by["eval"]["metrics"]
    grpo = json.loads((tmp_path / "tiny-env" / "grpo" / "v1" / "manifest.json").read_text())
    assert grpo["metrics"]["tool_timeouts"] > 0, grpo["metrics"]
    logged = [json.loads(line) for line in (tmp_path / "tiny-env" / "grpo" / "v1" / "train_log.jsonl").open()]
    assert any(row.get("tool_timeouts", 0) > 0 for row in logged), logged[:3]
    grpo_rows = [
        json.loads(line)
        for line in (tmp_path / "tiny-env" / "grpo" / "v1" / "trajectories.jsonl").read_text().splitlines()
    ]
    assert any(t.get("call") == "probe" for r in grpo_rows for t in r["episode"]["turns"])  # GRPO's episodes call it
    assert all(set(r["rewards"]) == {"final_answer", "get_reward"} for r in grpo_rows)  # each counted once


class StringReward:
    """Written to TRL's protocol (nothing of Regimen): get_reward() answers text."""

    def reset(self, **row):
        return None

    def get_reward(self):
        return "1.0"


@pytest.mark.parametrize("value", ["1.0", b"1", [1.0], True])
def test_a_get_reward_that_is_not_a_number_is_refused_with_one_line(value):
    """Issue 51: "1.0" from get_reward() was taken as 1.0, while the docs say a string is refused."""
    from regimen.stages.environments.registry import adapted
    from regimen.stages.rewards import get_reward

    cls = type("Answers", (StringReward,), {"get_reward": lambda self: value})
    env = adapted(cls)()
    with pytest.raises(InputError, match=r"Answers.get_reward\(\) returned .* it must return a number") as caught:
        get_reward("get_reward")(None, ["x"], environments=[env])
    assert "\n" not in str(caught.value)
    ok = adapted(type("Fine", (StringReward,), {"get_reward": lambda self: 1}))()
    assert get_reward("get_reward")(None, ["x"], environments=[ok]) == [1.0]


def _calls(*specs):
    return [{"function": {"name": name, "arguments": args}} for name, args in specs]


def test_a_tool_that_never_returns_floods_or_cannot_be_text_is_answered_and_counted_within_bounds():
    """Issue 51: a tool that hangs held the episode for good, a 50 MB reply went whole into a tool message, a result
    whose str() raises crashed the step. Each is now a reply the model sees (an error, or the reply cut with a last
    line saying so), counted, and the episode goes on."""
    import time

    import trl_env_hostile

    from regimen.stages.environments import bounds
    from regimen.stages.environments.registry import factory
    from regimen.stages.recipe.schema import EnvironmentSection
    from regimen.stages.training.episodes import _tool_replies

    spec = EnvironmentSection(name="trl_env_hostile:Hostile", tool_timeout_s=0.3, tool_max_chars=1000)
    env = factory(spec)()
    env.reset(a=1)
    rollouts = bounds.rollout_counts()
    t0 = time.monotonic()
    replies = _tool_replies(
        env, _calls(("hang", {"x": 1}), ("flood", {"mb": 50}), ("opaque", {}), ("slow", {"x": 1}), ("fine", {"x": 2}))
    )
    assert time.monotonic() - t0 < 10  # two calls waited 0.3 s each; nothing waited for the hung ones
    hang, flood, opaque, slow, fine = (r["content"] for r in replies)
    assert hang == "{'error': 'hang timed out (0.3 s)'}"
    assert len(flood) < 1100 and flood.startswith("y" * 1000)
    assert flood.endswith("\n[truncated: 50000000 chars, the first 1000 kept]")
    assert opaque.startswith("{'error': ") and "cannot be turned into text" in opaque and "no text for you" in opaque
    assert slow == "{'error': 'slow timed out (0.3 s)'}"
    assert fine == "3"
    assert bounds.rollout_counts() == rollouts  # Regimen's own episodes count from their messages instead
    completion = [{"role": "assistant", "content": ""}, *replies]
    assert bounds.counts([completion]) == {"tool_timeouts": 2.0, "tool_truncated": 1.0}
    assert env.calls == 1  # the hung call is still running (abandoned, not stopped), on this instance
    trl_env_hostile.RELEASE.set()


def test_abandoned_calls_are_capped_so_a_tool_that_always_hangs_costs_a_few_threads():
    import threading

    import trl_env_hostile

    from regimen.stages.environments import bounds
    from regimen.stages.environments.registry import factory
    from regimen.stages.recipe.schema import EnvironmentSection

    trl_env_hostile.RELEASE.clear()
    env = factory(EnvironmentSection(name="trl_env_hostile:Hostile", tool_timeout_s=0.05))()
    before, counted = threading.active_count(), bounds.rollout_counts()["tool_timeouts"]
    for _ in range(3 * bounds.MAX_ABANDONED):
        with pytest.raises(bounds.ToolTimeout, match=r"^hang timed out \((0.05 s|not run: 8 calls still hang)\)$"):
            env.hang(x=1)
    assert threading.active_count() - before <= bounds.MAX_ABANDONED
    # calls made outside Regimen's own episodes (as TRL's loop makes them) are counted as rollouts' timeouts
    assert bounds.rollout_counts()["tool_timeouts"] - counted == 3 * bounds.MAX_ABANDONED
    other = factory(EnvironmentSection(name="trl_env_hostile:Hostile", tool_timeout_s=0.06))()
    assert other.fine(x=1) == "2"  # another class's (here: other bounds') calls are not held by these
    trl_env_hostile.RELEASE.set()


def test_wrapped_tools_keep_what_trl_reads_of_them():
    """TRL lists an environment's tools by inspecting the class and renders them with transformers' schema."""
    import inspect

    import trl_env_hostile
    from transformers.utils import get_json_schema

    from regimen.stages.environments.registry import factory
    from regimen.stages.recipe.schema import EnvironmentSection

    env = factory(EnvironmentSection(name="trl_env_hostile:Hostile"))()
    plain = trl_env_hostile.Hostile()
    for name in ("hang", "flood", "fine", "slow"):
        assert get_json_schema(getattr(env, name)) == get_json_schema(getattr(plain, name)), name
        assert inspect.signature(getattr(env, name)) == inspect.signature(getattr(plain, name))
    assert inspect.iscoroutinefunction(type(env).slow)  # TRL runs it on its event loop, as it was
    names = [n for n, _ in inspect.getmembers(type(env), predicate=inspect.isfunction) if not n.startswith("_")]
    assert sorted(names) == ["fine", "flood", "hang", "opaque", "reset", "slow"]


HOSTILE = [
    "--set",
    "rewards=[{name: 'trl_env_for_tests:final_answer_is_f', as: final_answer}]",
    "--set",
    "eval.metric=final_answer",
]


@pytest.mark.parametrize(
    "cls, why",
    [
        (
            "BrokenReset",
            r"BrokenReset.reset failed on the row with prompt '.*': KeyError: 'no such board' "
            r"\(data: training row 1\)",
        ),
        ("NoTools", "NoTools has no tools"),
    ],
)
def test_check_makes_and_resets_the_environment_and_refuses_what_the_run_would(cls, why, tmp_path, capsys):
    """Issue 51: a class whose reset raises passed `regimen check` (OK, exit 0) and failed at run time with a raw
    traceback. The door now makes one, resets it on the first training and held-out rows and lists its tools."""
    import re

    from conftest import run_cli

    args = [str(ROOT / "configs" / "tiny-env.yaml"), "--set", f"environment.name=trl_env_hostile:{cls}", *HOSTILE]
    code, out, err = run_cli(["check", *args], capsys)
    assert code == 2 and re.search(why, err) and len(err.strip().splitlines()) == 1, (out, err)
    assert "OK" not in out
    store = tmp_path / "store"
    code, out, err = run_cli(["run", *args, "--store", str(store)], capsys)
    assert code == 2 and re.search(why, err) and "Traceback" not in err, (out, err)
    assert not store.exists() or not any(store.iterdir())  # refused at the door: nothing written


def test_check_lists_a_working_environments_tools(capsys):
    from conftest import run_cli

    cfg = str(ROOT / "configs" / "tiny-env.yaml")
    code, out, err = run_cli(["check", cfg, "--set", "environment.name=trl_env_hostile:Hostile", *HOSTILE], capsys)
    assert code == 0 and "# environment tools: fine, flood, hang, opaque, slow" in out, (out, err)
    assert "tool_timeout_s: 30.0" in out and "tool_max_chars: 20000" in out, out


def test_a_tools_calls_of_its_own_methods_stay_plain_and_static_tools_work():
    """A tool calling another public method of its class gets that method's own value (not a bounded call's text),
    so does reset and get_reward; a static method is a tool as TRL lists it."""

    from regimen.stages.environments.registry import factory
    from regimen.stages.recipe.schema import EnvironmentSection
    from regimen.stages.rewards import get_reward
    from regimen.stages.training.episodes import _tool_replies

    env = factory(EnvironmentSection(name="trl_env_hostile:SelfCalling", tool_timeout_s=1.0))()
    env.reset(prompt="p")
    replies = _tool_replies(env, _calls(("add", {"n": 2}), ("add", {"n": 3}), ("double", {"n": 4}), ("score", {})))
    assert [r["content"] for r in replies] == ["2", "5", "8", "5"]
    assert env.points == 5 and get_reward("get_reward")(None, ["x"], environments=[env]) == [5.0]
    assert type(env).double(n=5) == "10"  # called as TRL calls a tool: bounded, its reply text
