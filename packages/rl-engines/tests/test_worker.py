"""EngineWorker: the FSDP engine driven through a worker group (LocalWorkerGroup, world 1)
and through its methods on every rank of a 2-process group; both match the engine."""

from __future__ import annotations

import fsdp_cases
import pytest
import torch

from rl_core.engine import build_engine
from rl_core.single_controller import ClassWithInitArgs, LocalWorkerGroup, ResourcePool
from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import engine_config, pg_loss, save_tiny_model
from rl_engines import EngineWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("qwen2")), "qwen2")


@pytest.mark.slow
def test_world2_worker_methods_match_the_engine(model_dir, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    runner = SpawnRunner.shared(2)
    got = runner.run(fsdp_cases.worker_round_trip, model_dir, ckpt)
    want = runner.run(fsdp_cases.train_steps, model_dir, {}, range(2))
    assert got[0]["metrics"] == got[1]["metrics"] == want[0]["metrics"]
    for name, tensor in want[0]["weights"].items():
        assert torch.equal(got[0]["weights"][name], tensor), name
    assert got[0]["log_probs"].shape == (4, 8)


def test_local_worker_group_trains_infers_saves_and_exports(model_dir, tmp_path):
    cfg = engine_config(model_dir, {}, optim=fsdp_cases.OPTIM)
    group = LocalWorkerGroup(
        ResourcePool([1]), ClassWithInitArgs(EngineWorker, "fsdp", cfg, loss_fn=pg_loss)
    )
    assert group.init_engine() == [{"dp_rank": 0, "dp_size": 1, "step": 0}]
    metrics = [
        group.train_batch(fsdp_cases.batch_for_step(s)).meta_info["metrics"] for s in range(2)
    ]
    group.save(str(tmp_path / "ckpt"))
    batch = fsdp_cases.batch_for_step(5)
    batch.meta_info["outputs"] = ["log_probs", "entropy"]
    out = group.infer_batch(batch)
    assert set(out.batch.keys()) == {"log_probs", "entropy"} and len(out) == len(batch)
    (weights,) = group.export_weights()

    # the same steps on a bare engine in this process give the same numbers
    engine = build_engine("fsdp", cfg)
    for step, m in enumerate(metrics):
        assert engine.train_batch(fsdp_cases.batch_for_step(step), pg_loss) == m
    direct = engine.infer_batch(batch, outputs=("log_probs", "entropy"))
    assert torch.equal(direct.batch["log_probs"], out.batch["log_probs"])
    for name, tensor in (t for b in engine.export_weights() for t in b):
        assert torch.equal(weights[name], tensor), name
    assert group.load(str(tmp_path / "ckpt")) == [2]


def test_training_without_a_loss_function_is_an_error(model_dir):
    group = LocalWorkerGroup(
        ResourcePool([1]), ClassWithInitArgs(EngineWorker, "fsdp", engine_config(model_dir, {}))
    )
    group.init_engine()
    with pytest.raises(Exception, match="no loss function"):
        group.train_batch(fsdp_cases.batch_for_step(0))
