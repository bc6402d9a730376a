"""The trainer's set-up: the colocated rollout starts from the trainer's weights."""

from __future__ import annotations

import torch

from rl_algos.trainer.loop import RLTrainer


def test_the_first_rollout_after_init_has_the_trainers_weights(make_config, monkeypatch):
    from transformers import AutoModelForCausalLM

    from rl_rollout.backends.hf_engine import HFRolloutEngine

    engines: list[HFRolloutEngine] = []
    init = HFRolloutEngine.__init__

    def recording(self, config):
        init(self, config)
        engines.append(self)

    monkeypatch.setattr(HFRolloutEngine, "__init__", recording)
    config = make_config("grpo", ["trainer.backend=local", "trainer.num_workers=1"])
    trainer = RLTrainer(config)  # the worker lives in this process
    try:
        (engine,) = engines
        assert engine.config.engine_kwargs["load_format"] == "dummy"  # nothing read from disk
        direct = AutoModelForCausalLM.from_pretrained(trainer.model_path, dtype=torch.float32)
        state = engine.model.state_dict()
        for name, value in direct.state_dict().items():
            assert torch.equal(state[name], value), name
        ids = torch.tensor([[5, 17, 42, 7, 99]])
        with torch.no_grad():
            expected = direct(input_ids=ids).logits
            got = engine.model(input_ids=ids).logits
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
        assert torch.equal(got.argmax(-1), expected.argmax(-1))
    finally:
        trainer.close()
