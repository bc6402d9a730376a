"""Helpers of the rollout-engine conformance suite that need no engine and no transformers."""

import asyncio
import math
import threading

import pytest
import torch

from rl_core.testing.rollout_engine import AsyncRunner, truncated_log_probs


def test_truncated_log_probs_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], dtype=torch.float64)
    # top-k 3 -> {0, 1, 2}; their probabilities e^2, e^1, e^0 over the sum; top-p 0.8 keeps
    # token 0 (0.665) and token 1 (0.910 >= 0.8), then renormalises over {0, 1}
    out = truncated_log_probs(logits, top_k=3, top_p=0.8)[0]
    z = math.log(math.e**2 + math.e)
    assert out[0].item() == pytest.approx(2 - z)
    assert out[1].item() == pytest.approx(1 - z)
    assert out[2].item() == float("-inf") and out[3].item() == float("-inf")
    # no truncation: plain log-softmax
    full = truncated_log_probs(logits, top_k=-1, top_p=1.0)
    torch.testing.assert_close(full, logits.log_softmax(-1))
    # top-k 1 keeps only the argmax with log-prob 0
    assert truncated_log_probs(logits, top_k=1, top_p=1.0)[0, 0].item() == 0.0


def test_async_runner_keeps_one_loop_in_a_thread():
    runner = AsyncRunner()
    try:

        async def where():
            return asyncio.get_running_loop(), threading.current_thread()

        loop1, thread1 = runner.run(where())
        loop2, _ = runner.run(where())
        assert loop1 is loop2 is runner.loop and thread1 is not threading.current_thread()
        assert runner.call(lambda: asyncio.get_running_loop()) is runner.loop
        with pytest.raises(ZeroDivisionError):
            runner.call(lambda: 1 / 0)
    finally:
        runner.close()
    assert not runner.loop.is_running()
