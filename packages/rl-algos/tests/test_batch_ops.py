"""Driver-side batch operations of the trainer: padding trims, group ids and seeds, metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.trainer.batch_ops import (
    add_group_ids_and_seeds,
    batch_metrics,
    guide_prompts,
    guided_metrics,
    timed,
    tool_metrics,
    trim_padding,
    unguide_prompts,
    with_reference_responses,
)
from rl_core.protocol import DataProto

PAD = 0


def _rollout_batch() -> DataProto:
    """3 rows, prompt width 5 (left-padded; real lengths 2, 3, 1), response width 4
    (right-padded; real lengths 1, 2, 0), laid out by hand."""
    prompts = torch.tensor(
        [
            [PAD, PAD, PAD, 11, 12],
            [PAD, PAD, 21, 22, 23],
            [PAD, PAD, PAD, PAD, 31],
        ]
    )
    responses = torch.tensor(
        [
            [13, PAD, PAD, PAD],
            [24, 25, PAD, PAD],
            [PAD, PAD, PAD, PAD],
        ]
    )
    prompt_mask = torch.tensor([[0, 0, 0, 1, 1], [0, 0, 1, 1, 1], [0, 0, 0, 0, 1]])
    response_mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    log_probs = torch.tensor([[-0.5, 0.0, 0.0, 0.0], [-1.0, -2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
    scores = torch.zeros(3, 4)
    scores[0, 0], scores[1, 1] = 1.0, 0.25
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "rollout_log_probs": log_probs,
            "token_level_scores": scores,
            "row_scalar": torch.tensor([7.0, 8.0, 9.0]),
        },
        non_tensors={"uid": ["a", "b", "c"]},
        meta_info={"temperature": 0.7},
    )


def test_trim_padding_cuts_exactly_the_all_padding_columns():
    batch = _rollout_batch()
    out = trim_padding(batch)
    t, ref = out.batch, batch.batch
    # longest real prompt: 3 -> keep the last 3 prompt columns; longest response: 2
    assert torch.equal(t["prompts"], ref["prompts"][:, 2:])
    assert torch.equal(t["responses"], torch.tensor([[13, PAD], [24, 25], [PAD, PAD]]))
    kept = [2, 3, 4, 5, 6]  # prompt columns 2..4, response columns 0..1 of the 9 columns
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(t[key], ref[key][:, kept]), key
    for key in ("response_mask", "rollout_log_probs", "token_level_scores"):
        assert torch.equal(t[key], ref[key][:, :2]), key
    assert torch.equal(t["row_scalar"], ref["row_scalar"])
    # nothing real was cut: every kept mask sums to the original
    assert torch.equal(t["attention_mask"].sum(-1), ref["attention_mask"].sum(-1))
    assert torch.equal(t["response_mask"].sum(-1), ref["response_mask"].sum(-1))
    # the layout invariants still hold after the cut
    width = t["prompts"].shape[1]
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    assert torch.equal(t["position_ids"], (t["attention_mask"].cumsum(-1) - 1).clamp(min=0))
    assert torch.equal(t["attention_mask"][:, width:], t["response_mask"])
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"]
    assert out.meta_info == {"temperature": 0.7}
    assert all(t[k].is_contiguous() for k in t.keys())  # noqa: SIM118


def test_trim_padding_keeps_one_response_column_when_every_response_is_empty():
    batch = _rollout_batch()[2:3]  # the row with an empty response
    out = trim_padding(batch)
    assert out.batch["responses"].shape == (1, 1)
    assert out.batch["prompts"].shape == (1, 1)
    assert out.batch["input_ids"].tolist() == [[31, PAD]]
    assert out.batch["attention_mask"].tolist() == [[1, 0]]


def _prompts(size: int) -> DataProto:
    ids = torch.arange(size * 3).reshape(size, 3)
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids)},
        non_tensors={"index": list(range(size))},
    )


def test_group_ids_and_seeds_layout():
    out = add_group_ids_and_seeds(_prompts(3), n=4, step=5, seed=1)
    assert len(out) == 12
    uids = list(out.non_tensor_batch["uid"])
    # interleaved: the n samples of a prompt are adjacent and share its uid
    assert [uids[i] for i in range(0, 12, 4)] == list(dict.fromkeys(uids))
    for p in range(3):
        assert len(set(uids[4 * p : 4 * p + 4])) == 1
        assert out.non_tensor_batch["index"][4 * p] == p
        assert torch.equal(out.batch["input_ids"][4 * p + 3], torch.arange(3) + 3 * p)
    seeds = [int(s) for s in out.non_tensor_batch["seed"]]
    assert len(set(seeds)) == 12 and seeds == list(range(seeds[0], seeds[0] + 12))


def test_group_ids_and_seeds_depend_only_on_seed_step_and_row():
    first = add_group_ids_and_seeds(_prompts(4), n=2, step=3, seed=7)
    # global RNG state must not matter (a resumed process has a different history)
    np.random.seed(123)
    torch.manual_seed(456)
    np.random.rand(10)
    again = add_group_ids_and_seeds(_prompts(4), n=2, step=3, seed=7)
    for key in ("uid", "seed"):
        assert list(first.non_tensor_batch[key]) == list(again.non_tensor_batch[key])
    for other in (
        add_group_ids_and_seeds(_prompts(4), n=2, step=4, seed=7),
        add_group_ids_and_seeds(_prompts(4), n=2, step=3, seed=8),
    ):
        assert not set(other.non_tensor_batch["seed"]) & set(first.non_tensor_batch["seed"])
        assert not set(other.non_tensor_batch["uid"]) & set(first.non_tensor_batch["uid"])


def test_batch_metrics_against_hand_computation():
    batch = _rollout_batch()
    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"] - 0.5
    batch.batch["advantages"] = torch.tensor(
        [[2.0, 99.0, 99.0, 99.0], [-1.0, 1.0, 99.0, 99.0], [99.0, 99.0, 99.0, 99.0]]
    )
    m = batch_metrics(batch, max_response_length=2)
    # scores per row: 1.0, 0.25, 0.0
    assert m["critic/score/mean"] == pytest.approx(1.25 / 3)
    assert m["critic/score/max"] == 1.0 and m["critic/score/min"] == 0.0
    assert m["critic/rewards/mean"] == pytest.approx((1.25 - 6.0) / 3)
    # advantages only where the response mask is 1 (the 99s are padding)
    assert m["critic/advantages/mean"] == pytest.approx(2.0 / 3)
    assert m["critic/advantages/max"] == 2.0 and m["critic/advantages/min"] == -1.0
    assert m["response_length/mean"] == pytest.approx(1.0)
    assert m["response_length/clip_ratio"] == pytest.approx(1 / 3)  # one row reached 2
    assert m["prompt_length/mean"] == pytest.approx(2.0)
    assert "critic/values/mean" not in m and "critic/returns/mean" not in m


def test_timed_accumulates_wall_time():
    timing: dict[str, float] = {}
    for _ in range(2):
        with timed(timing, "phase"):
            pass
    assert set(timing) == {"phase"} and 0 <= timing["phase"] < 1
    with pytest.raises(RuntimeError), timed(timing, "failing"):
        raise RuntimeError("boom")
    assert "failing" in timing  # recorded even when the block raises


def test_tool_metrics_from_the_agent_loops_counts():
    """4 samples: 0, 2, 1, 0 tool calls (1 of them an error), 1, 3, 2, 1 turns."""
    batch = DataProto.from_dict(
        {"x": torch.zeros(4, 1)},
        {
            "num_tool_calls": np.array([0, 2, 1, 0]),
            "num_tool_errors": np.array([0, 1, 0, 0]),
            "num_turns": np.array([1, 3, 2, 1]),
        },
    )
    assert tool_metrics(batch, "rollout") == {
        "rollout/tool_call_rate": 0.5,
        "rollout/tool_calls/mean": 0.75,
        "rollout/tool_errors/mean": 0.25,
        "rollout/num_turns/mean": 1.75,
    }
    assert tool_metrics(DataProto.from_dict({"x": torch.zeros(2, 1)}), "val") == {}


def test_guided_rows_read_the_guide_and_come_back_with_their_own_prompt():
    prompts = DataProto.from_dict(
        tensors={"input_ids": torch.zeros(3, 1, dtype=torch.long)},
        non_tensors={
            "raw_prompt_ids": [[11, 12], [21, 22, 23], [31]],
            "g_ids": [[91, 92, 93, 94], [81], [71, 72]],
        },
    )
    asked = guide_prompts(prompts, "g_ids", np.array([True, False, True]))
    assert [list(x) for x in asked.non_tensor_batch["raw_prompt_ids"]] == [
        [91, 92, 93, 94], [21, 22, 23], [71, 72]
    ]  # fmt: skip
    assert prompts.non_tensor_batch["raw_prompt_ids"][0] == [11, 12]  # the input is untouched
    # the rollout's output (laid out after the guide, here by hand) gets its own prompts back
    out = _rollout_batch()
    out.non_tensor_batch.update(
        own_prompt_ids=asked.non_tensor_batch["own_prompt_ids"],
        guided=asked.non_tensor_batch["guided"],
    )
    back = unguide_prompts(out, PAD)
    t = back.batch
    assert t["prompts"].tolist() == [[PAD, 11, 12], [21, 22, 23], [PAD, PAD, 31]]
    assert t["input_ids"][:, 3:].tolist() == out.batch["responses"].tolist()
    assert t["attention_mask"].tolist() == [
        [0, 1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 0, 0, 0, 0]
    ]  # fmt: skip
    assert t["position_ids"][1].tolist() == [0, 1, 2, 3, 4, 4, 4]
    assert "rollout_log_probs" not in set(t.keys())  # computed after the guide's prompt
    assert "own_prompt_ids" not in back.non_tensor_batch
    assert torch.equal(t["token_level_scores"], out.batch["token_level_scores"])
    metrics = guided_metrics(back)  # row scores 1.0, 0.25, 0.0; rows 0 and 2 guided
    assert metrics == {
        "rollout/guided_share": pytest.approx(2 / 3),
        "reward/guided_mean": pytest.approx(0.5),
        "reward/own_mean": pytest.approx(0.25),
    }
    hot = guide_prompts(prompts, "g_ids", np.array([True, False, True]), temperature=0.3)
    assert hot.non_tensor_batch["temperature"].tolist() == [0.3, None, 0.3]  # guided rows only
    assert "temperature" not in asked.non_tensor_batch  # none given: the rollout's for all
    out.non_tensor_batch["temperature"] = hot.non_tensor_batch["temperature"]
    assert "temperature" not in unguide_prompts(out, PAD).non_tensor_batch
    prompts.non_tensor_batch["g_ids"][2] = []
    with pytest.raises(ValueError, match=r"g_ids: row 2 has no token ids \(expected a non-empty"):
        guide_prompts(prompts, "g_ids", np.array([True, False, True]))


def test_reference_rows_join_the_generated_ones_laid_out_as_generated_responses():
    """5 rows, rows 0 and 3 references; rows 1, 2 and 4 generated (`_rollout_batch`'s)."""
    batch = DataProto.from_dict(
        tensors={"input_ids": torch.zeros(5, 1, dtype=torch.long)},
        non_tensors={
            "raw_prompt_ids": [[41, 42, 43, 44], [11, 12], [21, 22, 23], [51], [31]],
            "ref_ids": [[61, 62, 2], [9], [9], [71, 72, 73, 2], [9]],
            "uid": ["r", "a", "b", "s", "c"],
        },
    )
    reference = np.array([True, False, False, True, False])
    generated = _rollout_batch()
    del generated.batch["token_level_scores"], generated.batch["row_scalar"]
    generated.non_tensor_batch.update(
        finish_reason=np.array(["stop", "length", "stop"], dtype=object),
        num_turns=np.array([1, 1, 1]),
        raw_prompt_ids=batch.non_tensor_batch["raw_prompt_ids"][~reference],
    )
    out = with_reference_responses(batch, generated, reference, "ref_ids", PAD)
    t, nt = out.batch, out.non_tensor_batch
    assert t["responses"].tolist() == [
        [61, 62, 2, PAD], [13, PAD, PAD, PAD], [24, 25, PAD, PAD], [71, 72, 73, 2],
        [PAD, PAD, PAD, PAD],
    ]  # fmt: skip
    assert t["response_mask"].tolist() == [
        [1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]
    ]  # fmt: skip
    # own prompts, left-padded to the longest (4); the responses right after them
    assert t["prompts"].tolist() == [
        [41, 42, 43, 44], [PAD, PAD, 11, 12], [PAD, 21, 22, 23], [PAD, PAD, PAD, 51],
        [PAD, PAD, PAD, 31],
    ]  # fmt: skip
    assert torch.equal(t["input_ids"], torch.cat([t["prompts"], t["responses"]], dim=1))
    assert t["attention_mask"][0].tolist() == [1, 1, 1, 1, 1, 1, 1, 0]
    assert t["attention_mask"][2].tolist() == [0, 1, 1, 1, 1, 1, 0, 0]
    assert t["position_ids"][3].tolist() == [0, 0, 0, 0, 1, 2, 3, 4]
    assert "rollout_log_probs" not in set(t.keys())  # a reference was never sampled
    assert nt["uid"].tolist() == ["r", "a", "b", "s", "c"]
    assert nt["finish_reason"].tolist() == ["stop", "stop", "length", "stop", "stop"]
    assert nt["num_turns"].dtype == np.int64 and nt["num_turns"].tolist() == [1] * 5
    assert nt["reference"].tolist() == reference.tolist()
    assert nt["guided"].tolist() == reference.tolist()  # no guided rows among the generated
    out.batch["token_level_scores"] = torch.zeros(5, 4)
    out.batch["token_level_scores"][[0, 1, 3], 0] = torch.tensor([1.0, 0.5, 1.0])
    assert guided_metrics(out) == {
        "rollout/guided_share": pytest.approx(0.4),
        "reward/reference_mean": pytest.approx(1.0),
        "reward/own_mean": pytest.approx(0.5 / 3),
    }
    with pytest.raises(ValueError, match="3 generated rows for 2 rows that are not references"):
        with_reference_responses(batch, generated, ~reference, "ref_ids", PAD)
    batch.non_tensor_batch["ref_ids"][3] = [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match=r"ref_ids: row 3 has 5 tokens; expected 1..4"):
        with_reference_responses(batch, generated, reference, "ref_ids", PAD)
    generated.batch["routed_experts"] = torch.zeros(3, 8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"carry \['routed_experts'\], which a reference"):
        with_reference_responses(batch, generated, reference, "ref_ids", PAD)
