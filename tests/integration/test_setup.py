"""The trainer's set-up: inputs load while Ray starts, the rollout takes the trainer's weights."""

from __future__ import annotations

import threading

import pytest
import torch

from rl_algos.errors import UserInputError
from rl_algos.trainer import loop
from rl_algos.trainer.loop import RLTrainer


class _Stop(Exception):
    """Ends the set-up once the test saw what it wanted."""


def test_inputs_load_while_ray_starts_and_before_any_worker(make_config, monkeypatch):
    events: list[str] = []
    ray_starting = threading.Event()
    load_data = RLTrainer._load_data

    def load(self, cfg):
        # blocks until Ray's start began: a loader that ran before it would time out here
        assert ray_starting.wait(60), "the inputs were not loaded while Ray started"
        events.append("inputs loading")
        load_data(self, cfg)
        events.append("inputs loaded")

    def start(cfg, model_path, timing, before_workers):
        events.append("ray starting")
        ray_starting.set()
        before_workers()  # waits for the inputs
        events.append("workers starting")
        raise _Stop

    monkeypatch.setattr(RLTrainer, "_load_data", load)
    monkeypatch.setattr(loop, "start_role_groups", start)
    with pytest.raises(_Stop):
        RLTrainer(make_config("grpo"))
    assert events == ["ray starting", "inputs loading", "inputs loaded", "workers starting"]


def test_a_mistake_in_the_inputs_stops_the_setup_before_any_worker(
    make_config, tmp_path, monkeypatch
):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no list of messages", "data_source": "digits"}\n')
    started: list[str] = []

    def start(cfg, model_path, timing, before_workers):
        started.append("ray")
        before_workers()
        started.append("workers")  # never reached

    monkeypatch.setattr(loop, "start_role_groups", start)
    with pytest.raises(UserInputError, match=r"data\.train_files row 0"):
        RLTrainer(make_config("grpo", [f"data.train_files=[{bad}]"]))
    assert started == ["ray"]


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
