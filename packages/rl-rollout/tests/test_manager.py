"""The rollout manager in-process (``placement="colocated"``): the exact batch layout of
`generate_sequences` (hand-built, position by position), agent loops per row, load
balancing and conversation affinity measured per replica, time-outs, failures, bad input."""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import pytest
import torch
from rollout_test_utils import (
    HashPolicy,
    ScriptedRolloutEngine,
    TurnScript,
    scripted_log_prob,
)

from rl_core import UnknownPluginError
from rl_core.protocol import DataProto
from rl_core.rollout import RolloutConfig, SamplingParams
from rl_rollout.agent_loop import AgentLoopConfig
from rl_rollout.manager import (
    RolloutManager,
    RolloutManagerConfig,
    RolloutReplicaError,
    RolloutTimeoutError,
)
from rl_rollout.tools import TOOLS, FunctionTool

IM_END = 2


def manager_config(
    policy=None, response_length=8, num_replicas=1, delay_s=0.0, **kw
) -> RolloutManagerConfig:
    kwargs = {"policy": policy or HashPolicy(), "delay_s": delay_s}
    rollout = RolloutConfig(
        model_path="scripted", max_model_len=kw.pop("max_model_len", 4096), engine_kwargs=kwargs
    )
    return RolloutManagerConfig(
        rollout=rollout,
        num_replicas=num_replicas,
        placement="colocated",
        loop=AgentLoopConfig(response_length=response_length),
        sampling=SamplingParams(max_tokens=64, stop_token_ids=(IM_END,)),
        **kw,
    )


def local_manager(config, tokenizer=None) -> RolloutManager:
    return RolloutManager(config, tokenizer=tokenizer, engine_factory=ScriptedRolloutEngine)


def engines(manager):
    return [replica.host.engine for replica in manager.replicas]


PROMPTS = [[11, 12, 13], [21], [31, 32, 33, 34, 35]]


def layout_batch() -> DataProto:
    return DataProto.from_dict(
        non_tensors={
            "raw_prompt_ids": PROMPTS,
            "uid": ["a", "b", "c"],
            "data_source": ["x", "y", "z"],
        },
        meta_info={"global_steps": 3},
    )


def test_generate_sequences_layout_is_exact():
    with local_manager(manager_config()) as manager:
        out = manager.generate_sequences(layout_batch())
    # HashPolicy answers: sum 36 -> [44, 51, 2]; sum 21 -> [29, 2]; sum 165 -> [173..201 step 7, 2]
    expected = {
        "prompts": [[0, 0, 11, 12, 13], [0, 0, 0, 0, 21], [31, 32, 33, 34, 35]],
        "responses": [
            [44, 51, 2, 0, 0, 0, 0, 0],
            [29, 2, 0, 0, 0, 0, 0, 0],
            [173, 180, 187, 194, 201, 2, 0, 0],
        ],
        "attention_mask": [
            [0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0],
            [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0],
        ],
        "position_ids": [
            [0, 0, 0, 1, 2, 3, 4, 5, 5, 5, 5, 5, 5],
            [0, 0, 0, 0, 0, 1, 2, 2, 2, 2, 2, 2, 2],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 10, 10],
        ],
        "response_mask": [
            [1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0, 0, 0],
            [1, 1, 1, 1, 1, 1, 0, 0],
        ],
    }
    for key, value in expected.items():
        assert out.batch[key].dtype == torch.long, key
        assert out.batch[key].tolist() == value, key
    assert out.batch["input_ids"].tolist() == [
        p + r for p, r in zip(expected["prompts"], expected["responses"])
    ]
    log_probs = out.batch["rollout_log_probs"]
    assert log_probs.dtype == torch.float32 and log_probs.shape == (3, 8)
    for row, prompt in enumerate(PROMPTS):
        for col in range(8):
            token, real = expected["responses"][row][col], expected["response_mask"][row][col]
            want = scripted_log_prob(len(prompt) + col, token) if real else 0.0
            assert log_probs[row, col].item() == pytest.approx(want, abs=1e-7), (row, col)
    assert list(out.non_tensor_batch["uid"]) == ["a", "b", "c"]
    assert list(out.non_tensor_batch["data_source"]) == ["x", "y", "z"]
    assert list(out.non_tensor_batch["raw_prompt_ids"]) == PROMPTS
    assert out.non_tensor_batch["num_turns"].tolist() == [1, 1, 1]
    assert list(out.non_tensor_batch["finish_reason"]) == ["stop", "stop", "stop"]
    assert out.meta_info["global_steps"] == 3
    metrics = out.meta_info["rollout_metrics"]
    assert metrics["rollout/generated_tokens"] == 11.0
    assert metrics["rollout/finish_reason/stop"] == 1.0
    assert metrics["rollout/response_length/mean"] == pytest.approx(11 / 3)


@pytest.mark.parametrize("padding", ["left", "right"])
def test_prompt_tensors_give_the_same_output(padding):
    width = max(map(len, PROMPTS))
    ids = torch.zeros((3, width), dtype=torch.long)
    mask = torch.zeros((3, width), dtype=torch.long)
    for i, p in enumerate(PROMPTS):
        cols = slice(width - len(p), width) if padding == "left" else slice(0, len(p))
        ids[i, cols] = torch.tensor(p)
        mask[i, cols] = 1
    with local_manager(manager_config()) as manager:
        reference = manager.generate_sequences(layout_batch())
        out = manager.generate_sequences(
            DataProto.from_dict({"prompt_ids": ids, "attention_mask": mask})
        )
    for key in (
        "prompts",
        "responses",
        "input_ids",
        "attention_mask",
        "position_ids",
        "response_mask",
        "rollout_log_probs",
    ):
        assert torch.equal(out.batch[key], reference.batch[key]), key


def test_tool_and_single_turn_rows_in_one_batch(tokenizer):
    tok = tokenizer

    def enc(text):
        return tok.encode(text, add_special_tokens=False)

    def prompt(letter):
        return enc(f"<|im_start|>user\n{letter}<|im_end|>\n<|im_start|>assistant\n")

    def call(arguments):
        return "<tool_call>" + json.dumps({"name": "add", "arguments": arguments}) + "</tool_call>"

    turns = {
        "A": [[*enc(call({"a": 2, "b": 3})), IM_END], [*enc("five"), IM_END]],
        "B": [[*enc("hello"), IM_END]],
        "C": [[*enc("<tool_call>{oops</tool_call>"), IM_END], [*enc("sorry"), IM_END]],
    }
    policy = TurnScript(
        tuple((tuple(prompt(k)), tuple(tuple(t) for t in v)) for k, v in turns.items()),
        tuple(enc("<|im_start|>assistant\n")),
    )
    add = FunctionTool(
        lambda a, b: a + b,
        {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    )
    TOOLS.register("add_for_manager_test", lambda: add, overwrite=True)
    try:
        config = manager_config(
            policy, response_length=160, agent_loop="tool", tools={"add_for_manager_test": {}}
        )
        config.sampling = SamplingParams(max_tokens=64)  # stop ids: the tokenizer's EOS
        batch = DataProto.from_dict(
            non_tensors={
                "raw_prompt_ids": [prompt(k) for k in "ABC"],
                "agent_name": ["tool", "single_turn", "tool"],
            }
        )
        with local_manager(config, tok) as manager:
            out = manager.generate_sequences(batch)
    finally:
        TOOLS.unregister("add_for_manager_test")

    def observation(content):
        return enc("\n") + enc(f"<|im_start|>tool\n{content}<|im_end|>\n<|im_start|>assistant\n")

    malformed = "Error: malformed tool call: invalid JSON (Expecting property name enclosed in double quotes at char 1)"
    rows = {
        0: (turns["A"][0], observation("5"), turns["A"][1]),
        1: (turns["B"][0], [], []),
        2: (turns["C"][0], observation(malformed), turns["C"][1]),
    }
    for i, (first, obs, second) in rows.items():
        ids = first + obs + second
        mask = [1] * len(first) + [0] * len(obs) + [1] * len(second)
        n = len(ids)
        assert out.batch["responses"][i, :n].tolist() == ids, i
        assert out.batch["responses"][i, n:].eq(tok.pad_token_id).all()
        assert out.batch["response_mask"][i].tolist() == mask + [0] * (160 - n), i
        lp = out.batch["rollout_log_probs"][i]
        assert (lp[:n] != 0).tolist() == [bool(m) for m in mask], i
    nt = out.non_tensor_batch
    assert nt["num_turns"].tolist() == [2, 1, 2]
    assert nt["num_tool_calls"].tolist() == [1, 0, 1]
    assert nt["num_tool_errors"].tolist() == [0, 0, 1]
    assert list(nt["finish_reason"]) == ["stop", "stop", "stop"]
    metrics = out.meta_info["rollout_metrics"]
    assert metrics["rollout/tool_calls"] == 2.0 and metrics["rollout/tool_errors"] == 1.0
    assert metrics["rollout/tool_errors/malformed"] == 1.0
    assert metrics["rollout/num_turns/mean"] == pytest.approx(5 / 3)


def test_load_balancing_spreads_requests_by_in_flight_count():
    config = manager_config(num_replicas=2, delay_s=0.05)
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[i + 1, i + 2] for i in range(8)]})
    with local_manager(config) as manager:
        manager.generate_sequences(batch)
        per_engine = [len(e.request_log()) for e in engines(manager)]
        peak = [e.max_in_flight for e in engines(manager)]
        assert manager.replica_request_counts() == [4, 4]
    assert per_engine == [4, 4] and peak == [4, 4]


def test_conversations_stay_on_their_replica(tokenizer):
    tok = tokenizer
    marker = tok.encode("<|im_start|>assistant\n", add_special_tokens=False)
    call = tok.encode(
        '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 1}}</tool_call>',
        add_special_tokens=False,
    )
    policy = TurnScript.single([[*call, IM_END], [*call, IM_END], [5, 6, IM_END]], marker)
    add = FunctionTool(
        lambda a, b: a + b, {"name": "add", "description": "", "parameters": {"type": "object"}}
    )
    TOOLS.register("add_for_affinity_test", lambda: add, overwrite=True)
    try:
        config = manager_config(
            policy,
            response_length=128,
            num_replicas=2,
            delay_s=0.02,
            agent_loop="tool",
            tools={"add_for_affinity_test": {}},
        )
        prompts = [
            tok.encode(f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n")
            for i in range(6)
        ]
        with local_manager(config, tok) as manager:
            out = manager.generate_sequences(
                DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts})
            )
            logs = [e.request_log() for e in engines(manager)]
            counts = manager.replica_request_counts()
    finally:
        TOOLS.unregister("add_for_affinity_test")
    assert out.non_tensor_batch["num_turns"].tolist() == [3] * 6
    sessions = [defaultdict(int) for _ in logs]
    for replica, log in enumerate(logs):
        for request_id, _ in log:
            sessions[replica][request_id.rsplit("-", 1)[0]] += 1
    assert set(sessions[0]).isdisjoint(sessions[1])  # no conversation crossed replicas
    assert sorted(len(s) for s in sessions) == [3, 3]  # new conversations were spread evenly
    assert all(n == 3 for s in sessions for n in s.values())  # all 3 turns on one replica
    assert counts == [9, 9]


def test_request_timeout_names_the_replica_and_aborts():
    config = manager_config(delay_s=2.0, request_timeout_s=0.2)
    with local_manager(config) as manager:
        with pytest.raises(
            RolloutTimeoutError,
            match=r"rollout replica 0 \(node .*\): request '.*' did not finish within 0.2 s",
        ):
            manager.generate_sequences(layout_batch())
        assert engines(manager)[0]._aborted  # the timed-out request was aborted on the engine


def test_failing_engine_surfaces_a_clear_error():
    def broken(prompt):
        raise RuntimeError("engine exploded")

    with (
        local_manager(manager_config(broken)) as manager,
        pytest.raises(
            RolloutReplicaError,
            match=r"rollout replica 0 .* failed during request .*RuntimeError: engine exploded",
        ),
    ):
        manager.generate_sequences(layout_batch())


def test_bad_input_gives_clear_errors():
    with local_manager(manager_config(max_model_len=16)) as manager:
        with pytest.raises(TypeError, match="expects a DataProto, got dict"):
            manager.generate_sequences({"raw_prompt_ids": PROMPTS})
        empty = DataProto.from_dict(non_tensors={"raw_prompt_ids": np.empty((0,), dtype=object)})
        with pytest.raises(ValueError, match="empty batch"):
            manager.generate_sequences(empty)
        with pytest.raises(ValueError, match="row 1 has an empty prompt"):
            manager.generate_sequences(
                DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1, 2], []]})
            )
        with pytest.raises(
            ValueError,
            match="row 0 has a prompt of 20 tokens: expected fewer than the engine's max_model_len=16",
        ):
            manager.generate_sequences(
                DataProto.from_dict(non_tensors={"raw_prompt_ids": [list(range(20))]})
            )
        with pytest.raises(
            ValueError,
            match=r"needs the prompts as non-tensor 'raw_prompt_ids'.*non-tensors \['uid'\]",
        ):
            manager.generate_sequences(DataProto.from_dict(non_tensors={"uid": ["a"]}))
        with pytest.raises(UnknownPluginError, match="unknown agent loop 'nope'"):
            manager.generate_sequences(
                DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1]], "agent_name": ["nope"]})
            )
        batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1, 2]]}, meta_info={"n": 2})
        with pytest.raises(
            ValueError, match=r"sampling n=2 is invalid.*batch\.repeat\(n, interleave=True\)"
        ):
            manager.generate_sequences(batch)
        batch = DataProto.from_dict(
            non_tensors={"raw_prompt_ids": [[1, 2]]}, meta_info={"temperature": -1.0}
        )
        with pytest.raises(ValueError, match=r"SamplingParams.temperature: invalid value -1.0"):
            manager.generate_sequences(batch)
    with pytest.raises(UnknownPluginError, match="unknown tool 'no_such_tool'"):
        local_manager(manager_config(tools={"no_such_tool": {}}))
    with pytest.raises(UnknownPluginError, match="unknown rollout engine 'no_such_engine'"):
        config = manager_config()
        config.rollout.backend = "no_such_engine"
        RolloutManager(config)
    with pytest.raises(ValueError, match=r"RolloutManagerConfig.num_replicas: invalid value 0"):
        manager_config(num_replicas=0).validate()
    with pytest.raises(ValueError, match="the 'tool' agent loop needs a tokenizer"):
        local_manager(manager_config(agent_loop="tool"))


def test_default_stop_ids_are_every_eos_of_tokenizer_and_generation_config(tmp_path, tokenizer):
    import dataclasses
    import json

    from rl_rollout.manager import default_stop_token_ids

    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9]}))
    assert tokenizer.eos_token_id not in (7, 9)
    expected = tuple(dict.fromkeys([tokenizer.eos_token_id, 7, 2, 9]))  # in order, no repeats
    assert default_stop_token_ids(tokenizer, str(tmp_path)) == expected
    assert default_stop_token_ids(tokenizer, str(tmp_path / "none")) == (tokenizer.eos_token_id,)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert default_stop_token_ids(None, str(tmp_path)) == (5,)

    # the manager stops at all of them when the sampling config names none
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 9]}))
    config = manager_config()
    config = dataclasses.replace(
        config,
        rollout=dataclasses.replace(config.rollout, model_path=str(tmp_path)),
        sampling=SamplingParams(max_tokens=64),
    )
    manager = local_manager(config, tokenizer)
    try:
        params = manager.sampling_params({})
    finally:
        manager.shutdown()
    assert params.stop_token_ids == (tokenizer.eos_token_id, 7, 9)
    # an explicit list is kept as given
    manager = local_manager(manager_config(), tokenizer)
    try:
        assert manager.sampling_params({}).stop_token_ids == (IM_END,)
    finally:
        manager.shutdown()
