"""DataProto through Ray's object store: ray.put/ray.get in the driver and through an actor.

By default a received batch is copied out of the read-only shared memory once (safe to
write; the stored object stays intact). With `zero_copy_receive=True` the tensors map the
shared memory: two `ray.get`s of one object see the same addresses.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rl_core import DataProto

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_session():
    import ray

    saved = {k: os.environ.get(k) for k in ("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "RAY_AUTH_MODE")}
    # Under `uv run`, Ray would build a fresh venv for its workers; use this interpreter.
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    os.environ["RAY_AUTH_MODE"] = "disabled"
    # "local": start a fresh instance; without it ray.init() joins any Ray instance already
    # running on this machine (another test session's, for example).
    ray.init(address="local", num_cpus=1, include_dashboard=False)
    yield ray
    ray.shutdown()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def make_batch(n: int = 8, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    return DataProto.from_dict(
        {
            "input_ids": torch.randint(0, 1000, (n, 4096), generator=g),  # 32 KiB per row
            "log_probs": torch.randn(n, 4096, generator=g),
            "bf16": torch.randn(n, 3, generator=g).to(torch.bfloat16),
        },
        {
            "uid": [f"uid-{i}" for i in range(n)],
            "extra_info": [{"i": i, "ragged": list(range(i % 3))} for i in range(n)],
            "score": np.arange(n, dtype=np.float64),
        },
        {"temperature": 0.5},
    )


def assert_same(a: DataProto, b: DataProto) -> None:
    assert len(a) == len(b)
    if a.batch is None:
        assert b.batch is None
    else:
        assert sorted(a.batch.keys()) == sorted(b.batch.keys())
        for key, value in a.batch.items():
            assert b.batch[key].dtype == value.dtype and torch.equal(b.batch[key], value), key
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch)
    for key, value in a.non_tensor_batch.items():
        assert b.non_tensor_batch[key].tolist() == value.tolist(), key
    assert a.meta_info == b.meta_info


class Consumer:
    """Stands in for a worker: reads, writes in place, and returns results."""

    def describe(self, dp: DataProto) -> dict:
        return {
            "len": len(dp),
            "readonly": dp.is_readonly,
            "sum": dp.batch["input_ids"].sum().item() if dp.batch is not None else None,
            "uids": dp.non_tensor_batch["uid"].tolist(),
            "extra": dp.non_tensor_batch["extra_info"].tolist(),
        }

    def scale_in_place(self, dp: DataProto) -> DataProto:
        dp.batch["log_probs"].mul_(2.0)  # in place on the received batch
        dp.batch["input_ids"][:, 0] = -1
        out = dp.repeat(2, interleave=True)
        out.non_tensor_batch["seen"] = np.array(["yes"] * len(out), dtype=object)
        return out

    def zero_copy_addresses(self, refs: list) -> tuple[bool, bool, bool]:
        import ray

        first, second = ray.get(refs[0]), ray.get(refs[0])
        same = first.batch["input_ids"].data_ptr() == second.batch["input_ids"].data_ptr()
        first.materialize()
        return first.is_readonly, second.is_readonly, same


@pytest.fixture(scope="module")
def consumer(ray_session):
    actor = ray_session.remote(num_cpus=0)(Consumer).remote()
    yield actor
    ray_session.kill(actor)


@pytest.mark.parametrize("n", [0, 1, 8])
def test_put_get_round_trip_is_writable_and_leaves_the_store_intact(ray_session, n):
    dp = make_batch(n)
    ref = ray_session.put(dp)
    back = ray_session.get(ref, timeout=60)
    assert_same(dp, back)
    assert not back.is_readonly and back.non_tensor_batch["score"].flags.writeable
    if n:
        back.batch["input_ids"].fill_(-1)  # would corrupt the store if it mapped it
        again = ray_session.get(ref, timeout=60)
        assert again.batch["input_ids"].data_ptr() != back.batch["input_ids"].data_ptr()
        assert_same(dp, again)


def test_zero_copy_receive_maps_the_object_store(ray_session):
    dp = make_batch()
    dp.zero_copy_receive = True
    ref = ray_session.put(dp)
    first, second = ray_session.get(ref, timeout=60), ray_session.get(ref, timeout=60)
    assert_same(dp, first)
    assert first.is_readonly and second.is_readonly
    for key in ("input_ids", "log_probs", "bf16"):  # both gets map the same shared memory
        assert first.batch[key].data_ptr() == second.batch[key].data_ptr()
    assert first.batch["input_ids"].data_ptr() != dp.batch["input_ids"].data_ptr()
    first.materialize()
    assert not first.is_readonly
    first.batch["input_ids"].fill_(-1)
    assert_same(dp, ray_session.get(ref, timeout=60))


def test_non_tensor_only_and_nested_objects(ray_session):
    dp = DataProto.from_dict(
        non_tensors={"obj": [{"a": [1, {"b": None}]}, [1, 2, 3], None, "text"]},
        meta_info={"k": [1, 2]},
    )
    back = ray_session.get(ray_session.put(dp), timeout=60)
    assert back.batch is None and back.meta_info == {"k": [1, 2]}
    assert back.non_tensor_batch["obj"].tolist() == [
        {"a": [1, {"b": None}]},
        [1, 2, 3],
        None,
        "text",
    ]


def test_through_an_actor(ray_session, consumer):
    dp = make_batch()
    expected_sum = int(dp.batch["input_ids"].numpy().sum())
    info = ray_session.get(consumer.describe.remote(dp), timeout=60)
    assert info["len"] == 8 and info["sum"] == expected_sum and not info["readonly"]
    assert info["uids"] == [f"uid-{i}" for i in range(8)]
    assert info["extra"] == [{"i": i, "ragged": list(range(i % 3))} for i in range(8)]

    ref = ray_session.put(dp)
    out = ray_session.get(consumer.scale_in_place.remote(ref), timeout=60)
    rows = np.repeat(np.arange(8), 2)
    expected_log_probs = dp.batch["log_probs"].numpy()[rows] * 2.0
    expected_ids = dp.batch["input_ids"].numpy()[rows]
    expected_ids[:, 0] = -1
    np.testing.assert_array_equal(out.batch["log_probs"].numpy(), expected_log_probs)
    np.testing.assert_array_equal(out.batch["input_ids"].numpy(), expected_ids)
    assert out.non_tensor_batch["uid"].tolist() == [f"uid-{i}" for i in rows]
    assert out.non_tensor_batch["seen"].tolist() == ["yes"] * 16
    assert out.meta_info == {"temperature": 0.5}
    # the actor wrote into its received copy; the stored object and the driver's batch are intact
    assert_same(dp, ray_session.get(ref, timeout=60))
    assert expected_sum == int(dp.batch["input_ids"].sum())


def test_chunks_through_an_actor(ray_session, consumer):
    dp = make_batch(10)
    refs = [ray_session.put(part) for part in dp.chunk(4)]
    infos = ray_session.get([consumer.describe.remote(r) for r in refs], timeout=60)
    splits = np.array_split(np.arange(10), 4)
    ids = dp.batch["input_ids"].numpy()
    for info, rows in zip(infos, splits, strict=True):
        assert info["len"] == len(rows) and info["sum"] == int(ids[rows].sum())
        assert info["uids"] == [f"uid-{i}" for i in rows]


def test_zero_copy_receive_in_an_actor(ray_session, consumer):
    dp = make_batch()
    dp.zero_copy_receive = True
    ref = ray_session.put(dp)
    first_readonly, second_readonly, same_address = ray_session.get(
        consumer.zero_copy_addresses.remote([ref]), timeout=60
    )
    assert same_address and second_readonly and not first_readonly
    info = ray_session.get(consumer.describe.remote(ref), timeout=60)
    assert info["readonly"] and info["sum"] == int(dp.batch["input_ids"].sum())
