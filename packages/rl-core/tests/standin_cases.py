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
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    try:
        value = torch.tensor([2.0, 3.0], device=device)
        dist.all_reduce(value)
        assert value.cpu().tolist() == [2.0, 3.0] and value.device == device
    finally:
        dist.destroy_process_group()
    return {"empty": empty}
