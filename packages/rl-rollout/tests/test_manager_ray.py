"""The rollout manager with replicas as Ray actors: same layout as in-process, load balancing
and affinity measured on the engines themselves, a dead replica fails loudly, and the real
``hf`` engine behind two actors reports log-probs that match a separate forward."""

from __future__ import annotations

import os
from collections import defaultdict

import pytest
import torch
from rollout_test_utils import HashPolicy, ScriptedRolloutEngine, TurnScript

from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.agent_loop import AgentLoopConfig
from rl_rollout.manager import (
    RolloutManager,
    RolloutManagerConfig,
    RolloutReplicaError,
    RolloutTimeoutError,
)

pytestmark = pytest.mark.ray
IM_END = 2
LAYOUT_KEYS = (
    "prompts",
    "responses",
    "input_ids",
    "attention_mask",
    "position_ids",
    "response_mask",
    "rollout_log_probs",
)


@pytest.fixture(scope="module", autouse=True)
def ray_runtime():
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    yield
    ray.shutdown()


def prompt(tok, text: str) -> list[int]:
    return tok.encode(
        f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )


def manager_config(placement: str, tok) -> RolloutManagerConfig:
    """One config for the module: keyed tool-calling scripts for prompts "q0".."q7", the
    HashPolicy for every other prompt; tool rows pick the ``tool`` loop via ``agent_name``."""
    call = tok.encode(
        '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>'
    )
    turns = ((*call, IM_END), (9, 10, IM_END))
    policy = TurnScript(
        tuple((tuple(prompt(tok, f"q{i}")), turns) for i in range(8)),
        marker=tuple(tok.encode("<|im_start|>assistant\n")),
        fallback=HashPolicy(),
    )
    rollout = RolloutConfig(
        model_path="scripted", engine_kwargs={"policy": policy, "delay_s": 0.05}
    )
    return RolloutManagerConfig(
        rollout=rollout,
        num_replicas=2,
        placement=placement,
        num_cpus_per_replica=0.5,
        tools={"python": {}},
        loop=AgentLoopConfig(response_length=96),
        sampling=SamplingParams(max_tokens=64, stop_token_ids=(IM_END,)),
        request_timeout_s=60,
    )


@pytest.fixture(scope="module")
def ray_manager(tokenizer):
    manager = RolloutManager(manager_config("split", tokenizer), tokenizer, ScriptedRolloutEngine)
    yield manager
    manager.shutdown()


def test_ray_replicas_give_the_in_process_layout(ray_manager, tokenizer):
    batch = DataProto.from_dict(
        non_tensors={
            "raw_prompt_ids": [[11, 12, 13], [21], [31, 32, 33, 34, 35], [7, 7]],
            "uid": list("abcd"),
        }
    )
    with RolloutManager(
        manager_config("colocated", tokenizer), tokenizer, ScriptedRolloutEngine
    ) as local:
        expected = local.generate_sequences(batch)
    assert all(r.info["pid"] != os.getpid() for r in ray_manager.replicas)  # really in actors
    out = ray_manager.generate_sequences(batch)
    for key in LAYOUT_KEYS:
        assert torch.equal(out.batch[key], expected.batch[key]), key
    assert list(out.non_tensor_batch["uid"]) == list("abcd")
    assert out.batch["responses"][1, :2].tolist() == [29, IM_END]  # HashPolicy: sum 21 -> [29]


def test_ray_load_balancing_and_affinity_measured_on_the_engines(ray_manager, tokenizer):
    before_logs = [len(log) for log in ray_manager.call_engines("request_log")]
    before = ray_manager.replica_request_counts()
    prompts = [prompt(tokenizer, f"q{i}") for i in range(8)]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts, "agent_name": ["tool"] * 8})
    out = ray_manager.generate_sequences(batch)
    logs = [log[n:] for log, n in zip(ray_manager.call_engines("request_log"), before_logs)]
    counts = [a - b for a, b in zip(ray_manager.replica_request_counts(), before)]
    assert out.non_tensor_batch["num_turns"].tolist() == [2] * 8
    assert out.non_tensor_batch["num_tool_calls"].tolist() == [1] * 8
    assert out.non_tensor_batch["num_tool_errors"].tolist() == [0] * 8
    sessions = [defaultdict(int) for _ in logs]
    for replica, log in enumerate(logs):
        for request_id, _ in log:
            sessions[replica][request_id.rsplit("-", 1)[0]] += 1
    assert [len(log) for log in logs] == counts == [8, 8]  # 16 requests, split evenly
    assert set(sessions[0]).isdisjoint(sessions[1]) and [len(s) for s in sessions] == [4, 4]
    assert all(n == 2 for s in sessions for n in s.values())  # both turns on one replica


def test_dead_replica_fails_loudly(ray_manager):
    """Runs last in this module: it kills a replica of the shared manager."""
    import ray

    ray.kill(ray_manager.replicas[1].actor)
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1, 2], [3, 4], [5, 6]]})
    with pytest.raises(
        RolloutReplicaError,
        match=r"rollout replica 1 \(node [0-9a-f]+, pid \d+\) failed during request",
    ):
        ray_manager.generate_sequences(batch)


def test_replica_that_cannot_be_placed_fails_with_a_clear_error(tokenizer, monkeypatch, caplog):
    from rl_rollout import manager_replicas

    monkeypatch.setattr(manager_replicas, "START_WARNING_S", 1.0)
    config = manager_config("split", tokenizer)
    config.num_cpus_per_replica = 3.0  # more than the 2 CPUs of this Ray runtime
    config.start_timeout_s = 5
    with (
        caplog.at_level("WARNING", logger="rl_rollout.manager_replicas"),
        pytest.raises(
            RolloutTimeoutError,
            match=r"rollout replica \d .*did not start its engine within 5 s \(are enough CPUs",
        ),
    ):
        RolloutManager(config, tokenizer, ScriptedRolloutEngine)
    # said once after 1 s, naming what it asks for and what is free
    warned = [r.getMessage() for r in caplog.records if "not started after 1 s" in r.getMessage()]
    assert warned and "asks for {'CPU': 3.0, 'GPU': 0.0}" in warned[0], caplog.text
    assert "the cluster has {'CPU':" in warned[0]


@pytest.mark.slow
def test_hf_engine_behind_ray_actors(tiny_model_path):
    import transformers

    from rl_core.testing.rollout_engine import reference_log_probs

    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path=tiny_model_path, backend="hf", max_model_len=128),
        num_replicas=2,
        placement="split",
        num_cpus_per_replica=0.5,  # the module's shared scripted manager holds the rest
        start_timeout_s=300,
        loop=AgentLoopConfig(response_length=12),
        sampling=SamplingParams(temperature=1.0, max_tokens=12, stop_token_ids=(IM_END,), seed=3),
    )
    prompts = [[5, 6, 7, 8], [9, 10], [11, 12, 13], [14]]
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
    with RolloutManager(config) as manager:
        out = manager.generate_sequences(batch)
        counts = manager.replica_request_counts()
    assert counts == [2, 2]
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_path).double().eval()
    b = out.batch
    assert torch.equal(b["input_ids"], torch.cat([b["prompts"], b["responses"]], dim=1))
    assert torch.equal(b["position_ids"], (b["attention_mask"].cumsum(1) - 1).clamp(min=0))
    for row, prompt in enumerate(prompts):
        width = b["prompts"].shape[1]
        assert b["prompts"][row, width - len(prompt) :].tolist() == prompt
        n = int(b["response_mask"][row].sum())
        response = b["responses"][row, :n].tolist()
        assert b["attention_mask"][row, width:].tolist() == [1] * n + [0] * (12 - n)
        assert n == 12 or response[-1] == IM_END
        reference, _ = reference_log_probs(model, prompt, response, temperature=1.0)
        got = b["rollout_log_probs"][row, :n].double()
        assert torch.allclose(got, reference, atol=1e-4), row
