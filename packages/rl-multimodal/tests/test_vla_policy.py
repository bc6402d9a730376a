"""VLA policy heads, the pipelined episode loop and one GRPO/PPO update per head (tiny VLM)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rl_multimodal.vla import VLAPolicy, VLAPolicyConfig, VLATrainer, VLATrainerConfig, run_episodes
from rl_multimodal.vla.envs import EnvWorkerPool, ReachConfig, ReachEnv
from rl_multimodal.vlm.tiny import resolve_tiny_vlm


@pytest.fixture(scope="module")
def model_path():
    torch.set_num_threads(1)
    return resolve_tiny_vlm("qwen2_5_vl")


def _policy(path: str, head: str) -> VLAPolicy:
    torch.manual_seed(0)
    return VLAPolicy.from_pretrained(path, ReachEnv(1).action_spec, VLAPolicyConfig(head=head))


def test_token_head_log_probs_match_a_full_vocab_forward(model_path):
    policy = _policy(model_path, "tokens")
    env = ReachEnv(3)
    inputs = policy.process(env.reset([0, 1, 2]))
    out = policy.act(inputs)
    ids = out.actions
    assert set(ids.flatten().tolist()) <= set(policy.action_tokenizer.token_ids.tolist())
    # reference: the model's own logits over the whole vocabulary, restricted to the bins
    full = torch.cat([inputs.input_ids, ids], 1)
    with torch.no_grad():
        logits = policy.model(
            input_ids=full,
            attention_mask=torch.cat([inputs.attention_mask, torch.ones_like(ids)], 1),
            pixel_values=torch.cat(inputs.pixel_values),
            image_grid_thw=inputs.image_grid_thw,
        ).logits.double()
    L = inputs.input_ids.shape[1]
    bins = torch.as_tensor(policy.action_tokenizer.token_ids)
    ref = torch.log_softmax(logits[:, L - 1 : L + 1][..., bins], -1)
    k = torch.as_tensor(policy.action_tokenizer.token_to_bin(ids))
    want = ref.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(out.log_probs.double(), want, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(out.env_actions, policy.action_tokenizer.decode(ids))


def test_gaussian_head_log_prob_is_the_normal_density(model_path):
    policy = _policy(model_path, "gaussian")
    env = ReachEnv(4)
    inputs = policy.process(env.reset([0, 1, 2, 3]))
    out = policy.act(inputs)
    log_probs, _, _ = policy.evaluate(inputs, out.actions)
    torch.testing.assert_close(log_probs.detach(), out.log_probs)
    with torch.no_grad():
        L = inputs.input_ids.shape[1]
        state = policy._hidden(inputs, None)[:, L - 1]
        mean = policy.mean_head(state).double()
    std = policy.log_std.detach().exp().double()
    x = out.actions.double()
    ref = (-0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    torch.testing.assert_close(out.log_probs[:, 0].double(), ref, atol=1e-5, rtol=1e-5)
    assert (out.env_actions >= -1).all() and (out.env_actions <= 1).all()


def test_pipelined_pool_episodes_equal_in_process_episodes(model_path):
    policy = _policy(model_path, "tokens")
    seeds = [3, 4, 5, 6]
    ref = run_episodes(policy, ReachEnv(4), seeds, max_steps=4, greedy=True, keep_frames=True)
    factory = functools.partial(ReachEnv, config=ReachConfig())
    with EnvWorkerPool(factory, 4, num_workers=2) as pool:
        got = run_episodes(policy, pool, seeds, max_steps=4, greedy=True, keep_frames=True)
    np.testing.assert_allclose(got.rewards, ref.rewards, atol=1e-6)
    np.testing.assert_array_equal(got.mask, ref.mask)
    np.testing.assert_array_equal(got.success, ref.success)
    assert len(got.frames) == len(ref.frames)
    for a, b in zip(got.frames, ref.frames, strict=True):
        np.testing.assert_array_equal(a, b)
    # masks: 1 from the first step until the episode ends, then 0
    for b in range(4):
        n = int(got.mask[b].sum())
        assert got.mask[b, :n].all() and not got.mask[b, n:].any()


@pytest.mark.parametrize(("algorithm", "head"), [("grpo", "tokens"), ("ppo", "gaussian")])
def test_one_training_step_runs_and_logs(model_path, tmp_path, algorithm, head):
    policy = _policy(model_path, head)
    cfg = VLATrainerConfig(
        algorithm=algorithm,
        total_steps=1,
        groups=2,
        n=2,
        max_steps=3,
        epochs=1,
        mini_batch_size=8,
        val_seeds=[100, 101],
        val_every=1,
        output_dir=str(tmp_path),
    )
    before = [p.detach().clone() for p in policy.parameters()]
    dense = ReachConfig(progress_reward=1.0)  # the sparse default can give all-zero advantages
    history = VLATrainer(policy, ReachEnv(4, dense), ReachEnv(2, dense), cfg).fit()
    assert history[0]["step"] == 0 and "val/success_rate" in history[0]
    last = history[-1]
    assert np.isfinite(last["actor/pg_loss"]) and last["train/mean_length"] >= 1
    assert ("critic/vf_loss" in last) == (algorithm == "ppo")
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters(), strict=True))
    assert (tmp_path / "frames" / "val_step0000.png").is_file()
    assert (tmp_path / "frames" / "val_step0001.gif").is_file()
    assert (tmp_path / "metrics.jsonl").is_file()


def test_image_adapter_starts_neutral_and_a_frozen_tower_stays_fixed(model_path, tmp_path):
    plain = _policy(model_path, "tokens")
    torch.manual_seed(0)
    spec = ReachEnv(1).action_spec
    policy = VLAPolicy.from_pretrained(
        model_path, spec, VLAPolicyConfig(image_grid=3, freeze_vision=True)
    )
    env = ReachEnv(4, ReachConfig(image_size=84, n_directions=4))
    inputs = policy.process(env.reset([0, 1, 2, 3]))
    actions = plain.act(inputs).actions
    # zero-initialised adapter: the same log-probs as the policy without it
    want, _, _ = plain.evaluate(inputs, actions)
    got, _, _ = policy.evaluate(inputs, actions)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    # the adapter's input keeps where things are: the pooled cell holding the red target
    # differs between a target left and a target right of the agent (84 px: 3x3 tokens)
    feats = policy.model.model.get_image_features(
        torch.cat(inputs.pixel_values), inputs.image_grid_thw
    ).pooler_output
    cell = {0.2: 3, 0.8: 5}  # target x -> raster index of its token (row 1)
    left = [i for i in range(4) if np.isclose(env.target[i, 0], 0.2)]
    other = [i for i in range(4) if not np.isclose(env.target[i, 0], 0.2)]
    if left and other:
        assert not torch.allclose(feats[left[0]][cell[0.2]], feats[other[0]][cell[0.2]])
    tower = {n: p.detach().clone() for n, p in policy.model.model.visual.named_parameters()}
    cfg = VLATrainerConfig(
        total_steps=1,
        groups=2,
        n=2,
        max_steps=2,
        epochs=1,
        mini_batch_size=8,
        val_seeds=[100, 101],
        val_every=1,
        output_dir=str(tmp_path),
        lr=1e-2,
    )
    cfg_env = ReachConfig(image_size=84, n_directions=4, progress_reward=1.0)  # dense: adv != 0
    trainer = VLATrainer(policy, ReachEnv(4, cfg_env), ReachEnv(2, cfg_env), cfg)
    trainer.fit()
    for name, p in policy.model.model.visual.named_parameters():
        assert torch.equal(p, tower[name]), name
    assert policy.image_adapter.weight.abs().sum() > 0
    trained = {id(p) for p in trainer.optim.param_groups[0]["params"]}
    assert not any(id(p) in trained for p in policy.model.model.visual.parameters())
    with pytest.raises(ValueError, match="image_grid"):
        VLAPolicyConfig(image_grid=-1)


def test_more_bins_than_usable_tokens_is_refused_naming_n_bins(model_path):
    spec = ReachEnv(1).action_spec
    with pytest.raises(ValueError, match=r"policy.n_bins is 256, expected <= 96"):
        VLAPolicy.from_pretrained(model_path, spec, VLAPolicyConfig(n_bins=256))
