"""The sequence-generator contract: registry lookup, factory arguments, type check."""

import pytest

from rl_core.protocol import DataProto
from rl_core.registry import UnknownPluginError
from rl_core.rollout import SEQUENCE_GENERATORS, SequenceGenerator, build_sequence_generator


class EchoGenerator(SequenceGenerator):
    def __init__(self, config, tokenizer=None, engine=None):
        self.config, self.tokenizer, self.engine = config, tokenizer, engine
        self.weights = []

    def generate_sequences(self, batch):
        return batch

    def update_weights(self, weights):
        self.weights.extend(weights)

    def sleep(self, level=1):
        pass

    def wake_up(self):
        pass

    def shutdown(self):
        pass


@pytest.fixture
def registered():
    SEQUENCE_GENERATORS.register("echo-test", EchoGenerator)
    SEQUENCE_GENERATORS.register("not-a-generator", lambda config, **kw: object())
    yield
    SEQUENCE_GENERATORS.unregister("echo-test")
    SEQUENCE_GENERATORS.unregister("not-a-generator")


def test_build_passes_config_tokenizer_and_engine(registered):
    engine = object()
    gen = build_sequence_generator("echo-test", {"a": 1}, tokenizer="tok", engine=engine)
    assert isinstance(gen, EchoGenerator)
    assert gen.config == {"a": 1} and gen.tokenizer == "tok" and gen.engine is engine
    batch = DataProto.from_dict(non_tensors={"raw_prompt_ids": [[1, 2], [3]]})
    assert gen.generate_sequences(batch) is batch


def test_unknown_generator_and_wrong_type_are_clear_errors(registered):
    with pytest.raises(UnknownPluginError, match="unknown sequence generator 'echo-tst'"):
        build_sequence_generator("echo-tst", {})
    with pytest.raises(TypeError, match=r"not a rl_core\.rollout\.SequenceGenerator"):
        build_sequence_generator("not-a-generator", {})
