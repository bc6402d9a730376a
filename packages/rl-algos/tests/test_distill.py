"""On-policy distillation's loss against hand computations and the exact reverse KL.

The independent reference: for one categorical distribution (a single position), the
expectation over the student's samples of either mode's gradient must equal the autograd
gradient of the exact KL(student || teacher) summed over the vocabulary.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from rl_algos.aggregation import LossScale
from rl_algos.config import load_config
from rl_algos.config.distill_section import DistillConfig
from rl_algos.distill import full_vocab_reverse_kl, make_distill_loss_fn
from rl_algos.errors import ConfigError
from rl_algos.kl import kl_penalty
from rl_algos.losses import POLICY_LOSSES, PolicyLossConfig, make_actor_loss_fn


@pytest.fixture(autouse=True)
def _float64():
    """float64 for this module's tests only: the default dtype is process-wide."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def _micro_batch(from_update: bool = False, **tensors):
    batch = TensorDict(tensors, batch_size=[next(iter(tensors.values())).shape[0]])
    return SimpleNamespace(batch=batch, meta_info={"old_log_probs_from_update": from_update})


def _ctx(mask):
    return SimpleNamespace(global_num_tokens=int(mask.sum()), global_num_seqs=mask.shape[0])


def _loss(mode, log_prob, teacher, advantages, mask, old=None, coef=0.5, kl_type="k2"):
    loss_cfg = PolicyLossConfig(agg_norm_constant=4.0)
    fn = make_distill_loss_fn(
        make_actor_loss_fn(loss_cfg), DistillConfig(teacher_path="t", coef=coef, mode=mode,
                                                    kl_type=kl_type), loss_cfg
    )  # fmt: skip
    tensors = dict(advantages=advantages, response_mask=mask, teacher_log_prob=teacher)
    if old is not None:
        tensors["old_log_probs"] = old
    mb = _micro_batch(from_update=old is None, **tensors)
    return fn({"log_probs": log_prob}, mb, _ctx(mask)), mb


def test_advantage_mode_is_the_policy_loss_of_the_shaped_advantages():
    log_prob = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = torch.tensor([[-1.1, -1.9, -0.6, -2.0]])
    teacher = torch.tensor([[-0.2, -4.0, -0.5, -1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    (loss, metrics), mb = _loss("advantage", log_prob, teacher, adv, mask, old=old)
    # by hand: A_t - 0.5 * (old - teacher) on the valid tokens; the last token is masked
    shaped = torch.tensor([[1.0 - 0.5 * -0.9, 1.0 - 0.5 * 2.1, 1.0 - 0.5 * -0.1, 0.0]])
    expected, _ = POLICY_LOSSES.get("ppo")(
        log_prob=log_prob, old_log_prob=old, advantages=shaped, response_mask=mask,
        config=PolicyLossConfig(), scale=LossScale.whole_batch(mask),
    )  # fmt: skip
    assert loss.item() == pytest.approx(expected.item(), abs=1e-12)
    assert torch.equal(mb.batch["advantages"], adv)  # the engine's micro-batch is untouched
    assert metrics["distill/reverse_kl"] == pytest.approx((-0.8 + 2.0 + 0.0) / 3)
    assert metrics["distill/teacher_log_prob"] == pytest.approx((-0.2 - 4.0 - 0.5) / 3)


def test_loss_mode_adds_the_kl_term():
    log_prob = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    teacher = torch.tensor([[-0.2, -4.0, -0.5]])
    adv = torch.zeros(1, 3)
    mask = torch.ones(1, 3)
    for kl_type in ("k2", "k3", "k1"):
        (loss, metrics), _ = _loss("loss", log_prob, teacher, adv, mask, coef=0.25,
                                   kl_type=kl_type)  # fmt: skip
        kl = kl_penalty(log_prob, teacher, kl_type).mean()
        assert loss.item() == pytest.approx(0.25 * kl.item(), abs=1e-12)  # zero advantages
        assert metrics["distill/kl_loss"] == pytest.approx(kl.item())


@pytest.mark.parametrize("mode", ["advantage", "loss"])
def test_expected_gradient_is_the_exact_reverse_kl_gradient(mode):
    """Sum over every token y of p_s(y) * grad(loss on a one-token batch holding y), at
    the student's current weights, against autograd of the exact full-vocabulary KL."""
    torch.manual_seed(0)
    vocab = 7
    student_logits = torch.randn(vocab, requires_grad=True)
    teacher_logp = torch.log_softmax(torch.randn(vocab) * 2, dim=-1)
    exact = full_vocab_reverse_kl(student_logits[None], teacher_logp[None], torch.ones(1))
    (expected_grad,) = torch.autograd.grad(exact, student_logits)

    p_s = torch.softmax(student_logits.detach(), dim=-1)
    total = torch.zeros(vocab)
    for y in range(vocab):
        logits = student_logits.detach().clone().requires_grad_(True)
        log_prob = torch.log_softmax(logits, dim=-1)[y].reshape(1, 1)
        (loss, _), _ = _loss(mode, log_prob, teacher_logp[y].reshape(1, 1), torch.zeros(1, 1),
                             torch.ones(1, 1), coef=1.0)  # fmt: skip
        (grad,) = torch.autograd.grad(loss, logits)
        total += p_s[y] * grad
    assert torch.allclose(total, expected_grad, atol=1e-10)


def test_full_vocab_reverse_kl_by_hand():
    p = torch.tensor([0.5, 0.25, 0.25])
    q = torch.tensor([0.25, 0.5, 0.25])
    hand = 0.5 * torch.log(torch.tensor(2.0)) + 0.25 * torch.log(torch.tensor(0.5))
    value = full_vocab_reverse_kl(p.log()[None], q.log()[None], torch.ones(1))
    assert value.item() == pytest.approx(hand.item(), abs=1e-12)
    masked = full_vocab_reverse_kl(
        torch.stack([p.log(), q.log()]), torch.stack([q.log(), q.log()]), torch.tensor([1.0, 0.0])
    )
    assert masked.item() == pytest.approx(hand.item(), abs=1e-12)


def test_missing_teacher_log_prob_names_the_field():
    loss_cfg = PolicyLossConfig()
    fn = make_distill_loss_fn(make_actor_loss_fn(loss_cfg), DistillConfig(teacher_path="t"),
                              loss_cfg)  # fmt: skip
    mask = torch.ones(1, 2)
    mb = _micro_batch(True, advantages=torch.zeros(1, 2), response_mask=mask)
    with pytest.raises(KeyError, match="teacher_log_prob"):
        fn({"log_probs": torch.zeros(1, 2)}, mb, _ctx(mask))


def _raw(**sections):
    raw = {
        "model": {"path": "tiny-random:qwen2"},
        "data": {"train_files": ["x.jsonl"], "train_batch_size": 2},
        "actor": {"mini_batch_size": 2},
    }
    raw.update(sections)
    return raw


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^distill\.coef: invalid value -1"):
        load_config(_raw(distill={"teacher_path": "t", "coef": -1}))
    with pytest.raises(ConfigError, match=r"^distill\.mode: invalid value 'reverse'"):
        load_config(_raw(distill={"teacher_path": "t", "mode": "reverse"}))
    with pytest.raises(ConfigError, match=r"^distill\.kl_type: .*did you mean 'k2'"):
        load_config(_raw(distill={"teacher_path": "t", "kl_type": "k22"}))
    with pytest.raises(ConfigError, match=r"^distill\.num_workers: invalid value 0"):
        load_config(_raw(distill={"teacher_path": "t", "num_workers": 0}))
    with pytest.raises(ConfigError, match=r"^distill\.placement: invalid value 'driver'"):
        load_config(_raw(distill={"teacher_path": "t", "placement": "driver"}))
    with pytest.raises(ConfigError, match=r"^distill\.dtype: invalid value 'int8'"):
        load_config(_raw(distill={"teacher_path": "t", "dtype": "int8"}))
    # distillation alone: no rule-based reward needed; without a teacher, one is
    cfg = load_config(_raw(distill={"teacher_path": "t"}, reward={"rule_based": False}))
    assert cfg.distill.enabled and cfg.distill.mode == "advantage"
    with pytest.raises(ConfigError, match=r"^reward\.rule_based: invalid value False"):
        load_config(_raw(reward={"rule_based": False}))


def _tokenizer(words, **special):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(words)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    return PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", **special)


def test_a_teacher_with_another_vocabulary_is_refused_in_one_line():
    from rl_algos.trainer.preflight import check_same_vocabulary

    words = ["<unk>", "<s>", "</s>", "a", "b", "c"]
    policy = _tokenizer(words, bos_token="<s>", eos_token="</s>")
    check_same_vocabulary(policy, _tokenizer(words, bos_token="<s>", eos_token="</s>"), "k", "t")
    cases = [
        (_tokenizer([*words, "d"], bos_token="<s>", eos_token="</s>"), "7 tokens"),
        (_tokenizer(["<unk>", "<s>", "</s>", "a", "c", "b"], bos_token="<s>", eos_token="</s>"),
         "2 tokens map to other ids"),
        (_tokenizer(words, bos_token="<s>", eos_token="c"), "eos_token: 'c'"),
    ]  # fmt: skip
    for teacher, detail in cases:
        with pytest.raises(ConfigError) as err:
            check_same_vocabulary(policy, teacher, "distill.teacher_path", "distillation teacher")
        message = str(err.value)
        assert message.startswith("distill.teacher_path: invalid value")
        assert detail in message
        assert "\n" not in message
        # both tokenizers named: model.path's (the policy's) and the teacher's
        assert f"model.path's tokenizer ({type(policy).__name__} " in message
        assert f"its tokenizer differs ({type(teacher).__name__} " in message


def test_a_token_map_by_text_gives_the_teachers_id_of_each_policy_token():
    from rl_algos.errors import ConfigError
    from rl_algos.trainer.batch_ops import with_token_ids
    from rl_algos.trainer.preflight import teacher_token_ids
    from rl_core.protocol import DataProto

    policy = _tokenizer(["<unk>", "<s>", "</s>", "a", "b", "c"])
    teacher = _tokenizer(["<unk>", "<s>", "</s>", "c", "a", "b", "d"])  # reordered, one more
    with pytest.raises(ConfigError, match=r"; or distill\.token_map: by_text\)$"):
        teacher_token_ids(policy, teacher, None)  # no map: refused, the key named
    table = teacher_token_ids(policy, teacher, "by_text")
    assert table == [0, 1, 2, 4, 5, 3]  # a -> 4, b -> 5, c -> 3 by hand
    ids = torch.tensor([[1, 3, 4, 5, 2]])
    batch = DataProto.from_dict(
        {"input_ids": ids, "responses": ids[:, 3:], "attention_mask": ids > 0}
    )
    mapped = with_token_ids(batch, table, ("input_ids", "responses"))
    assert mapped.batch["input_ids"].tolist() == [[1, 4, 5, 3, 2]]
    assert mapped.batch["responses"].tolist() == [[3, 2]]
    assert torch.equal(mapped.batch["attention_mask"], ids > 0)
    assert batch.batch["input_ids"].tolist() == [[1, 3, 4, 5, 2]]  # the student's batch kept
    # an id past the tokenizer (a larger embedding) or one without a token: refused, named
    for bad, table_with_gap in ((6, table), (3, [0, 1, 2, -1, 5, 3])):
        odd = DataProto.from_dict({"input_ids": torch.tensor([[1, bad]]), "responses": ids})
        with pytest.raises(
            ValueError, match=rf"^distill\.token_map: input_ids holds token id {bad},"
        ):
            with_token_ids(odd, table_with_gap, ("input_ids", "responses"))
    with pytest.raises(
        ConfigError, match=r"^distill\.token_map: invalid value 'by_text'.*1 are not \(e\.g\. 'c'\)"
    ):
        teacher_token_ids(policy, _tokenizer(["<unk>", "<s>", "</s>", "a", "b"]), "by_text")
