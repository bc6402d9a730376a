"""DataProto operations against independent references (numpy indexing done by hand).

Almost every operation is a selection of rows of the source batch, so each test computes the
expected row numbers with numpy/python and `assert_rows` checks every field (tensors, numeric
and object non-tensors, including dicts and ragged lists) against the source's reference copy.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict

import rl_core
from rl_core import DataProto

SIZES = [0, 1, 7]


def make_fields(n: int, seed: int = 0) -> tuple[dict, dict]:
    """Tensors and non-tensors (with nested and ragged objects) for `n` rows."""
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "input_ids": torch.randint(0, 100, (n, 5), generator=g),
        "attention_mask": (torch.rand(n, 5, generator=g) > 0.3).long(),
        "old_log_probs": torch.randn(n, 5, generator=g),
        "flags": torch.rand(n, generator=g) > 0.5,
        "pixels": torch.randn(n, 2, 3, 2, generator=g).to(torch.bfloat16),
    }
    non_tensors = {
        "uid": [f"u{i}" for i in range(n)],
        "extra_info": [
            {"index": i, "tags": ["t"] * (i % 3), "nested": {"k": [i, None]}} for i in range(n)
        ],
        "ragged": [list(range(i % 4)) for i in range(n)],
        "pair": [[i, i + 1] for i in range(n)],  # equal-length lists must stay one object per row
        "score": np.arange(n, dtype=np.float64) / 2,
    }
    return tensors, non_tensors


class Reference:
    """Plain numpy / python copies of a batch's fields, independent of DataProto."""

    def __init__(self, tensors: dict, non_tensors: dict):
        self.tensors = {
            k: v.float().numpy().copy() if v.dtype == torch.bfloat16 else v.numpy().copy()
            for k, v in tensors.items()
        }
        self.dtypes = {k: v.dtype for k, v in tensors.items()}
        self.trailing = {k: tuple(v.shape[1:]) for k, v in tensors.items()}
        self.non_tensors = {
            k: list(v) if isinstance(v, list) else v.copy() for k, v in non_tensors.items()
        }


def make(n: int, seed: int = 0, meta: dict | None = None) -> tuple[DataProto, Reference]:
    tensors, non_tensors = make_fields(n, seed)
    ref = Reference(tensors, non_tensors)
    return DataProto.from_dict(tensors, non_tensors, meta or {"temperature": 0.7}), ref


def assert_rows(dp: DataProto, ref: Reference, rows) -> None:
    """Every field of `dp` equals the reference's rows `rows` (computed independently)."""
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    assert len(dp) == len(rows)
    assert sorted(dp.batch.keys()) == sorted(ref.tensors)
    for key, expected in ref.tensors.items():
        got = dp.batch[key]
        assert got.dtype == ref.dtypes[key], key
        assert tuple(got.shape) == (len(rows), *ref.trailing[key]), key
        got_np = got.float().numpy() if got.dtype == torch.bfloat16 else got.numpy()
        np.testing.assert_array_equal(got_np, expected[rows], err_msg=key)
    assert sorted(dp.non_tensor_batch) == sorted(ref.non_tensors)
    for key, expected in ref.non_tensors.items():
        got = dp.non_tensor_batch[key]
        assert isinstance(got, np.ndarray) and got.shape[0] == len(rows), key
        if isinstance(expected, list):
            assert got.dtype == object and got.ndim == 1, key
            assert got.tolist() == [expected[i] for i in rows], key
        else:
            np.testing.assert_array_equal(got, expected[rows], err_msg=key)


# ---------------------------------------------------------------------------- construction


def test_exported_from_rl_core():
    assert rl_core.DataProto is DataProto and "DataProto" in rl_core.__all__


@pytest.mark.parametrize("n", SIZES)
def test_from_dict_holds_every_field(n):
    dp, ref = make(n)
    assert_rows(dp, ref, np.arange(n))
    assert isinstance(dp.batch, TensorDict) and list(dp.batch.batch_size) == [n]
    assert dp.meta_info == {"temperature": 0.7}
    assert dp.non_tensor_batch["pair"].shape == (n,)  # not (n, 2)


def test_from_dict_converts_lists_and_tuples_and_keeps_arrays_without_copy():
    score = np.arange(3.0)
    dp = DataProto.from_dict(non_tensors={"a": ["x", "y", "z"], "b": (1, 2, 3), "score": score})
    assert dp.non_tensor_batch["a"].dtype == object and dp.non_tensor_batch["a"].tolist() == [
        "x",
        "y",
        "z",
    ]
    assert dp.non_tensor_batch["b"].tolist() == [1, 2, 3]
    assert dp.non_tensor_batch["score"] is score


def test_only_non_tensor_fields():
    dp = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"], "obj": [{"x": 1}, [2], None]})
    assert dp.batch is None and len(dp) == 3
    assert dp[1:].non_tensor_batch["obj"].tolist() == [[2], None]
    assert [len(c) for c in dp.chunk(2)] == [2, 1]
    assert DataProto.concat(dp.chunk(2)).non_tensor_batch["uid"].tolist() == ["a", "b", "c"]
    assert dp.repeat(2).non_tensor_batch["uid"].tolist() == ["a", "a", "b", "b", "c", "c"]
    padded, pad = dp.pad_to_divisor(2)
    assert pad == 1 and padded.non_tensor_batch["uid"].tolist() == ["a", "b", "c", "a"]
    assert dp.select(non_tensor_batch_keys=["uid"]).non_tensor_batch.keys() == {"uid"}
    assert dp.reorder([2, 0, 1]).non_tensor_batch["uid"].tolist() == ["c", "a", "b"]
    assert len(dp.to("cpu")) == 3


def test_empty_dataproto_without_fields():
    dp = DataProto()
    assert len(dp) == 0 and dp.batch is None and dp.meta_info == {}
    assert [len(c) for c in dp.chunk(3)] == [0, 0, 0]
    padded, pad = dp.pad_to_divisor(4)
    assert (len(padded), pad) == (0, 0)


def test_mismatched_tensor_batch_sizes_name_fields_and_shapes():
    with pytest.raises(
        ValueError, match=r"'attention_mask' has shape \(3, 8\) but 'input_ids' has shape \(4, 8\)"
    ):
        DataProto.from_dict({"input_ids": torch.zeros(4, 8), "attention_mask": torch.zeros(3, 8)})


def test_mismatched_tensor_and_non_tensor_sizes():
    with pytest.raises(
        ValueError,
        match=r"non-tensor field 'uid' has 3 rows .* tensor 'input_ids' has shape \(4, 8\)",
    ):
        DataProto.from_dict({"input_ids": torch.zeros(4, 8)}, {"uid": ["a", "b", "c"]})
    with pytest.raises(
        ValueError, match=r"non_tensor_batch\['uid'\] has 3 rows .* batch has 4 rows"
    ):
        DataProto(
            TensorDict({"x": torch.zeros(4)}, batch_size=[4]), {"uid": np.array(["a", "b", "c"])}
        )
    with pytest.raises(ValueError, match=r"non_tensor_batch\['b'\] has 2 rows"):
        DataProto(None, {"a": np.zeros(3), "b": np.zeros(2)})


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("abc", r"non-tensor field 'v' is str 'abc'; expected a numpy array or a list"),
        (5, r"non-tensor field 'v' is int 5"),
        ({"a": 1}, r"non-tensor field 'v' is dict"),
        (torch.zeros(2), r"is torch.Tensor\(shape=\(2,\).*tensors belong in `tensors`"),
    ],
)
def test_wrong_non_tensor_types_are_rejected(value, message):
    with pytest.raises(TypeError, match=message):
        DataProto.from_dict(non_tensors={"v": value})


def test_constructor_checks_non_tensor_types_and_shapes():
    with pytest.raises(
        TypeError, match=r"non_tensor_batch\['uid'\] is list .*from_dict converts lists"
    ):
        DataProto(None, {"uid": ["a"]})
    with pytest.raises(ValueError, match=r"non_tensor_batch\['s'\] is a 0-d numpy array"):
        DataProto(None, {"s": np.array(3)})
    with pytest.raises(TypeError, match="meta_info must be a dict"):
        DataProto(None, {}, [("a", 1)])
    with pytest.raises(ValueError, match=r"exactly one batch dimension, got batch_size=\[2, 3\]"):
        DataProto(TensorDict({"x": torch.zeros(2, 3)}, batch_size=[2, 3]))
    with pytest.raises(TypeError, match="batch must be a TensorDict"):
        DataProto({"x": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"\['x'\] are both tensor and non-tensor fields"):
        DataProto(TensorDict({"x": torch.zeros(2)}, batch_size=[2]), {"x": np.zeros(2)})


def test_wrong_tensor_values_are_rejected():
    with pytest.raises(TypeError, match=r"tensor field 'ids' is numpy.ndarray\(shape=\(2,\)"):
        DataProto.from_dict({"ids": np.zeros(2)})
    with pytest.raises(ValueError, match=r"tensor field 'ids' is 0-dimensional"):
        DataProto.from_dict({"ids": torch.tensor(1.0)})


def test_check_consistency_catches_later_mutation():
    dp, _ = make(4)
    dp.check_consistency()
    dp.non_tensor_batch["late"] = ["a"] * 4
    with pytest.raises(TypeError, match=r"non_tensor_batch\['late'\] is list"):
        dp.check_consistency()
    dp.non_tensor_batch["late"] = np.zeros(5)
    with pytest.raises(
        ValueError, match=r"non_tensor_batch\['late'\] has 5 rows .* batch has 4 rows"
    ):
        dp.check_consistency()


# ---------------------------------------------------------------------------- rows


@pytest.mark.parametrize(
    "index",
    [
        0,
        -1,
        3,
        slice(1, 5),
        slice(None, None, 2),
        slice(5, 1, -1),
        slice(3, 3),
        [4, 0, 0, 6],
        np.array([-1, 2]),
        torch.tensor([5, 1]),
    ],
)
def test_getitem_matches_numpy_indexing(index):
    dp, ref = make(7)
    rows = (
        np.arange(7)[index] if not isinstance(index, torch.Tensor) else np.arange(7)[index.numpy()]
    )
    assert_rows(dp[index], ref, np.atleast_1d(rows))


def test_getitem_int_gives_length_one_and_bool_mask_selects():
    dp, ref = make(5)
    assert len(dp[2]) == 1
    assert_rows(dp[torch.tensor(2)], ref, [2])
    mask = np.array([True, False, True, True, False])
    assert_rows(dp[mask], ref, np.flatnonzero(mask))
    assert_rows(dp[torch.from_numpy(mask)], ref, np.flatnonzero(mask))
    assert_rows(dp[list(mask)], ref, np.flatnonzero(mask))
    assert_rows(dp[[]], ref, [])


def test_getitem_errors():
    dp, _ = make(5)
    with pytest.raises(IndexError, match="index 5 is out of range for a DataProto of length 5"):
        dp[5]
    with pytest.raises(IndexError, match="index -6 is out of range"):
        dp[[0, -6]]
    with pytest.raises(IndexError, match="bool mask has 3 entries but the DataProto has 5 rows"):
        dp[np.array([True, False, True])]
    with pytest.raises(TypeError, match="index must hold integers or bools"):
        dp[np.array([0.5])]
    with pytest.raises(TypeError, match="cannot index a DataProto with str"):
        dp["input_ids"]


def test_slices_are_views_and_index_arrays_are_copies():
    dp, _ = make(6)
    view, copy = dp[1:3], dp[[1, 2]]
    assert view.batch["input_ids"].data_ptr() == dp.batch["input_ids"][1].data_ptr()
    copy.batch["input_ids"].fill_(-1)
    assert (dp.batch["input_ids"] >= 0).all()


def test_iteration_yields_single_rows():
    dp, ref = make(3)
    rows = list(dp)
    assert len(rows) == 3
    for i, row in enumerate(rows):
        assert_rows(row, ref, [i])


@pytest.mark.parametrize("n", [*SIZES, 16])
@pytest.mark.parametrize("chunks", [1, 2, 3, 8])
def test_chunk_matches_array_split(n, chunks):
    dp, ref = make(n)
    parts = dp.chunk(chunks)
    expected = np.array_split(np.arange(n), chunks)
    assert len(parts) == chunks
    for part, rows in zip(parts, expected, strict=True):
        assert_rows(part, ref, rows)
        assert part.meta_info == dp.meta_info and part.meta_info is not dp.meta_info
    assert_rows(DataProto.concat(parts), ref, np.arange(n))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("size", [1, 3, 10])
def test_split_matches_hand_slicing(n, size):
    dp, ref = make(n)
    parts = dp.split(size)
    starts = list(range(0, n, size)) or [0]
    assert len(parts) == len(starts)
    for part, start in zip(parts, starts, strict=True):
        assert_rows(part, ref, np.arange(start, min(start + size, n)))
    assert_rows(DataProto.concat(parts), ref, np.arange(n))


@pytest.mark.parametrize(
    ("method", "arg", "message"),
    [
        ("chunk", 0, "chunks must be >= 1, got 0"),
        ("chunk", -2, "chunks must be >= 1, got -2"),
        ("split", 0, "split_size must be >= 1, got 0"),
        ("repeat", 0, "repeat_times must be >= 1, got 0"),
        ("pad_to_divisor", 0, "divisor must be >= 1, got 0"),
        ("unpad", -1, "pad_size must be >= 0, got -1"),
    ],
)
def test_bad_counts_raise(method, arg, message):
    dp, _ = make(4)
    with pytest.raises(ValueError, match=message):
        getattr(dp, method)(arg)


def test_counts_must_be_ints():
    dp, _ = make(4)
    with pytest.raises(TypeError, match=r"chunks must be an int, got float 2\.0"):
        dp.chunk(2.0)
    with pytest.raises(TypeError, match="repeat_times must be an int, got bool"):
        dp.repeat(True)


def test_concat_uneven_pieces_and_meta_merge():
    a, ref_a = make(3, seed=1, meta={"temperature": 0.7, "step": 1})
    b, _ = make(0, seed=2, meta={"temperature": 0.7})
    c, ref_c = make(4, seed=3, meta={"extra": [1, 2]})
    out = DataProto.concat([a, b, c])
    assert out.meta_info == {"temperature": 0.7, "step": 1, "extra": [1, 2]}
    assert_rows(out[:3], ref_a, np.arange(3))
    assert_rows(out[3:], ref_c, np.arange(4))
    assert_rows(DataProto.concat([a]), ref_a, np.arange(3))
    assert out.batch["input_ids"].data_ptr() != a.batch["input_ids"].data_ptr()


def test_concat_errors():
    a, _ = make(2)
    with pytest.raises(ValueError, match="at least one DataProto"):
        DataProto.concat([])
    b, _ = make(2)
    b.pop(batch_keys=["flags"])
    with pytest.raises(ValueError, match=r"item 1 has tensor fields .* but item 0 has .*'flags'"):
        DataProto.concat([a, b])
    c, _ = make(2)
    c.pop(non_tensor_batch_keys=["uid"])
    with pytest.raises(ValueError, match=r"item 1 has non-tensor fields"):
        DataProto.concat([a, c])
    d, _ = make(2, meta={"temperature": 1.0})
    with pytest.raises(
        ValueError,
        match=r"meta_info\['temperature'\] conflicts: float 0.7 \(item 0\) vs float 1.0 \(item 1\)",
    ):
        DataProto.concat([a, d])
    e, _ = make(2)
    e.batch["input_ids"] = e.batch["input_ids"].float()
    with pytest.raises(
        ValueError,
        match=r"tensor field 'input_ids' has shape \(2, 5\) torch.float32 in item 1 but \(2, 5\) torch.int64",
    ):
        DataProto.concat([a, e])
    with pytest.raises(TypeError, match="item 1 is dict"):
        DataProto.concat([a, {}])


# ---------------------------------------------------------------------------- fields


def test_union_adds_fields_without_copy_and_accepts_equal_duplicates():
    dp, ref = make(4)
    left = dp.select(batch_keys=["input_ids", "flags"], non_tensor_batch_keys=["uid"])
    right = dp.select(
        batch_keys=["input_ids", "attention_mask", "old_log_probs", "pixels"],
        non_tensor_batch_keys=["uid", "extra_info", "ragged", "pair", "score"],
        meta_info_keys=[],
    )
    right.batch["input_ids"] = dp.batch["input_ids"].clone()  # equal values, other memory
    right.non_tensor_batch["uid"] = dp.non_tensor_batch["uid"].copy()
    right.meta_info["top_p"] = 1.0
    out = left.union(right)
    assert_rows(out, ref, np.arange(4))
    assert out.meta_info == {"temperature": 0.7, "top_p": 1.0}
    assert out.batch["flags"].data_ptr() == dp.batch["flags"].data_ptr()
    assert "attention_mask" not in left.batch  # the inputs are unchanged


def test_union_with_nan_and_self():
    dp = DataProto.from_dict(
        {"x": torch.tensor([1.0, float("nan")])}, {"y": np.array([np.nan, 1.0])}
    )
    other = DataProto.from_dict(
        {"x": torch.tensor([1.0, float("nan")])}, {"y": np.array([np.nan, 1.0])}
    )
    assert len(dp.union(other)) == 2 and len(dp.union(dp)) == 2


def test_union_conflicts_name_the_field():
    dp, _ = make(3)
    other = dp.select()
    other.batch["input_ids"] = dp.batch["input_ids"] + 1
    with pytest.raises(ValueError, match=r"union: tensor field 'input_ids' differs"):
        dp.union(other)
    other = dp.select()
    other.non_tensor_batch["extra_info"] = np.array([{"index": 9}] * 3, dtype=object)
    with pytest.raises(ValueError, match=r"union: non-tensor field 'extra_info' differs"):
        dp.union(other)
    other = dp.select()
    other.meta_info["temperature"] = 1.0
    with pytest.raises(ValueError, match=r"union: meta_info\['temperature'\] conflicts"):
        dp.union(other)
    with pytest.raises(ValueError, match="different lengths: 3 vs 2"):
        dp.union(dp[:2])
    as_non_tensor = DataProto.from_dict(non_tensors={"input_ids": [1, 2, 3]})
    with pytest.raises(ValueError, match="both tensor and non-tensor"):
        dp.union(as_non_tensor)


def test_union_of_tensor_and_non_tensor_only_batches():
    tensors = DataProto.from_dict({"x": torch.arange(3)})
    objects = DataProto.from_dict(non_tensors={"uid": ["a", "b", "c"]})
    for out in (tensors.union(objects), objects.union(tensors)):
        assert out.batch["x"].tolist() == [0, 1, 2] and out.non_tensor_batch["uid"].tolist() == [
            "a",
            "b",
            "c",
        ]


def test_select_shares_memory_and_copies_meta_dict():
    dp, ref = make(4)
    out = dp.select(
        batch_keys=["input_ids"],
        non_tensor_batch_keys=["uid", "extra_info"],
        meta_info_keys=["temperature"],
    )
    assert list(out.batch.keys()) == ["input_ids"] and sorted(out.non_tensor_batch) == [
        "extra_info",
        "uid",
    ]
    assert out.batch["input_ids"] is dp.batch["input_ids"]
    assert out.non_tensor_batch["extra_info"].tolist() == ref.non_tensors["extra_info"]
    out.meta_info["new"] = 1
    assert "new" not in dp.meta_info
    full = dp.select()
    assert_rows(full, ref, np.arange(4))
    empty = dp.select(batch_keys=[], non_tensor_batch_keys=[])
    assert len(empty) == 4 and list(empty.batch.keys()) == [] and empty.non_tensor_batch == {}


def test_select_and_pop_missing_keys():
    dp, _ = make(2)
    with pytest.raises(KeyError, match="no tensor field 'nope'; tensor fields: "):
        dp.select(batch_keys=["nope"])
    with pytest.raises(KeyError, match="no non-tensor field 'nope'"):
        dp.select(non_tensor_batch_keys=["nope"])
    with pytest.raises(KeyError, match="no meta_info key 'nope'"):
        dp.pop(meta_info_keys=["nope"])
    with pytest.raises(KeyError, match="no non-tensor field 'nope'"):
        dp.pop(batch_keys=["input_ids"], non_tensor_batch_keys=["nope"])
    assert "input_ids" in dp.batch  # a failed pop removes nothing


def test_pop_moves_fields():
    dp, ref = make(5)
    popped = dp.pop(
        batch_keys=["old_log_probs"],
        non_tensor_batch_keys=["extra_info"],
        meta_info_keys=["temperature"],
    )
    assert list(popped.batch.keys()) == ["old_log_probs"] and list(popped.non_tensor_batch) == [
        "extra_info"
    ]
    assert popped.meta_info == {"temperature": 0.7} and dp.meta_info == {}
    np.testing.assert_array_equal(
        popped.batch["old_log_probs"].numpy(), ref.tensors["old_log_probs"]
    )
    assert popped.non_tensor_batch["extra_info"].tolist() == ref.non_tensors["extra_info"]
    assert "old_log_probs" not in dp.batch and "extra_info" not in dp.non_tensor_batch
    assert len(dp) == 5 and len(popped) == 5
    nothing = dp.pop()
    assert (
        list(nothing.batch.keys()) == []
        and nothing.non_tensor_batch == {}
        and len(dp.batch.keys()) == 4
    )


def test_nested_tensor_keys_survive_ops():
    batch = TensorDict(
        {"ids": torch.arange(4), "mm": {"pixels": torch.arange(8.0).view(4, 2)}}, batch_size=[4]
    )
    dp = DataProto(batch)
    assert dp[1:3].batch["mm", "pixels"].tolist() == [[2.0, 3.0], [4.0, 5.0]]
    assert DataProto.concat(dp.chunk(3)).batch["mm", "pixels"].equal(batch["mm", "pixels"])
    assert dp.repeat(2).batch["mm", "pixels"][:, 0].tolist() == [0, 0, 2, 2, 4, 4, 6, 6]
    assert dp.select(batch_keys=[("mm", "pixels")]).batch["mm", "pixels"].shape == (4, 2)
    popped = dp.pop(batch_keys=["mm"])
    assert popped.batch["mm", "pixels"].shape == (4, 2) and list(dp.batch.keys()) == ["ids"]


# ---------------------------------------------------------------------------- repeat / reorder / pad


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("times", [1, 3, 8])
@pytest.mark.parametrize("interleave", [True, False])
def test_repeat_matches_numpy(n, times, interleave):
    dp, ref = make(n)
    rows = np.repeat(np.arange(n), times) if interleave else np.tile(np.arange(n), times)
    out = dp.repeat(times, interleave=interleave)
    assert_rows(out, ref, rows)
    if n:
        out.batch["input_ids"].fill_(-1)
        assert (dp.batch["input_ids"] >= 0).all()  # the result owns its memory


@pytest.mark.parametrize("n", SIZES)
def test_reorder_in_place(n):
    dp, ref = make(n)
    perm = np.random.default_rng(n).permutation(n)
    for indices in (perm, torch.from_numpy(perm), perm.tolist()):
        fresh, _ = make(n)
        assert fresh.reorder(indices) is fresh
        assert_rows(fresh, ref, perm)
    dp.reorder(perm).reorder(np.argsort(perm))
    assert_rows(dp, ref, np.arange(n))


def test_reorder_errors():
    dp, ref = make(4)
    with pytest.raises(
        ValueError, match=r"must have shape \(4,\) \(one per row\), got shape \(3,\)"
    ):
        dp.reorder([0, 1, 2])
    with pytest.raises(IndexError, match=r"reorder index 4 is out of range \[0, 4\)"):
        dp.reorder([0, 1, 2, 4])
    with pytest.raises(IndexError, match="reorder index -1 is out of range"):
        dp.reorder([0, 1, 2, -1])
    with pytest.raises(ValueError, match=r"permutation of range\(4\); 1 appears 2 times"):
        dp.reorder([0, 1, 1, 2])
    with pytest.raises(TypeError, match="must be integers"):
        dp.reorder([0.0, 1.0, 2.0, 3.0])
    assert_rows(dp, ref, np.arange(4))  # untouched after every failure


@pytest.mark.parametrize(
    ("n", "divisor"), [(0, 4), (1, 1), (1, 4), (3, 8), (5, 2), (7, 3), (8, 4), (2, 7)]
)
def test_pad_to_divisor_wraps_rows_from_the_start(n, divisor):
    dp, ref = make(n)
    padded, pad = dp.pad_to_divisor(divisor)
    expected_pad = (divisor - n % divisor) % divisor
    assert pad == expected_pad and len(padded) % divisor == 0
    rows = [i % n for i in range(n + pad)] if n else []
    assert_rows(padded, ref, rows)
    assert padded.meta_info == dp.meta_info
    assert_rows(padded.unpad(pad), ref, np.arange(n))
    for part in padded.chunk(divisor):  # every DP rank gets real rows
        assert len(part) == len(padded) // divisor


def test_unpad_errors_and_zero():
    dp, ref = make(3)
    assert_rows(dp.unpad(0), ref, np.arange(3))
    assert_rows(dp.unpad(3), ref, [])
    with pytest.raises(ValueError, match="pad_size 4 exceeds the DataProto's length 3"):
        dp.unpad(4)


# ---------------------------------------------------------------------------- device, objects


def test_to_moves_in_place_and_returns_self():
    dp, _ = make(3)
    assert dp.to("cpu") is dp and dp.to(torch.device("cpu")) is dp
    assert dp.batch["input_ids"].device.type == "cpu"
    dp.batch = dp.batch.to(torch.float64)  # TensorDict casts: the DataProto still holds
    assert dp.to("cpu").batch["input_ids"].dtype == torch.float64


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.gpu
def test_to_cuda_and_back():
    dp, ref = make(4)
    dp.to("cuda")
    assert dp.batch["input_ids"].is_cuda
    assert_rows(dp[[3, 1]].to("cpu"), ref, [3, 1])


def test_object_rows_are_shared_references_after_repeat():
    dp = DataProto.from_dict(non_tensors={"info": [{"a": 1}]})
    out = dp.repeat(3)
    assert (
        out.non_tensor_batch["info"][0]
        is out.non_tensor_batch["info"][2]
        is dp.non_tensor_batch["info"][0]
    )


def test_object_non_tensors_survive_every_op():
    """Dicts, ragged lists, None and numpy arrays inside object arrays pass through every op."""
    values = [{"a": [1, {"b": None}]}, [1, 2, 3], None, np.arange(3), "text", (1, "x")]
    dp = DataProto.from_dict({"x": torch.arange(6)}, {"obj": values})

    def check(out, rows):
        got = out.non_tensor_batch["obj"]
        assert got.shape == (len(rows),)
        for g, i in zip(got, rows, strict=True):
            if isinstance(values[i], np.ndarray):
                np.testing.assert_array_equal(g, values[i])
            else:
                assert g == values[i]

    check(dp[::2], [0, 2, 4])
    check(dp[[5, 0]], [5, 0])
    check(DataProto.concat(dp.chunk(4)), range(6))
    check(dp.repeat(2, interleave=False), [*range(6), *range(6)])
    check(dp.pad_to_divisor(4)[0], [0, 1, 2, 3, 4, 5, 0, 1])
    check(dp.union(dp.select(non_tensor_batch_keys=[])), range(6))
    check(dp.select(), range(6))
    perm = [3, 1, 0, 5, 4, 2]
    check(dp.select().reorder(perm), perm)


def test_repr_lists_fields():
    dp, _ = make(2)
    text = repr(dp)
    assert (
        "len=2" in text
        and "input_ids: (2, 5) torch.int64" in text
        and "uid: (2,) object (non-tensor)" in text
    )


def test_batch_without_tensor_fields_keeps_its_length():
    dp, ref = make(4)
    keyless = dp.select(batch_keys=[])
    assert len(keyless) == 4 and list(keyless.batch.keys()) == []
    assert len(keyless.repeat(2)) == 8 and len(keyless[[0, 1]]) == 2
    assert len(keyless.pad_to_divisor(3)[0]) == 6 and len(DataProto.concat([keyless] * 2)) == 8
    keyless.reorder([3, 2, 1, 0])
    assert keyless.non_tensor_batch["uid"].tolist() == [
        ref.non_tensors["uid"][i] for i in [3, 2, 1, 0]
    ]
    merged = dp.select(batch_keys=[]).union(dp.select(non_tensor_batch_keys=[]))
    assert_rows(merged, ref, np.arange(4))
