"""VLA policy heads, the pipelined episode loop and one GRPO/PPO update per head (tiny VLM)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.trainer.vla_episodes import play_episodes
from rl_multimodal.vla import VLAPolicy, VLAPolicyConfig
from rl_multimodal.vla.envs import ReachConfig, ReachEnv
from rl_multimodal.vla.rollout import act_on
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
    # reference: the model's own logits over the whole vocabulary, restricted to the bins,
    # with its own multimodal rotary positions (derived from the image tokens' types)
    full = torch.cat([inputs.input_ids, ids], 1)
    with torch.no_grad():
        logits = policy.model(
            input_ids=full,
            attention_mask=torch.cat([inputs.attention_mask, torch.ones_like(ids)], 1),
            pixel_values=torch.cat(inputs.pixel_values),
            image_grid_thw=inputs.image_grid_thw,
            mm_token_type_ids=(full == policy.model.config.image_token_id).int(),
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
        state = policy._hidden(inputs, None, policy._image_features(inputs))[:, L - 1]
        mean = policy.mean_head(state).double()
    std = policy.log_std.detach().exp().double()
    x = out.actions.double()
    ref = (-0.5 * ((x - mean) / std) ** 2 - torch.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)
    torch.testing.assert_close(out.log_probs[:, 0].double(), ref, atol=1e-5, rtol=1e-5)
    assert (out.env_actions >= -1).all() and (out.env_actions <= 1).all()


class InProcessRollout:
    """The ``vla`` generator's actions from a policy in this process (no worker group)."""

    def __init__(self, policy: VLAPolicy) -> None:
        self.policy = policy

    def generate_sequences(self, batch):
        return act_on(self.policy, batch)


def _reference_episodes(policy: VLAPolicy, seeds: list[int], max_steps: int):
    """Greedy episodes stepped by hand: one ReachEnv, one policy, no halves."""
    env = ReachEnv(len(seeds))
    obs, done = env.reset(seeds), np.zeros(len(seeds), bool)
    rewards, mask, frames = np.zeros((4, max_steps)), np.zeros((4, max_steps)), [obs.images]
    for t in range(max_steps):
        out = policy.act(policy.process(obs), greedy=True)
        mask[~done, t] = 1
        res = env.step(out.env_actions)
        rewards[~done, t] = res.reward[~done]
        done |= res.done
        obs = res.observation
        frames.append(obs.images)
        if done.all():
            break
    return rewards, mask, frames


@pytest.mark.parametrize("num_workers", [1, 2])
def test_pipelined_halves_play_the_episodes_of_a_plain_loop(model_path, num_workers):
    """Env workers in one or two halves (the local backend: the same code as on Ray)."""
    from rl_algos.config import EnvConfig
    from rl_multimodal.vla.env_group import start_env_group

    policy = _policy(model_path, "tokens")
    seeds = [3, 4, 5, 6]
    rewards, mask, frames = _reference_episodes(policy, seeds, 4)
    group = start_env_group(EnvConfig(name="reach", num_workers=num_workers), 1, "local", 30.0)
    try:
        assert len(group.halves) == num_workers
        got = play_episodes(group, InProcessRollout(policy), "val", np.array(seeds), 4, True)
        got_frames = got.stacked_frames(group.rows(4))
    finally:
        group.close()
    np.testing.assert_allclose(got.rewards, rewards, atol=1e-6)
    np.testing.assert_array_equal(got.mask, mask)
    assert len(got_frames) == len(frames) and not any(got.errors)
    for a, b in zip(got_frames, frames, strict=True):
        np.testing.assert_array_equal(a, b)
    for b in range(4):  # masks: 1 from the first step until the episode ends, then 0
        n = int(got.mask[b].sum())
        assert got.mask[b, :n].all() and not got.mask[b, n:].any()


def test_image_adapter_starts_neutral_and_keeps_where_things_are(model_path):
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
    with pytest.raises(ValueError, match="image_grid"):
        VLAPolicyConfig(image_grid=-1)


def test_more_bins_than_usable_tokens_is_refused_naming_n_bins(model_path):
    spec = ReachEnv(1).action_spec
    with pytest.raises(ValueError, match=r"vla.n_bins is 256, expected <= 96"):
        VLAPolicy.from_pretrained(model_path, spec, VLAPolicyConfig(n_bins=256))


def test_image_adapter_reads_the_grid_centred_so_shared_content_gives_no_term(model_path):
    """The adapter reads each channel of the pooled grid minus its mean over the grid. A
    frame whose image tokens are all the same vector (content every cell shares) gives the
    adapter's bias alone; real frames with the target in other places give other terms.
    Uncentred, 97.6% of the adapter's input was the same for every reach frame, and the
    one-step learning test collapsed onto a constant move on seeds 2-3."""
    torch.manual_seed(0)
    policy = VLAPolicy.from_pretrained(
        model_path, ReachEnv(1).action_spec, VLAPolicyConfig(image_grid=3, freeze_vision=True)
    )
    with torch.no_grad():
        torch.nn.init.normal_(policy.image_adapter.weight, std=0.1)
        torch.nn.init.normal_(policy.image_adapter.bias, std=0.1)
    env = ReachEnv(4, ReachConfig(image_size=84, n_directions=4))
    inputs = policy.process(env.reset([0, 1, 2, 3]))
    tower, real = policy.model.model, policy.model.model.get_image_features

    def uniform_tokens(*args, **kwargs):
        out = real(*args, **kwargs)
        out.pooler_output = tuple(f.mean(0, keepdim=True).expand_as(f) for f in out.pooler_output)
        return out

    tower.get_image_features = uniform_tokens
    try:
        flat = policy._image_bias(inputs, policy._image_features(inputs))
    finally:
        tower.get_image_features = real
    bias = policy.image_adapter.bias.view(1, *flat.shape[1:]).expand_as(flat)
    torch.testing.assert_close(flat, bias, atol=1e-6, rtol=0)
    terms = policy._image_bias(inputs, policy._image_features(inputs))
    assert (terms - bias).abs().amax(dim=(1, 2)).min() > 1e-3  # every real frame has a term
    assert (terms[0] - terms[1]).abs().max() > 1e-3  # targets elsewhere, other terms


def test_one_tower_pass_gives_what_the_pixels_give(model_path):
    """The tower's output handed to the language model (one pass per act) and the pixels
    (an older transformers: the model runs the tower itself) give the same log-probs."""
    torch.manual_seed(0)
    config = VLAPolicyConfig(head="tokens", image_grid=3)
    policy = VLAPolicy.from_pretrained(model_path, ReachEnv(1).action_spec, config)
    torch.nn.init.normal_(policy.image_adapter.weight, std=0.1)
    inputs = policy.process(ReachEnv(4).reset([0, 1, 2, 3]))
    out = policy.act(inputs)
    shared = policy.evaluate(inputs, out.actions)
    assert policy._takes_encoder_outputs  # the locked transformers takes the tower's output
    policy._takes_encoder_outputs = False
    for a, b in zip(shared, policy.evaluate(inputs, out.actions), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(out.log_probs, shared[0], rtol=0, atol=1e-6)
