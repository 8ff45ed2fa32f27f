"""`launcher: accelerate`: training stages as two gloo ranks under `accelerate launch` on CPU."""


import pytest

from conftest import TINY, run_flow
from regimen.stages.recipe import load_recipe
from regimen.stages.run.launcher import accelerate_command
from regimen.stages.store import Store


def test_command_uses_the_torchrun_path_for_several_processes(tmp_path):
    r = load_recipe(TINY, ["launcher=accelerate", "accelerate.num_processes=2"])
    cmd = accelerate_command(r, tmp_path / "spec.json")
    assert "--multi_gpu" in cmd and "--cpu" not in cmd
    assert cmd[cmd.index("--num_processes") + 1] == "2" and cmd[-3:] == ["-m", "regimen.stages.run.launch_entry", str(tmp_path / "spec.json")]
    r = load_recipe(TINY, ["launcher=accelerate", "accelerate.config_file=configs/accelerate/ddp.yaml"])
    cmd = accelerate_command(r, tmp_path / "spec.json")
    assert cmd[cmd.index("--config_file") + 1] == "configs/accelerate/ddp.yaml" and "--multi_gpu" not in cmd


@pytest.mark.slow
def test_two_process_run_completes_with_gloo_ranks(tmp_path):

    results = run_flow(TINY, tmp_path, overrides={"launcher": "accelerate", "accelerate.num_processes": 2})
    assert [r["stage"] for r in results][-1] == "eval"
    s = Store(tmp_path)
    for stage in ("sft", "grpo-smoke", "grpo"):
        m = s.latest("tiny-test", stage)
        assert m["launch"] == {"launcher": "accelerate", "num_processes": 2, "backend": "gloo"}, stage
        assert s.verify(m) == []
    grpo = s.latest("tiny-test", "grpo")
    assert grpo["metrics"]["steps"] == 6 and grpo["metrics"]["beta"] > 0
    assert s.latest("tiny-test", "reward-dry-run")["launch"]["launcher"] == "inprocess"
    assert not list((tmp_path / "tiny-test" / "grpo").glob("work/*/ranks/*.pid"))


@pytest.mark.slow
def test_a_failing_rank_fails_the_stage_with_its_last_lines(tmp_path, monkeypatch):
    from regimen.stages.core.errors import StageStopped

    monkeypatch.setenv("REGIMEN_FAULT", "grpo@2")
    with pytest.raises(StageStopped, match="accelerate launch .2 processes. exited with code") as exc:
        run_flow(TINY, tmp_path, overrides={"launcher": "accelerate", "accelerate.num_processes": 2})
    assert "injected fault" in str(exc.value)
    [fail] = Store(tmp_path).ledger.failures("tiny-test", "grpo")
    assert "injected fault" in fail["error"]
    assert Store(tmp_path).versions("tiny-test", "grpo") == []
