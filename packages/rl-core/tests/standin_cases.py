"""The rank-side check of `test_standin.py`, in a module spawned processes can import."""

from __future__ import annotations

import pytest
import torch


def behaviour(tmp: str) -> dict[str, int]:
    import torch.distributed as dist

    from rl_core.platform import get_platform
    from rl_core.testing.standin import StandInTensor, allocated_bytes, install

    device = install()
    platform = get_platform("standin")
    assert platform.is_available() and platform.device(0) == device
    empty = allocated_bytes()
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).to(device)
    assert x.device == device and isinstance(x, StandInTensor)
    assert allocated_bytes() - empty == 6 * 4
    host = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match="same device"):
        x + host
    assert float((x * 2 + torch.tensor(1.0)).sum()) == 2 * 15 + 6  # a 0-dim CPU scalar is fine
    back = x.cpu()
    assert type(back) is torch.Tensor and back.device.type == "cpu"
    assert back.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    made = torch.tensor([1.5, 2.5], device=device)
    assert made.device == device and made.cpu().tolist() == [1.5, 2.5]
    w = torch.nn.Linear(3, 1).to(device)
    w(x).sum().backward()
    assert w.weight.grad.device == device
    torch.testing.assert_close(w.weight.grad.cpu(), back.sum(0, keepdim=True))
    del x, made, w
    assert allocated_bytes() == empty  # freed with the tensors
    dist.init_process_group("standin", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    try:
        value = torch.tensor([2.0, 3.0], device=device)
        dist.all_reduce(value)
        assert value.cpu().tolist() == [2.0, 3.0] and value.device == device
    finally:
        dist.destroy_process_group()
    return {"empty": empty}


def strict_collectives(tmp: str) -> dict[str, object]:
    """Rank side of the NCCL-strict check: every covered call refuses a host tensor on the
    device group and works on device tensors; an explicit gloo group takes host tensors;
    object collectives need a current device."""
    import os

    import torch.distributed as dist

    from rl_core.testing.standin import install
    from rl_core.testing.standin_collectives import HostTensorInCollective, NoCurrentDevice

    device = install()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("standin", init_method=f"file://{tmp}/strict", rank=rank,
                            world_size=world)  # fmt: skip
    peer = 1 - rank
    host_group = dist.new_group(backend="gloo")
    refused: list[str] = []

    def refuses(name: str, call) -> None:
        with pytest.raises(HostTensorInCollective) as info:
            call()
        message = str(info.value)
        assert name in message and f"rank {rank}" in message and "cpu" in message, message
        refused.append(name)

    try:
        # the object collectives before any current device: refused, as under NCCL
        with pytest.raises(NoCurrentDevice, match=f"all_gather_object on rank {rank}"):
            dist.all_gather_object([None] * world, rank)
        torch.standin.set_device(0)
        gathered = [None] * world
        dist.all_gather_object(gathered, {"rank": rank})
        assert gathered == [{"rank": r} for r in range(world)]
        box = [f"from {rank}"]
        dist.broadcast_object_list(box, src=1)
        assert box == ["from 1"]
        with pytest.raises(HostTensorInCollective):  # an explicit host device is refused too
            dist.broadcast_object_list([1], src=0, device=torch.device("cpu"))

        host = torch.full((4,), float(rank + 1))
        on_device = host.to(device)
        refuses("all_reduce", lambda: dist.all_reduce(host))
        refuses("broadcast", lambda: dist.broadcast(host, src=0))
        refuses("reduce", lambda: dist.reduce(host, dst=0))
        refuses("all_gather", lambda: dist.all_gather([on_device.clone(), host.clone()], on_device))
        refuses("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(torch.empty(8), host))
        refuses("reduce_scatter_tensor",
                lambda: dist.reduce_scatter_tensor(torch.empty(2, device=device), host))  # fmt: skip
        refuses("reduce_scatter", lambda: dist.reduce_scatter(host, [host, host]))
        refuses("all_to_all_single", lambda: dist.all_to_all_single(torch.empty(4), host))
        refuses("all_to_all", lambda: dist.all_to_all([host, host], [host, host]))
        refuses("send", lambda: dist.send(host, dst=peer))
        refuses("recv", lambda: dist.recv(host, src=peer))
        refuses("isend", lambda: dist.isend(host, dst=peer))
        refuses("irecv", lambda: dist.irecv(host, src=peer))
        refuses("batch_isend_irecv",
                lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, host, peer)]))  # fmt: skip

        # the same calls on device tensors work, with the right numbers
        total = on_device.clone()
        dist.all_reduce(total)
        assert total.device == device and total.cpu().tolist() == [3.0] * 4
        out = torch.empty(8, device=device)
        dist.all_gather_into_tensor(out, on_device)
        assert out.cpu().tolist() == [1.0] * 4 + [2.0] * 4
        shard = torch.empty(2, device=device)
        dist.reduce_scatter_tensor(shard, torch.arange(4.0).to(device))
        assert shard.cpu().tolist() == [2.0 * v for v in range(4)][2 * rank : 2 * rank + 2]
        swapped = torch.empty(4, device=device)
        dist.all_to_all_single(swapped, torch.arange(4.0).to(device) + 10 * rank)
        expect = [0.0, 1.0, 10.0, 11.0] if rank == 0 else [2.0, 3.0, 12.0, 13.0]
        assert swapped.cpu().tolist() == expect
        received = torch.empty(4, device=device)
        ops = [dist.P2POp(dist.isend, on_device, peer), dist.P2POp(dist.irecv, received, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        assert received.cpu().tolist() == [float(peer + 1)] * 4
        sent = on_device.clone()
        dist.broadcast(sent, src=0)
        assert sent.cpu().tolist() == [1.0] * 4

        # an explicit gloo group is a host group: host tensors are fine there
        on_host = host.clone()
        dist.all_reduce(on_host, group=host_group)
        assert on_host.tolist() == [3.0] * 4
        dist.all_gather_object(gathered, rank, group=host_group)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return {"refused": refused}
