"""Pickling DataProto: equality after round trips, out-of-band tensor payloads, and the
read-only buffer rules (simulated here with read-only memoryviews; Ray itself is tested in
test_protocol_ray.py)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rl_core import DataProto
from rl_core.protocol_transport import receive_mapped


def make_batch(n: int = 6) -> DataProto:
    g = torch.Generator().manual_seed(0)
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, 1000, (n, 16), generator=g),
            "attention_mask": torch.ones(n, 16, dtype=torch.int64),
            "log_probs": torch.randn(n, 16, generator=g),
            "bf16": torch.randn(n, 4, generator=g).to(torch.bfloat16),
            "mask": torch.rand(n, 3, generator=g) > 0.5,
            "cplx": torch.randn(n, 2, dtype=torch.complex64, generator=g),
        },
        {
            "uid": [f"uid-{i}" for i in range(n)],
            "extra_info": [{"i": i, "tags": ["a"] * i, "arr": None} for i in range(n)],
            "score": np.arange(n, dtype=np.float32),
        },
        {"temperature": 0.9, "tensor_meta": torch.arange(3)},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    """Field-by-field equality with torch/numpy/python comparisons (independent of DataProto)."""
    assert len(a) == len(b)
    keys_a = sorted(map(str, a.batch.keys(True, True))) if a.batch is not None else []
    keys_b = sorted(map(str, b.batch.keys(True, True))) if b.batch is not None else []
    assert keys_a == keys_b
    if a.batch is not None:
        for key, value in a.batch.items(True, True):
            other = b.batch[key]
            assert other.dtype == value.dtype and other.shape == value.shape, key
            assert torch.equal(other.cpu(), value.cpu()), key
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch)
    for key, value in a.non_tensor_batch.items():
        other = b.non_tensor_batch[key]
        assert other.dtype == value.dtype and other.shape == value.shape, key
        assert other.tolist() == value.tolist(), key
    assert a.meta_info.keys() == b.meta_info.keys()
    for key, value in a.meta_info.items():
        other = b.meta_info[key]
        assert torch.equal(other, value) if isinstance(value, torch.Tensor) else other == value


def tensor_bytes(dp: DataProto) -> int:
    return sum(t.numel() * t.element_size() for t in dp.batch.values(True, True))


def dumps_out_of_band(obj) -> tuple[bytes, list[pickle.PickleBuffer]]:
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return data, buffers


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_round_trip_every_protocol(protocol):
    dp = make_batch()
    back = pickle.loads(pickle.dumps(dp, protocol=protocol))
    assert_same(dp, back)
    assert not back.is_readonly
    back.batch["input_ids"].fill_(-1)  # the copy owns writable memory
    assert (dp.batch["input_ids"] >= 0).all()


def test_protocol5_sends_tensor_payloads_out_of_band():
    dp = make_batch()
    data, buffers = dumps_out_of_band(dp)
    # one buffer per tensor field and one for the numeric non-tensor array
    assert len(buffers) == len(list(dp.batch.keys())) + 1
    raw = [b.raw() for b in buffers]
    assert sum(m.nbytes for m in raw) == tensor_bytes(dp) + dp.non_tensor_batch["score"].nbytes
    # the buffers are the tensors' own memory: nothing was copied on the way out
    pointers = {t.data_ptr() for t in dp.batch.values()}
    assert {np.frombuffer(m, dtype=np.uint8).ctypes.data for m in raw[:-1]} == pointers
    assert len(data) < 2000  # in-band: structure, dtypes, shapes, strings and dicts only
    back = pickle.loads(data, buffers=buffers)
    assert_same(dp, back)
    # writable buffers are adopted without a copy
    assert back.batch["log_probs"].data_ptr() == dp.batch["log_probs"].data_ptr()


def test_views_send_only_their_own_bytes():
    dp = make_batch(64)
    part = dp.chunk(8)[3]
    data, buffers = dumps_out_of_band(part.select(non_tensor_batch_keys=[]))
    assert sum(b.raw().nbytes for b in buffers) == tensor_bytes(part) == tensor_bytes(dp) // 8
    assert_same(part.select(non_tensor_batch_keys=[]), pickle.loads(data, buffers=buffers))


def test_non_contiguous_and_nested_tensors():
    base = torch.arange(40.0).view(4, 10)
    batch = TensorDict(
        {
            "strided": base[:, ::3],
            "transposed": base.t().contiguous().t(),
            "mm": {"px": base[:, :2]},
        },
        batch_size=[4],
    )
    dp = DataProto(batch)
    data, buffers = dumps_out_of_band(dp)
    assert sum(b.raw().nbytes for b in buffers) == tensor_bytes(dp)  # only the viewed elements
    back = pickle.loads(data, buffers=buffers)
    assert_same(dp, back)
    assert back.batch["mm", "px"].tolist() == base[:, :2].tolist()


@pytest.mark.parametrize("n", [0, 1])
def test_empty_and_single_row(n):
    dp = make_batch(n)
    data, buffers = dumps_out_of_band(dp)
    assert_same(dp, pickle.loads(data, buffers=buffers))
    assert_same(dp, pickle.loads(pickle.dumps(dp, protocol=5)))


def test_non_tensor_only_and_empty_dataproto():
    dp = DataProto.from_dict(non_tensors={"obj": [{"a": [1, 2]}, [3], None]}, meta_info={"k": 1})
    back = pickle.loads(pickle.dumps(dp, protocol=5))
    assert back.batch is None and back.non_tensor_batch["obj"].tolist() == [
        {"a": [1, 2]},
        [3],
        None,
    ]
    assert back.meta_info == {"k": 1}
    empty = pickle.loads(pickle.dumps(DataProto(), protocol=5))
    assert len(empty) == 0 and empty.batch is None


def test_requires_grad_tensor_is_sent_as_data():
    dp = DataProto.from_dict({"w": torch.ones(2, 3, requires_grad=True)})
    back = pickle.loads(pickle.dumps(dp, protocol=5))
    assert back.batch["w"].tolist() == [[1.0] * 3] * 2 and not back.batch["w"].requires_grad


def test_sparse_tensor_falls_back_to_torch_pickling():
    sparse = torch.eye(3).to_sparse()
    dp = DataProto(TensorDict({"s": sparse}, batch_size=[3]))
    back = pickle.loads(pickle.dumps(dp, protocol=5))
    assert torch.equal(back.batch["s"].to_dense(), torch.eye(3))


def test_copy_and_deepcopy():
    dp = make_batch()
    shallow, deep = copy.copy(dp), copy.deepcopy(dp)
    assert_same(dp, shallow)
    assert_same(dp, deep)
    assert shallow.batch["input_ids"].data_ptr() == dp.batch["input_ids"].data_ptr()
    deep.batch["input_ids"].fill_(-1)
    deep.non_tensor_batch["extra_info"][0]["i"] = 99
    assert (dp.batch["input_ids"] >= 0).all() and dp.non_tensor_batch["extra_info"][0]["i"] == 0


def readonly_buffers(buffers: list[pickle.PickleBuffer]) -> list[memoryview]:
    """What a shared-memory store hands back: read-only memory the receiver must not write."""
    return [memoryview(bytes(b.raw())) for b in buffers]


def test_read_only_buffers_are_copied_by_default():
    dp = make_batch()
    data, buffers = dumps_out_of_band(dp)
    shared = readonly_buffers(buffers)
    back = pickle.loads(data, buffers=shared)
    assert_same(dp, back)
    assert not back.is_readonly
    shared_ptrs = {np.frombuffer(m, dtype=np.uint8).ctypes.data for m in shared}
    assert not {t.data_ptr() for t in back.batch.values()} & shared_ptrs
    assert back.non_tensor_batch["score"].flags.writeable
    back.batch["input_ids"].fill_(-1)
    assert bytes(shared[0]) == bytes(buffers[0].raw())  # the shared memory is untouched


def test_zero_copy_receive_maps_read_only_buffers_until_materialize():
    dp = make_batch()
    dp.zero_copy_receive = True
    data, buffers = dumps_out_of_band(dp)
    shared = readonly_buffers(buffers)
    back = pickle.loads(data, buffers=shared)
    assert_same(dp, back)
    assert back.is_readonly and back.zero_copy_receive and "read-only" in repr(back)
    shared_ptrs = {np.frombuffer(m, dtype=np.uint8).ctypes.data for m in shared}
    assert {t.data_ptr() for t in back.batch.values()} <= shared_ptrs  # zero-copy
    assert not back.non_tensor_batch["score"].flags.writeable

    # views keep the read-only mark, copies drop it
    assert back[1:3].is_readonly and back.chunk(2)[1].is_readonly
    assert back.select(batch_keys=["input_ids"]).is_readonly
    assert not back.select(batch_keys=[]).is_readonly
    assert not back[[0, 1]].is_readonly and not back.repeat(2).is_readonly
    assert not DataProto.concat(back.chunk(2)).is_readonly
    assert back.union(make_batch().select(batch_keys=["input_ids"])).is_readonly
    popped = back.select().pop(batch_keys=["log_probs"])
    assert popped.is_readonly

    assert back.materialize() is back and not back.is_readonly
    assert not {t.data_ptr() for t in back.batch.values()} & shared_ptrs
    assert_same(dp, back)


def test_receive_mapped_maps_without_the_sender_opting_in():
    dp = make_batch()
    data, buffers = dumps_out_of_band(dp)
    shared = readonly_buffers(buffers)
    shared_ptrs = {np.frombuffer(m, dtype=np.uint8).ctypes.data for m in shared}
    with receive_mapped():
        back = pickle.loads(data, buffers=shared)
    assert back.is_readonly and not back.zero_copy_receive  # the sender's flag is kept
    assert {t.data_ptr() for t in back.batch.values()} <= shared_ptrs
    assert_same(dp, back)
    merged = DataProto.concat(back.chunk(2))
    assert not merged.is_readonly
    assert not {t.data_ptr() for t in merged.batch.values()} & shared_ptrs
    # outside the block the receive copies again
    again = pickle.loads(data, buffers=shared)
    assert not again.is_readonly
    assert not {t.data_ptr() for t in again.batch.values()} & shared_ptrs


def test_reorder_and_pop_clear_read_only_marks():
    dp = make_batch()
    dp.zero_copy_receive = True
    data, buffers = dumps_out_of_band(dp)
    back = pickle.loads(data, buffers=readonly_buffers(buffers))
    assert not back.select().reorder(list(range(len(dp)))[::-1]).is_readonly
    rest = back.select(batch_keys=["input_ids", "log_probs"])
    rest.pop(batch_keys=["input_ids", "log_probs"])
    assert not rest.is_readonly


def test_unknown_state_version_is_rejected():
    dp = make_batch(2)
    state = dp.__getstate__()
    state["version"] = 99
    target = DataProto.__new__(DataProto)
    with pytest.raises(ValueError, match="state version 99"):
        target.__setstate__(state)
