"""The shared-prompt layout gives the padded layout's log-probs, entropy, values and
gradients while running each distinct prompt once."""

from __future__ import annotations

import fsdp_cases
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from rl_core.testing.spawn import SpawnRunner
from rl_core.testing.train_engine import make_rl_batch, save_tiny_model
from rl_engines.fsdp.forward import ChunkedLMHead, forward_micro_batch
from rl_engines.fsdp.shared_prompts import SharedPromptLayout, group_rows_by_prompt

PROMPT_LEN, RESP_LEN = 10, 8


def grouped_batch(seed: int = 3) -> dict[str, torch.Tensor]:
    """A batch whose prompts repeat (fsdp_cases.PROMPT_GROUPS), as a dict of tensors."""
    return dict(fsdp_cases.grouped_batch(seed, PROMPT_LEN, RESP_LEN).batch.items())


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("llama")), "llama")


def _model(path, attention, value=False):
    cls = AutoModelForTokenClassification if value else AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=torch.float32, attn_implementation=attention)
    return model.train()


def test_layout_packs_each_prompt_once_and_masks_other_rows():
    t = grouped_batch()
    layout = SharedPromptLayout.build(t, "sdpa", torch.bool)
    mask = t["attention_mask"].bool()
    prompt_tokens = sum(int(mask[r, :PROMPT_LEN].sum()) for r in (0, 1, 2, 4))
    response_tokens = int(mask[:, PROMPT_LEN:].sum())
    assert layout.input_ids.shape == (1, prompt_tokens + response_tokens)
    allowed = layout.attention_mask[0, 0]
    # every token sees itself; each response token sees exactly its prompt + its own prefix
    assert allowed.diagonal().all()
    seen_per_query = allowed.sum(dim=1)
    first_resp = prompt_tokens
    length_row0_prompt = int(mask[0, :PROMPT_LEN].sum())
    assert int(seen_per_query[first_resp]) == length_row0_prompt + 1
    # one predicting position per valid response token, the shared prompt end 4 times
    assert layout.keep.numel() == response_tokens
    assert int((layout.keep == length_row0_prompt - 1).sum()) == 4


def test_no_repeated_prompt_gives_no_layout_and_flash_is_refused():
    t = dict(make_rl_batch(8, PROMPT_LEN, RESP_LEN, seed=1).batch.items())
    assert SharedPromptLayout.build(t, "sdpa", torch.bool) is None
    with pytest.raises(ValueError, match=r"dense mask .*got 'flash_attention_2'"):
        SharedPromptLayout.build(t, "flash_attention_2", torch.bool)


def test_group_rows_by_prompt_is_a_stable_grouping():
    order = group_rows_by_prompt(grouped_batch()).tolist()
    assert order == [0, 3, 5, 6, 1, 7, 2, 4]


def _run(model, t, shared, head=None, outputs=("log_probs", "entropy"), value=False):
    model.zero_grad()
    out = forward_micro_batch(
        model,
        t,
        outputs,
        0.7,
        packed=False,
        value_model=value,
        head=head,
        shared_prompts=shared,
    )
    weights = torch.linspace(-1, 1, out[outputs[0]].numel()).view_as(out[outputs[0]])
    (sum(out[k] * weights for k in outputs)).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return {k: v.detach() for k, v in out.items()}, grads


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("chunked", [False, True])
def test_log_probs_entropy_and_gradients_equal_the_padded_layout(llama_dir, attention, chunked):
    t = grouped_batch()
    model = _model(llama_dir, attention)
    head = ChunkedLMHead.install(model, chunk_tokens=16) if chunked else None
    want, want_grads = _run(model, t, None, head)
    got, got_grads = _run(model, t, attention, head)
    valid = t["attention_mask"][:, PROMPT_LEN:].bool()
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=2e-5, rtol=1e-5)
        assert (got[key][~valid] == 0).all()
    assert want["log_probs"][valid].abs().min() > 0  # the comparison is not of zeros
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 5
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=2e-5, rtol=1e-4, msg=name)


def test_values_equal_the_padded_layout(tmp_path):
    path = save_tiny_model(str(tmp_path), "llama", value_head=True)
    t = grouped_batch()
    model = _model(path, "sdpa", value=True)
    want, want_grads = _run(model, t, None, outputs=("values",), value=True)
    got, got_grads = _run(model, t, "sdpa", outputs=("values",), value=True)
    torch.testing.assert_close(got["values"], want["values"], atol=2e-5, rtol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=2e-5, rtol=1e-4, msg=name)


@pytest.mark.slow
def test_engine_trains_and_infers_the_same_with_shared_prompts(llama_dir):
    """FSDP2 at world size 2, micro-batches of 2: losses, grad norms, updated weights and
    inferred log-probs (in the caller's row order) match the unshared engine."""
    runner = SpawnRunner.shared(2)
    plain = runner.run(fsdp_cases.shared_prompt_round, llama_dir, False)
    shared = runner.run(fsdp_cases.shared_prompt_round, llama_dir, True)
    assert [r["shared"] for r in plain] == [None, None]
    assert [r["shared"] for r in shared] == ["sdpa", "sdpa"]
    for got, want in zip(shared, plain, strict=True):
        for g, w in zip(got["metrics"], want["metrics"], strict=True):
            assert g["loss"] == pytest.approx(w["loss"], rel=1e-5, abs=1e-7)
            assert g["grad_norm"] == pytest.approx(w["grad_norm"], rel=1e-5)
        torch.testing.assert_close(got["log_probs"], want["log_probs"], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(got["entropy"], want["entropy"], atol=2e-5, rtol=1e-5)
    assert shared[0]["log_probs"].abs().sum() > 0
    for name, weight in plain[0]["weights"].items():
        torch.testing.assert_close(shared[0]["weights"][name], weight, atol=1e-6, rtol=1e-5)


def _engine(model_dir, engine_kwargs):
    from rl_core.engine import build_engine
    from rl_core.testing.train_engine import engine_config

    options = {"engine_kwargs": engine_kwargs}
    return build_engine("fsdp", engine_config(model_dir, options, optim=fsdp_cases.OPTIM))


def test_share_prompts_needs_a_dense_mask_kernel(llama_dir):
    with pytest.raises(
        ValueError,
        match=r"share_prompts=True needs an attention kernel .*"
        r"got attn_implementation 'flash_attention_2'",
    ):
        _engine(llama_dir, {"share_prompts": True, "attn_implementation": "flash_attention_2"})
    engine = _engine(llama_dir, {"share_prompts": True, "attn_implementation": "eager"})
    try:
        assert engine.shared_prompts == "eager"
    finally:
        engine.close()


def test_moe_models_do_not_share_prompts(tmp_path):
    import megatron_models

    moe_dir = megatron_models.save_tiny_moe(str(tmp_path / "moe"))
    engine = _engine(moe_dir, {})  # auto: off, routing statistics count every token
    try:
        assert engine.router_probe is not None and engine.shared_prompts is None
    finally:
        engine.close()
    with pytest.raises(ValueError, match=r"share_prompts=True cannot run on a MoE model"):
        _engine(moe_dir, {"share_prompts": True})


def common_prefix_batch(groups: list[int], seed: int = 5) -> dict[str, torch.Tensor]:
    """Prompts of 18-22 real tokens whose first 17 are the same (a system prompt, fixed
    demos), left-padded to 24; row i asks prompt groups[i]."""
    prompt_len = 24
    t = dict(make_rl_batch(len(groups), prompt_len, RESP_LEN, seed=seed).batch.items())
    g = torch.Generator().manual_seed(seed)
    common = torch.randint(1, 500, (17,), generator=g)
    tails = {u: torch.randint(1, 500, (1 + u % 5,), generator=g) for u in set(groups)}
    for row, u in enumerate(groups):
        prompt = torch.cat([common, tails[u]])
        t["input_ids"][row, :prompt_len] = 0
        t["attention_mask"][row, :prompt_len] = 0
        t["input_ids"][row, prompt_len - len(prompt) : prompt_len] = prompt
        t["attention_mask"][row, prompt_len - len(prompt) : prompt_len] = 1
    t["position_ids"] = (t["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    return t


@pytest.mark.parametrize("groups", [[0, 1, 2, 0, 4, 0, 0, 1], list(range(8))])
def test_a_prefix_common_to_all_prompts_is_packed_once(llama_dir, groups):
    """Distinct prompts that begin alike: the common prefix runs once, each prompt's rest
    once; outputs and gradients still equal the padded layout's (with or without repeats)."""
    t = common_prefix_batch(groups)
    layout = SharedPromptLayout.build(t, "sdpa", torch.bool)
    distinct = sorted(set(groups))
    rest = sum(1 + u % 5 for u in distinct)
    responses = int(t["attention_mask"][:, -RESP_LEN:].sum())
    assert layout.input_ids.shape == (1, 17 + rest + responses)
    model = _model(llama_dir, "sdpa")
    want, want_grads = _run(model, t, None)
    got, got_grads = _run(model, t, "sdpa")
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=2e-5, rtol=1e-5)
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, atol=2e-5, rtol=1e-4, msg=name)
