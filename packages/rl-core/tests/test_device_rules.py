"""Device rules: which device a worker takes, which platform a cluster gets, where
transported tensors land, and the chunked LM-head log-probs against a float64 reference."""

from __future__ import annotations

import pickle

import pytest
import torch

from rl_core.engine import linear_log_probs_and_entropy, token_log_probs_and_entropy
from rl_core.platform import (
    PLATFORMS,
    CpuPlatform,
    MemoryInfo,
    Platform,
    PlatformUnavailableError,
    platform_for_cluster,
)
from rl_core.protocol import DataProto
from rl_core.single_controller.worker import WorkerInfo


class _NodeGpus(Platform):
    """An accelerator platform on a simulated 8-GPU node: the devices a process sees are
    the ids in its visible-devices variable (all 8 when unset), as CUDA does."""

    name = "node-gpus"
    device_type = "cuda"
    dist_backend = "nccl"
    visible_devices_env = "NODE_VISIBLE_DEVICES"
    ray_resource = "GPU"
    package = "rl-core-tests"
    node_devices = 8

    def __init__(self, environ: dict[str, str] | None = None) -> None:
        self.environ = {} if environ is None else environ
        self.current = None

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        ids = self.visible_device_ids(self.environ)
        return self.node_devices if ids is None else len(ids)

    def torch_module(self):
        raise AssertionError("no device module in this test")

    def set_device(self, index: int) -> None:
        assert 0 <= index < self.device_count(), index
        self.current = index

    def device(self, index: int | None = None) -> torch.device:
        return torch.device("cuda", index)

    def memory_info(self, index=None) -> MemoryInfo:
        return MemoryInfo(free=1, total=1)


@pytest.mark.parametrize("workers_per_node", [2, 4, 8])
def test_each_worker_takes_the_one_device_it_can_see(workers_per_node):
    """Ray narrows each actor's visible devices to its own GPU: every local rank must use
    index 0 there, whatever its LOCAL_RANK (asking for LOCAL_RANK crashed rank 1)."""
    assigned = [str(7 - 2 * r % 8) for r in range(workers_per_node)]  # any ids Ray hands out
    seen = set()
    for local_rank in range(workers_per_node):
        environ = {}
        environ.update(_NodeGpus().visible_devices_env_updates([assigned[local_rank]]))
        platform = _NodeGpus(environ)
        index = platform.local_device_index(local_rank, workers_per_node)
        assert index == 0
        # the physical device behind index 0 is the one Ray assigned to this rank
        seen.add(platform.visible_device_ids(environ)[index])
    assert seen == set(assigned[:workers_per_node])


@pytest.mark.parametrize("workers_per_node", [2, 4, 8])
def test_processes_that_see_the_whole_node_use_their_local_rank(workers_per_node):
    """torchrun-style: every process sees all 8 devices; rank r takes device r."""
    indices = []
    for local_rank in range(workers_per_node):
        platform = _NodeGpus({})
        device = platform.select_device(local_rank, workers_per_node)
        assert platform.current == local_rank and device == torch.device("cuda", local_rank)
        indices.append(device.index)
    assert indices == list(range(workers_per_node))


def test_too_few_visible_devices_is_a_clear_error():
    platform = _NodeGpus({"NODE_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(ValueError, match=r"local rank 2 of 4 processes .* sees 2 devices"):
        platform.local_device_index(2, 4)
    with pytest.raises(ValueError, match="local_rank=4 is out of range"):
        platform.local_device_index(4, 4)
    empty = _NodeGpus({"NODE_VISIBLE_DEVICES": ""})
    with pytest.raises(PlatformUnavailableError, match="sees no device"):
        empty.local_device_index(0, 1)


def test_cpu_processes_all_use_the_host(monkeypatch):
    cpu = CpuPlatform()
    assert [cpu.local_device_index(r, 8) for r in range(8)] == [0] * 8
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert cpu.process_device() == torch.device("cpu")
    assert cpu.auto_dtype == torch.float32 and cpu.get_rng_state() is None


@pytest.fixture
def node_gpus_registered():
    PLATFORMS.register("node-gpus", _NodeGpus)
    yield
    PLATFORMS.unregister("node-gpus")


def test_cluster_resources_pick_the_platform_not_the_driver(node_gpus_registered, monkeypatch):
    # a CPU-only driver, GPU workers: the cluster's GPU resource decides
    clashing = [n for n in PLATFORMS.names() if n != "node-gpus"]
    for name in clashing:  # installed GPU plugins (rl-nvidia, rl-amd) would be ambiguous
        if PLATFORMS.get(name).ray_resource == "GPU":
            monkeypatch.setattr(PLATFORMS.get(name), "ray_resource", None)
    assert platform_for_cluster({"CPU": 64.0, "GPU": 8.0}) == "node-gpus"
    assert platform_for_cluster({"CPU": 64.0}) == "cpu"
    assert platform_for_cluster({"CPU": 64.0, "GPU": 0.0}) == "cpu"
    assert platform_for_cluster({"CPU": 2.0, "GPU": 8.0}, "cpu") == "cpu"  # explicit wins


def test_ambiguous_gpu_platforms_must_be_named(node_gpus_registered, monkeypatch):
    class _Other(_NodeGpus):
        name = "other-gpus"

    PLATFORMS.register("other-gpus", _Other)
    try:
        with pytest.raises(ValueError, match="name one explicitly"):
            platform_for_cluster({"GPU": 1.0})
        assert platform_for_cluster({"GPU": 1.0}, "other-gpus") == "other-gpus"
    finally:
        PLATFORMS.unregister("other-gpus")


def test_the_torch_build_breaks_a_tie_between_gpu_platforms(node_gpus_registered, monkeypatch):
    class _OtherBuild(_NodeGpus):
        name = "other-build-gpus"

        def matches_torch_build(self) -> bool:
            return False

    for name in PLATFORMS.names():  # installed GPU plugins would join the tie
        if name != "node-gpus" and PLATFORMS.get(name).ray_resource == "GPU":
            monkeypatch.setattr(PLATFORMS.get(name), "ray_resource", None)
    PLATFORMS.register("other-build-gpus", _OtherBuild)
    try:
        assert platform_for_cluster({"CPU": 8.0, "GPU": 1.0}) == "node-gpus"
        monkeypatch.setattr(_NodeGpus, "matches_torch_build", lambda self: False)
        with pytest.raises(ValueError, match="name one explicitly"):  # neither: still a tie
            platform_for_cluster({"GPU": 1.0})
    finally:
        PLATFORMS.unregister("other-build-gpus")


def test_unknown_platform_name_lists_the_installed_ones():
    with pytest.raises(Exception, match="cpu"):
        platform_for_cluster({}, "no-such-platform")


def test_workers_learn_their_group_platform_from_the_environment():
    info = WorkerInfo("actor", 1, 2, 1, 2, "127.0.0.1", 1234, "n", "127.0.0.1", platform="cuda")
    env = info.dist_env()
    assert env["RL_PLATFORM"] == "cuda" and env["LOCAL_RANK"] == "1"


def test_transport_never_moves_tensors_to_the_senders_device():
    """A received DataProto lives in host memory whatever device string it was sent with
    (here a forged state claiming cuda:1 on a machine without CUDA)."""
    dp = DataProto.from_dict({"x": torch.arange(6.0).reshape(3, 2)}, meta_info={"k": 1})
    reduced = dp.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    cls_args, state = reduced[1], reduced[2]
    forged = dict(state, batch_device="cuda:1")
    forged["tensors"] = [(k, (*c[:3], "cuda:1")) for k, c in state["tensors"]]
    out = reduced[0](*cls_args)
    out.__setstate__(forged)
    assert out.batch["x"].device.type == "cpu"
    assert torch.equal(out.batch["x"], dp.batch["x"])
    assert out.batch.device in (None, torch.device("cpu"))
    # and what the sender records is host memory, always
    assert {c[3] for _, c in state["tensors"]} == {"cpu"}


@pytest.mark.parametrize("chunk", [0, 1, 5, 64])
@pytest.mark.parametrize("with_entropy", [True, False])
def test_chunked_lm_head_log_probs_match_float64(chunk, with_entropy):
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    bias = torch.randn(50, requires_grad=True)
    labels = torch.randint(0, 50, (3, 7))
    temperature = 0.7
    lp, ent = linear_log_probs_and_entropy(
        hidden, weight, labels, temperature, with_entropy, chunk, bias
    )
    assert lp.shape == labels.shape and lp.dtype == torch.float32
    # independent float64 reference, written from the definition
    z = (hidden.double() @ weight.double().T + bias.double()) / temperature
    logp = z - z.logsumexp(-1, keepdim=True)
    ref_lp = logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ref_ent = -(logp.exp() * logp).sum(-1)
    torch.testing.assert_close(lp.double(), ref_lp, atol=1e-5, rtol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent.double(), ref_ent, atol=1e-5, rtol=1e-5)
    else:
        assert ent is None
    # gradients through the recomputed chunks equal the float64 ones
    coeff = torch.randn(3, 7, dtype=torch.float64)
    objective = (lp.double() * coeff).sum() + ((ent.double() * coeff).sum() if with_entropy else 0)
    grads = torch.autograd.grad(objective, (hidden, weight, bias))
    h64, w64, b64 = (t.detach().double().requires_grad_() for t in (hidden, weight, bias))
    z = (h64 @ w64.T + b64) / temperature
    logp = z - z.logsumexp(-1, keepdim=True)
    ref = (logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1) * coeff).sum()
    if with_entropy:
        ref = ref + (-(logp.exp() * logp).sum(-1) * coeff).sum()
    ref_grads = torch.autograd.grad(ref, (h64, w64, b64))
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)


def test_chunked_head_equals_full_logits_path_exactly_without_chunking():
    torch.manual_seed(1)
    hidden, weight = torch.randn(4, 9, 8), torch.randn(30, 8)
    labels = torch.randint(0, 30, (4, 9))
    lp, ent = linear_log_probs_and_entropy(hidden, weight, labels, 1.0, True, 0)
    ref_lp, ref_ent = token_log_probs_and_entropy(hidden @ weight.T, labels, 1.0)
    assert torch.equal(lp, ref_lp) and torch.equal(ent, ref_ent)
    with pytest.raises(ValueError, match="labels"):
        linear_log_probs_and_entropy(hidden, weight, labels[:, :3])
