"""The rollout-engine contract: parameter validation, outputs, prompt checks, building."""

import pytest

from rl_core.config import ConfigError
from rl_core.registry import UnknownPluginError
from rl_core.rollout import (
    ROLLOUTS,
    GenerationOutput,
    RolloutConfig,
    RolloutEngine,
    SamplingParams,
    build_rollout_engine,
    check_prompt,
)


def test_defaults_are_valid_and_stop_ids_become_a_tuple():
    params = SamplingParams(stop_token_ids=[2, 7]).validate()
    assert params.stop_token_ids == (2, 7)
    assert (params.n, params.temperature, params.top_p, params.top_k) == (1, 1.0, 1.0, -1)
    assert (params.max_tokens, params.seed) == (256, None)


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("n", 0, "an integer >= 1"),
        ("n", True, "an integer"),
        ("n", 2.0, "an integer"),
        ("temperature", -0.1, "a finite number >= 0 (0 means greedy)"),
        ("temperature", float("nan"), "a finite number"),
        ("top_p", 0.0, "a number in (0, 1]"),
        ("top_p", 1.5, "a number in (0, 1]"),
        ("top_k", 0, "-1 (disabled) or an integer >= 1"),
        ("top_k", -2, "-1 (disabled) or an integer >= 1"),
        ("max_tokens", 0, "an integer >= 1"),
        ("stop_token_ids", [1, -3], "a sequence of token ids (integers >= 0)"),
        ("stop_token_ids", "2", "a list of an integer"),
        ("stop_token_ids", 2, "a list of an integer"),
        ("seed", -1, f"null or an integer in [0, {2**63 - 1}]"),
        ("seed", 2**64, f"null or an integer in [0, {2**63 - 1}]"),
    ],
)
def test_out_of_range_values_name_field_value_and_range(field, value, expected):
    with pytest.raises(ConfigError) as err:
        SamplingParams(**{field: value}).validate()
    assert err.value.path == f"SamplingParams.{field}"
    assert err.value.expected == expected
    given = tuple(value) if isinstance(value, list) else value
    assert err.value.value == given or value != value  # NaN
    assert isinstance(err.value, ValueError)  # what engines and older callers catch


def test_edge_values_are_accepted():
    SamplingParams(n=16, temperature=0, top_p=1, top_k=1, max_tokens=1, seed=0).validate()
    SamplingParams(temperature=2.5, top_p=1e-6, seed=2**63 - 1).validate()


def test_generation_output_checks_lengths_and_reason():
    out = GenerationOutput([1, 2], [-0.5, -1.0], "length")
    assert out.token_ids == [1, 2]
    with pytest.raises(ValueError, match="2 token_ids but 1 log_probs"):
        GenerationOutput([1, 2], [-0.5], "stop")
    with pytest.raises(ValueError, match="finish_reason='eos'"):
        GenerationOutput([1], [-0.5], "eos")  # type: ignore[arg-type]


def test_check_prompt():
    assert check_prompt((3, 4), max_model_len=8, vocab_size=10) == [3, 4]
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        check_prompt([], max_model_len=8, vocab_size=10)
    with pytest.raises(ValueError, match="has 8 tokens: expected fewer than max_model_len=8"):
        check_prompt([1] * 8, max_model_len=8, vocab_size=10)
    with pytest.raises(ValueError, match=r"token id 10: expected ids in \[0, 10\)"):
        check_prompt([1, 10], max_model_len=8, vocab_size=10)
    with pytest.raises(ValueError, match="token id -1"):
        check_prompt([-1], max_model_len=8, vocab_size=10)
    with pytest.raises(ValueError, match="token-in/token-out"):
        check_prompt("hello", max_model_len=8, vocab_size=10)  # type: ignore[arg-type]


def test_rollout_config_validation():
    RolloutConfig(model_path="/m").validate()
    for field, value in [
        ("model_path", ""),
        ("dtype", "fp32"),
        ("tensor_parallel_size", 0),
        ("max_model_len", 1),
        ("max_num_seqs", 0),
        ("engine_kwargs", None),
    ]:
        with pytest.raises(ValueError, match=rf"^RolloutConfig\.{field}: invalid value "):
            RolloutConfig(**{"model_path": "/m", field: value}).validate()


class _EchoEngine(RolloutEngine):
    """Minimal engine: repeats the prompt's last token."""

    def __init__(self, config: RolloutConfig) -> None:
        self.config = config

    @property
    def max_model_len(self) -> int:
        return self.config.max_model_len or 16

    async def generate(self, prompt_ids, sampling_params, request_id, multi_modal_data=None):
        params = sampling_params.validate()
        ids = check_prompt(prompt_ids, self.max_model_len, vocab_size=100)
        return [GenerationOutput([ids[-1]], [0.0], "length") for _ in range(params.n)]

    async def abort(self, request_ids):
        pass

    async def update_weights(self, weights):
        pass

    async def sleep(self, level=1):
        pass

    async def wake_up(self):
        pass

    async def reset_prefix_cache(self):
        pass

    async def shutdown(self):
        pass


def test_build_by_name_and_clear_errors():
    ROLLOUTS.register("echo-test", _EchoEngine)
    ROLLOUTS.register("not-an-engine-test", lambda config: object())
    try:
        engine = build_rollout_engine(RolloutConfig(model_path="/m", backend="echo-test"))
        assert isinstance(engine, _EchoEngine)
        with pytest.raises(UnknownPluginError, match="unknown rollout engine 'echo-tst'"):
            build_rollout_engine(RolloutConfig(model_path="/m", backend="echo-tst"))
        with pytest.raises(TypeError, match=r"not a rl_core\.rollout\.RolloutEngine"):
            build_rollout_engine(RolloutConfig(model_path="/m", backend="not-an-engine-test"))
        with pytest.raises(TypeError, match="expects a RolloutConfig"):
            build_rollout_engine({"model_path": "/m"})  # type: ignore[arg-type]
        with pytest.raises(
            ValueError, match=r"RolloutConfig\.tensor_parallel_size: invalid value 0"
        ):
            build_rollout_engine(
                RolloutConfig(model_path="/m", backend="echo-test", tensor_parallel_size=0)
            )
    finally:
        ROLLOUTS.unregister("echo-test")
        ROLLOUTS.unregister("not-an-engine-test")


def test_abstract_methods_must_be_implemented():
    class Incomplete(RolloutEngine):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


def test_check_stop_token_ids():
    from rl_core.rollout import check_stop_token_ids

    check_stop_token_ids((0, 9), vocab_size=10)
    with pytest.raises(ValueError, match=r"stop_token_ids contains 10: expected ids in \[0, 10\)"):
        check_stop_token_ids((2, 10), vocab_size=10)
