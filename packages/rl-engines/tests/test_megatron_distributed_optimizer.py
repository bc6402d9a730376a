"""`DistributedAdamW` (Megatron's distributed optimizer on gloo): gradients reduce-scattered
over data-parallel ranks, fp32 main parameters and moments sharded, updated parameters
all-gathered, clipping by the global norm over the shards.

- DP=2 equals DP=1 over 3 clipped steps at 1e-6 in fp32 (loss, grad norm, every weight),
  and so do DP=2 x TP=2 (vs TP=2) and an MoE at EP=2 x DP=4 (dense over 4 ranks, experts
  over 2; vs one rank); a gradient summed wrongly (not at all, or averaged: then the grad
  norm, as AdamW after clipping hardly sees the scale) or a range of updated parameters
  not gathered makes DP=2 differ.
- A checkpoint saved at DP=2 resumes at DP=1 and at DP=4 as the DP=2 run continues (1e-6);
  a range dropped on save or on load makes the resumed run differ; a load at another
  model-parallel layout is refused with the layouts named.
"""

from __future__ import annotations

import distopt_cases as cases
import megatron_models
import pytest

from rl_core.testing.spawn import SpawnRunner

pytestmark = [pytest.mark.megatron]

ATOL = 1e-6
STEPS = 3


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("distopt")
    return {t: megatron_models.save_model(str(root / t), t) for t in ("qwen2", "qwen3_moe")}


@pytest.fixture(scope="module")
def dp1(model_dirs):
    (run,) = SpawnRunner.shared(1).run(cases.train, model_dirs["qwen2"], {}, STEPS)
    return run


def test_dp2_equals_dp1_with_clipping(model_dirs, dp1):
    runs = SpawnRunner.shared(2).run(cases.train, model_dirs["qwen2"], {}, STEPS)
    assert all(r["sharded"] for r in runs) and dp1["sharded"]
    assert cases.clipped(dp1)  # the clip coefficient comes from the sharded norm
    for rank, run in enumerate(runs):
        cases.assert_same_run(run, dp1, f"DP=2 rank {rank} vs DP=1", ATOL)


@pytest.mark.parametrize("fault", ["unreduced", "mean", "no-gather"])
def test_dp2_with_a_seeded_fault_differs(model_dirs, dp1, fault):
    """The equivalence above fails when the gradient is not summed over the ranks, is
    averaged, or when the ranks' updated ranges are not all-gathered."""
    runs = SpawnRunner.shared(2).run(cases.train, model_dirs["qwen2"], {}, STEPS, fault)
    for run in runs:
        with pytest.raises(AssertionError):
            cases.assert_same_run(run, dp1, f"DP=2 with {fault}", ATOL)
        if fault == "mean":  # AdamW after clipping hardly sees the scale: the norm does
            norms = [m["grad_norm"] for m in run["metrics"]]
            assert norms[0] == pytest.approx(dp1["metrics"][0]["grad_norm"] / 2, rel=1e-5)
        else:
            assert cases.max_error(run, dp1) > 100 * ATOL


@pytest.mark.slow
@pytest.mark.parametrize(
    ("model_type", "options", "reference"),
    [
        ("qwen2", {"parallel": {"tensor_parallel_size": 2}}, 2),
        ("qwen3_moe", {"parallel": {"expert_parallel_size": 2}}, 1),
    ],
    ids=["tp2-dp2-vs-tp2", "ep2-dp4-vs-1"],
)
def test_four_ranks_equal_fewer(model_dirs, model_type, options, reference):
    """Sharding over DP with tensor parallelism (dense DP group of 2 per TP rank) and with
    experts (dense over 4 ranks, experts over the expert-data-parallel group of 2)."""
    model = model_dirs[model_type]
    want_options = options if reference > 1 else {}
    (want, *_) = SpawnRunner.shared(reference).run(cases.train, model, want_options, STEPS)
    runs = SpawnRunner.shared(4).run(cases.train, model, options, STEPS)
    assert cases.clipped(want)
    for rank, run in enumerate(runs):
        cases.assert_same_run(run, want, f"{model_type} {options} rank {rank}", ATOL)


@pytest.fixture(scope="module")
def saved(model_dirs, tmp_path_factory):
    """DP=2: step 1, save, steps 2 and 3."""
    path = str(tmp_path_factory.mktemp("ckpt") / "dp2")
    runs = SpawnRunner.shared(2).run(cases.train, model_dirs["qwen2"], {}, STEPS, save_to=path)
    continued = {"metrics": runs[0]["metrics"][1:], "weights": runs[0]["weights"][1:]}
    return path, continued


@pytest.mark.parametrize("world", [1, 4], ids=lambda n: f"dp{n}")
def test_checkpoint_saved_at_dp2_resumes_at(model_dirs, saved, world):
    path, continued = saved
    runs = SpawnRunner.shared(world).run(
        cases.train, model_dirs["qwen2"], {}, STEPS - 1, load_from=path, first_batch=1
    )
    for rank, run in enumerate(runs):
        what = f"DP=2 checkpoint resumed at DP={world}, rank {rank}"
        cases.assert_same_run(run, continued, what, ATOL)


def test_checkpoint_with_a_dropped_range_differs(model_dirs, saved, tmp_path):
    path, continued = saved
    model = model_dirs["qwen2"]
    # on load: the last of 4 ranks keeps the fresh state of its range
    runs = SpawnRunner.shared(4).run(
        cases.train, model, {}, STEPS - 1, "load-drops-range", load_from=path, first_batch=1
    )
    with pytest.raises(AssertionError):
        cases.assert_same_run(runs[0], continued, "load without the last range", ATOL)
    # on save: rank 1's range of the moments is not in the checkpoint
    broken = str(tmp_path / "broken")
    SpawnRunner.shared(2).run(cases.train, model, {}, 1, "save-drops-range", save_to=broken)
    (run,) = SpawnRunner.shared(1).run(
        cases.train, model, {}, STEPS - 1, load_from=broken, first_batch=1
    )
    with pytest.raises(AssertionError):
        cases.assert_same_run(run, continued, "checkpoint without rank 1's range", ATOL)


def test_load_at_another_model_parallel_layout_is_refused(model_dirs, saved):
    path, _ = saved
    options = {"parallel": {"tensor_parallel_size": 2}}
    errors = SpawnRunner.shared(2).run(cases.build_and_load, model_dirs["qwen2"], options, path)
    for text in errors:
        assert text is not None and "model-parallel layout" in text, text
        assert "'tp': 1" in text and "'tp': 2" in text, text
