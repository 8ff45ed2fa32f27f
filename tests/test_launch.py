"""`launcher: accelerate`: training stages as two gloo ranks under `accelerate launch` on CPU."""

import pytest
from conftest import TINY, run_flow

from regimen.stages.recipe import load_recipe
from regimen.stages.run.launcher import accelerate_command, local_processes
from regimen.stages.store import Store


def test_command_uses_the_torchrun_path_for_several_processes(tmp_path):
    r = load_recipe(TINY, ["launcher=accelerate", "accelerate.num_processes=2"])
    cmd = accelerate_command(r, tmp_path / "spec.json")
    assert "--multi_gpu" in cmd and "--cpu" not in cmd
    assert cmd[cmd.index("--num_processes") + 1] == "2" and cmd[-3:] == [
        "-m",
        "regimen.stages.run.launch_entry",
        str(tmp_path / "spec.json"),
    ]
    r = load_recipe(TINY, ["launcher=accelerate", "accelerate.config_file=configs/accelerate/ddp.yaml"])
    cmd = accelerate_command(r, tmp_path / "spec.json")
    assert cmd[cmd.index("--config_file") + 1] == "configs/accelerate/ddp.yaml" and "--multi_gpu" not in cmd


@pytest.mark.slow
def test_a_failing_rank_fails_the_stage_and_a_two_process_rerun_completes_with_gloo_ranks(tmp_path, monkeypatch):
    """One store: a rank that fails in GRPO fails the stage with its last lines (and records the attempt);
    the rerun reuses SFT and the smoke test and completes every training stage with 2 gloo ranks."""
    from regimen.stages.core.errors import StageStopped

    two = {"launcher": "accelerate", "accelerate.num_processes": 2}
    monkeypatch.setenv("REGIMEN_FAULT", "grpo@2")
    with pytest.raises(StageStopped, match="accelerate launch .2 processes. exited with code") as exc:
        run_flow(TINY, tmp_path, overrides=two)
    assert "injected fault" in str(exc.value)
    [fail] = Store(tmp_path).failures("tiny-test", "grpo")
    assert "injected fault" in fail["error"]
    assert Store(tmp_path).versions("tiny-test", "grpo") == []

    monkeypatch.delenv("REGIMEN_FAULT")
    results = run_flow(TINY, tmp_path, overrides=two)
    assert [r["stage"] for r in results][-1] == "eval"
    s = Store(tmp_path)
    for stage in ("sft", "grpo-smoke", "grpo"):
        m = s.latest("tiny-test", stage)
        assert m["launch"] == {"launcher": "accelerate", "num_processes": 2, "backend": "gloo"}, stage
        assert s.verify(m) == []
        assert len(s.versions("tiny-test", stage)) == 1, stage  # sft and the smoke test reused, not run again
    grpo = s.latest("tiny-test", "grpo")
    assert grpo["metrics"]["steps"] == 6 and grpo["metrics"]["beta"] > 0
    assert s.latest("tiny-test", "reward-dry-run")["launch"]["launcher"] == "inprocess"
    assert not list((tmp_path / "tiny-test" / "grpo").glob("work/*/ranks/*.pid"))


def test_command_for_two_machines_passes_accelerates_own_flags(tmp_path):
    r = load_recipe(
        TINY,
        {
            "launcher": "accelerate",
            "accelerate.num_processes": 4,
            "accelerate.num_machines": 2,
            "accelerate.machine_rank": 1,
            "accelerate.main_process_ip": "10.0.0.5",
            "accelerate.main_process_port": 29512,
        },
    )
    cmd = accelerate_command(r, tmp_path / "spec.json")
    flag = {
        f: cmd[cmd.index(f) + 1]
        for f in ("--num_processes", "--num_machines", "--machine_rank", "--main_process_ip", "--main_process_port")
    }
    assert flag == {
        "--num_processes": "4",
        "--num_machines": "2",
        "--machine_rank": "1",
        "--main_process_ip": "10.0.0.5",
        "--main_process_port": "29512",
    }
    assert "--multi_gpu" in cmd and local_processes(r) == 2  # --num_processes is the whole job's, as accelerate expects
    one = accelerate_command(
        load_recipe(TINY, ["launcher=accelerate", "accelerate.num_processes=2"]), tmp_path / "spec.json"
    )
    assert (
        one[one.index("--num_machines") + 1] == "1"
        and one[one.index("--machine_rank") + 1] == "0"
        and "--main_process_ip" not in one
    )


@pytest.mark.parametrize(
    "overrides, error",
    [
        (
            {"accelerate.num_machines": 2, "accelerate.main_process_port": 29500},
            "accelerate.main_process_ip: required with accelerate.num_machines 2",
        ),
        (
            {"accelerate.num_machines": 2, "accelerate.main_process_ip": "127.0.0.1"},
            "accelerate.main_process_port: set a port",
        ),
        (
            {
                "accelerate.num_machines": 2,
                "accelerate.machine_rank": 2,
                "accelerate.main_process_ip": "h",
                "accelerate.main_process_port": 1,
            },
            "accelerate.machine_rank: 2 must be below accelerate.num_machines",
        ),
        ({"accelerate.machine_rank": 1}, "accelerate.machine_rank: 1 must be below accelerate.num_machines .1."),
        (
            {
                "accelerate.num_machines": 2,
                "accelerate.num_processes": 3,
                "accelerate.main_process_ip": "h",
                "accelerate.main_process_port": 1,
            },
            "accelerate.num_machines: 3 processes .* do not split evenly over 2 machines",
        ),
        (
            {"accelerate.num_machines": 2, "accelerate.main_process_ip": "0.0.0.0", "accelerate.main_process_port": 1},
            "accelerate.main_process_ip: '0.0.0.0' is not an address",
        ),
        (
            {"accelerate.num_machines": 2, "accelerate.main_process_ip": "a b", "accelerate.main_process_port": 1},
            "accelerate.main_process_ip: 'a b' is neither",
        ),
        (
            {"accelerate.main_process_port": 70000},
            "accelerate.main_process_port: Input should be less than or equal to 65535",
        ),
        (
            {"accelerate.extra_args": ["--machine_rank", "1"]},
            "accelerate.extra_args: --machine_rank is a field of the section: set accelerate.machine_rank",
        ),
    ],
)
def test_machines_fields_are_checked_in_one_line_naming_the_field(overrides, error):
    from regimen.stages.core.errors import InputError

    with pytest.raises(InputError, match=error) as exc:
        load_recipe(TINY, {"launcher": "accelerate", **overrides})
    assert "\n" not in str(exc.value)


SHORT = {
    "launcher": "accelerate",
    "accelerate.num_processes": 2,
    "sft.max_steps": 10,
    "sft.save_steps": 5,
    "sft.logging_steps": 5,
    "grpo.max_steps": 4,
    "grpo.save_steps": 2,
    "grpo.logging_steps": 2,
}


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _machine(stage: str, recipe, root, policy: str):
    """One machine's side of a stage, as its runner starts it: its own staging folder (the version to be),
    its own work folder, the policy from its own store (a second host has its own disk)."""
    from regimen.stages.core.contract import StageDirs
    from regimen.stages.run.launcher import run_with_accelerate

    dirs = StageDirs(out=root / stage / "staging", checkpoints=root / stage / "work")
    dirs.out.mkdir(parents=True)
    dirs.checkpoints.mkdir(parents=True)
    return run_with_accelerate(stage, recipe, {"policy": {"stage": "base", "model": policy}, "cycle": 1}, dirs)


def _logged(work, key: str) -> dict[int, float]:
    """The trainer's logged `key` by step, from the last checkpoint's trainer_state.json."""
    import json

    from regimen.stages.training.checkpoints import last_checkpoint

    _, ckpt = last_checkpoint(work)
    return {h["step"]: h[key] for h in json.loads((ckpt / "trainer_state.json").read_text())["log_history"] if key in h}


def _written(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_two_machines_write_once_and_match_one_machine(tmp_path, monkeypatch):
    """Two local "machines" (machine_rank 0 and 1 on 127.0.0.1, one gloo process each, separate stores and
    work folders) through SFT then GRPO: global rank 0 alone writes checkpoints, output and the staging
    folder; machine 1 raises LentToMachineZero (nothing to commit); the losses match 2 processes on one machine."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from regimen.stages.run.launcher import LentToMachineZero
    from regimen.stages.training.policy import base_policy

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the same threads in every run (and 2 cores here)
    one = load_recipe(TINY, SHORT)
    port = _free_port()
    two = [
        load_recipe(
            TINY,
            {
                **SHORT,
                "accelerate.num_machines": 2,
                "accelerate.machine_rank": rank,
                "accelerate.main_process_ip": "127.0.0.1",
                "accelerate.main_process_port": port,
            },
        )
        for rank in (0, 1)
    ]
    roots = [tmp_path / "machine0", tmp_path / "machine1"]
    base = [base_policy(one, Store(root / "store"))["model"] for root in roots]

    single = {"sft": _machine("sft", one, tmp_path / "one", base[0])}
    single["grpo"] = _machine("grpo", one, tmp_path / "one", str(tmp_path / "one" / "sft" / "staging" / "model"))

    policy = list(base)
    for stage in ("sft", "grpo"):
        with ThreadPoolExecutor(2) as pool:
            jobs = [pool.submit(_machine, stage, two[m], roots[m], policy[m]) for m in (0, 1)]
            out = jobs[0].result(timeout=900)
            with pytest.raises(LentToMachineZero, match=f"{stage}: machine_rank 1 of 2 .* nothing is committed here"):
                jobs[1].result(timeout=900)
        assert out.status == "completed" and out.extra["launch"] == {
            "launcher": "accelerate",
            "num_processes": 2,
            "backend": "gloo",
            "num_machines": 2,
        }
        assert out.metrics["steps"] == single[stage].metrics["steps"]
        # machine 0 wrote the version and the checkpoints; machine 1 wrote no file of them
        assert (roots[0] / stage / "staging" / "model").is_dir() and (
            roots[0] / stage / "work" / "launch_output.json"
        ).is_file()
        assert _written(roots[1] / stage / "staging") == []
        left = [
            f for f in _written(roots[1] / stage / "work") if f != "launch.json" and not f.startswith("traces-cycle")
        ]
        # each rank's RNG state is its own part of a checkpoint (transformers' rng_state_<global rank>.pth): no weights,
        # state or marker
        assert left and all(f.startswith("checkpoint-") and f.endswith("/rng_state_1.pth") for f in left), left
        for key in ("loss",) + (("reward",) if stage == "grpo" else ()):
            got, want = _logged(roots[0] / stage / "work", key), _logged(tmp_path / "one" / stage / "work", key)
            assert got.keys() == want.keys() and got, (stage, key, got, want)
            assert got == pytest.approx(want, rel=1e-4, abs=1e-6), (stage, key, got, want)
        print(
            stage,
            "loss by step: two machines",
            _logged(roots[0] / stage / "work", "loss"),
            "one machine",
            _logged(tmp_path / "one" / stage / "work", "loss"),
        )
        # the next stage starts from machine 0's version, which machine 1 reads from its own copy (as from a shared
        # bucket)
        shutil.copytree(roots[0] / stage / "staging" / "model", roots[1] / f"{stage}-model")
        policy = [str(roots[0] / stage / "staging" / "model"), str(roots[1] / f"{stage}-model")]


def test_a_machine_that_lent_its_ranks_records_no_failed_attempt(tmp_path, monkeypatch):
    """The runner on machine_rank 1: its ranks ran to the end (LentToMachineZero, exit code 0): it passes
    that on, commits nothing and records no failed attempt (the stage did not fail)."""
    from regimen.stages.run import runner
    from regimen.stages.run.launcher import LentToMachineZero

    recipe = load_recipe(
        TINY,
        {
            "launcher": "accelerate",
            "accelerate.num_machines": 2,
            "accelerate.machine_rank": 1,
            "accelerate.main_process_ip": "127.0.0.1",
            "accelerate.main_process_port": 29555,
        },
    )

    def lent(stage, *a, **k):
        raise LentToMachineZero(stage, 1, 2, 1, "127.0.0.1:29555")

    monkeypatch.setattr(runner, "_launch", lent)
    store = Store(tmp_path)
    call = runner.StageCall(
        "sft",
        recipe,
        {"policy": {"stage": "base", "fingerprint": "f" * 64, "model": str(tmp_path)}, "cycle": 1},
        experiment="tiny-test",
    )
    with pytest.raises(LentToMachineZero) as caught:
        runner.execute(call, store)
    assert caught.value.exit_code == 0
    assert store.failures("tiny-test", "sft") == [] and store.versions("tiny-test", "sft") == []


def test_where_the_processes_run_does_not_enter_the_fingerprint():
    """Machine 0, machine 1 and one machine with the same number of processes name one version: the one
    global rank 0 writes (machine 1 finds it by fingerprint in a store both reach)."""
    from regimen.stages.run.runner import stage_key

    base = {"launcher": "accelerate", "accelerate.num_processes": 2}
    recipes = [load_recipe(TINY, base)] + [
        load_recipe(
            TINY,
            {
                **base,
                "accelerate.num_machines": 2,
                "accelerate.machine_rank": rank,
                "accelerate.main_process_ip": f"10.0.0.{rank + 1}",
                "accelerate.main_process_port": 29500 + rank,
            },
        )
        for rank in (0, 1)
    ]
    inputs = {"policy": {"stage": "base", "model": "m", "fingerprint": "tiny-0"}, "cycle": 1}
    for stage in ("sft", "grpo"):
        assert len({stage_key(stage, r, inputs)[0] for r in recipes}) == 1, stage
    assert (
        stage_key("sft", load_recipe(TINY, {**base, "accelerate.num_processes": 4}), inputs)[0]
        != stage_key("sft", recipes[0], inputs)[0]
    )
