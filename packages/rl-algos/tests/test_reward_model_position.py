"""The reward model's score lands on the last response token by attention mask (not by
counting `response_mask`, which is 0 on tool tokens mid-response); tokenizer check."""

from __future__ import annotations

import pytest
import torch

from rl_algos.errors import ConfigError
from rl_algos.trainer.preflight import check_same_tokenizer
from rl_algos.trainer.workers import score_on_last_token
from rl_core import DataProto


def test_score_goes_to_the_last_attended_response_token_in_multi_turn_rows():
    # 2 prompt columns, 6 response columns; row 0: a multi-turn response whose tool tokens
    # (columns 2-3) are masked out of response_mask but attended; row 1: 2 tokens; row 2: none
    attention = torch.tensor(
        [[1, 1, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]]
    )
    response_mask = torch.tensor([[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]])
    values = torch.arange(18, dtype=torch.float32).reshape(3, 6) + 1
    batch = DataProto.from_dict(
        {"attention_mask": attention, "response_mask": response_mask, "responses": values.long()}
    )
    scores = score_on_last_token(values, batch)
    expected = torch.zeros(3, 6)
    expected[0, 4] = values[0, 4]  # by hand: response columns 0..4 attended -> index 4
    expected[1, 1] = values[1, 1]  # (counting response_mask would give index 2 for row 0)
    assert torch.equal(scores, expected)


def test_reward_model_tokenizer_must_match_the_policy(tokenizer):

    check_same_tokenizer(tokenizer, tokenizer)
    import copy

    changed = copy.deepcopy(tokenizer)
    changed.add_tokens(["<extra>"])
    with pytest.raises(ConfigError, match=r"reward\.model_path: .*tokenizer differs"):
        check_same_tokenizer(tokenizer, changed)
