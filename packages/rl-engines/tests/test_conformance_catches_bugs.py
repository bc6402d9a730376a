"""The conformance suite's distributed checks fail on engines with the classic
data-parallel bugs (`broken_engines`) and pass on the FSDP engine they were derived from.

The suite's own test method is called with its fixtures' values, so this exercises exactly
the code a third-party engine's tests run."""

from __future__ import annotations

import pytest

from rl_core.testing.spawn import RankError
from rl_core.testing.train_engine import TrainEngineConformance, save_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, str]:
    return {"lm": save_tiny_model(str(tmp_path_factory.mktemp("qwen2") / "lm"), "qwen2")}


def _suite(name: str) -> TrainEngineConformance:
    cls = type(
        f"Suite_{name}",
        (TrainEngineConformance,),
        {"engine_name": name, "engine_module": "broken_engines"},
    )
    return cls()


def test_fsdp_passes_the_distributed_checks(model_dirs, tmp_path):
    suite = _suite("fsdp")
    suite.test_distributed("gradient_sync", model_dirs, tmp_path)
    suite.test_distributed("reshard_2_to_1", model_dirs, tmp_path)


def test_gradients_never_all_reduced_fail(model_dirs, tmp_path):
    with pytest.raises(RankError, match="single-process reference on the concatenated batch"):
        _suite("fsdp-no-grad-sync").test_distributed("gradient_sync", model_dirs, tmp_path)


def test_checkpoint_that_does_not_reshard_fails(model_dirs, tmp_path):
    with pytest.raises(AssertionError, match="saved at world size 2, loaded at 1"):
        _suite("fsdp-non-resharding-checkpoint").test_distributed(
            "reshard_2_to_1", model_dirs, tmp_path
        )


def test_stale_export_fails(model_dirs, tmp_path):
    with pytest.raises(RankError, match="export is not the trained weights"):
        _suite("fsdp-stale-export").test_distributed("gradient_sync", model_dirs, tmp_path)
