"""ActionTokenizer: exact round trips, clipping and errors, against hand-computed bins."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_multimodal.vla.action_tokenizer import ActionTokenizer


def test_last_ids_and_bin_centres_round_trip_exactly():
    tok = ActionTokenizer([-1.0, 0.0], [1.0, 10.0], n_bins=4, vocab_size=100)
    np.testing.assert_array_equal(tok.token_ids, [96, 97, 98, 99])
    # hand computation: widths 0.5 and 2.5; centres low + (k + 0.5) * width
    np.testing.assert_allclose(tok.bin_centers()[0], [-0.75, -0.25, 0.25, 0.75])
    np.testing.assert_allclose(tok.bin_centers()[1], [1.25, 3.75, 6.25, 8.75])
    grid = np.stack(np.meshgrid(np.arange(4), np.arange(4), indexing="ij"), -1).reshape(-1, 2)
    ids = tok.token_ids[grid]
    decoded = tok.decode(ids)
    np.testing.assert_array_equal(tok.encode(decoded), ids)  # decode -> encode is the identity
    np.testing.assert_allclose(decoded, tok.bin_centers()[[0, 1], grid].astype(np.float32))


def test_encode_bins_edges_and_clipping():
    tok = ActionTokenizer([-1.0], [1.0], n_bins=4, token_ids=[7, 3, 9, 1])
    actions = np.array([[-1.0], [-0.5001], [-0.5], [0.0], [0.9999], [1.0], [5.0], [-3.0]])
    # bins: floor((a + 1) / 0.5), the upper bound in the last bin, outside values clipped
    np.testing.assert_array_equal(tok.bins(actions)[:, 0], [0, 0, 1, 2, 3, 3, 3, 0])
    np.testing.assert_array_equal(tok.encode(actions)[:, 0], [7, 7, 3, 9, 1, 1, 1, 7])
    rng = np.random.default_rng(0)
    a = rng.uniform(-1, 1, (1000, 1))
    assert np.abs(tok.decode(tok.encode(a)) - a).max() <= 0.25 + 1e-6  # half a bin
    assert tok.decode(torch.tensor([[9]])).tolist() == [[0.25]]


def test_clear_errors():
    with pytest.raises(ValueError, match="n_bins is 1, expected >= 2"):
        ActionTokenizer([0.0], [1.0], n_bins=1, vocab_size=10)
    with pytest.raises(ValueError, match="expected finite low < high"):
        ActionTokenizer([1.0], [1.0], n_bins=2, vocab_size=10)
    with pytest.raises(ValueError, match="vocab_size 3 is smaller than n_bins 4"):
        ActionTokenizer([0.0], [1.0], n_bins=4, vocab_size=3)
    with pytest.raises(ValueError, match=r"token_ids: 2 ids \(1 distinct\), expected 2 distinct"):
        ActionTokenizer([0.0], [1.0], n_bins=2, token_ids=[5, 5])
    tok = ActionTokenizer([0.0, 0.0], [1.0, 1.0], n_bins=2, vocab_size=10)
    with pytest.raises(ValueError, match=r"actions: shape \(3,\), expected \[..., 2\]"):
        tok.encode(np.zeros(3))
    with pytest.raises(ValueError, match="NaN"):
        tok.encode(np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match=r"token ids \[5\] are not action tokens"):
        tok.decode(np.array([5, 8]))
