"""On-policy distillation end to end: a tiny student distils a tiny teacher of another
architecture and size.

The teacher is a 3-layer, hidden-96 Llama over the student's character vocabulary (the
student: the 2-layer, hidden-64 tiny Qwen2), its output layer scaled up so that its
next-token distributions are peaked (a random model's are nearly uniform). The trainer
runs `distill` alone (no task reward) on the in-process backend; before and after, the
exact full-vocabulary reverse KL(student || teacher) is computed in float64 from both
models' logits along the student's own greedy continuations of held-out prompts, and the
student's greedy tokens are compared with the teacher's.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from rl_algos.distill import full_vocab_reverse_kl

STEPS = 40
HELD_OUT = ["Say apples", "Say rivers", "Say clouds", "Say stones", "Say lights", "Say greens"]


def _peaked_teacher(student_dir: str, out: Path) -> str:
    """A differently sized, differently seeded model over the student's tokenizer, with
    its logits scaled 40x (peaked distributions)."""
    import transformers

    from rl_algos.trainer.model_source import tiny_text_fields

    tokenizer = transformers.AutoTokenizer.from_pretrained(student_dir)
    fields = {
        **tiny_text_fields(tokenizer),
        "hidden_size": 96,
        "intermediate_size": 192,
        "num_hidden_layers": 3,
    }
    config = transformers.LlamaConfig(**fields, tie_word_embeddings=False)
    torch.manual_seed(7)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return str(out)


def _prompt_ids(tokenizer: Any, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


@torch.no_grad()
def _greedy(model: Any, ids: list[int], steps: int = 8) -> list[int]:
    seq = list(ids)
    for _ in range(steps):
        seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(ids) :]


@torch.no_grad()
def _evaluate(student: Any, teacher: Any, prompts: list[list[int]]) -> dict[str, float]:
    """Exact reverse KL along the student's greedy continuations; the share of greedy
    tokens where student and teacher agree (free-running, position by position) and where
    the student's argmax is the teacher's along the teacher's own greedy continuation."""
    kls, agree_free, agree_forced, count = [], 0, 0, 0
    for ids in prompts:
        own = _greedy(student, ids)
        seq = torch.tensor([ids + own])
        mask = torch.zeros(seq.shape[1] - 1)
        mask[len(ids) - 1 :] = 1.0  # the positions that predict a response token
        kls.append(
            float(
                full_vocab_reverse_kl(
                    student(seq).logits[0, :-1], teacher(seq).logits[0, :-1], mask
                )
            )
        )
        reference = _greedy(teacher, ids)
        agree_free += sum(a == b for a, b in zip(own, reference, strict=True))
        forced = torch.tensor([ids + reference])
        s_arg = student(forced).logits[0, len(ids) - 1 : -1].argmax(-1)
        t_arg = teacher(forced).logits[0, len(ids) - 1 : -1].argmax(-1)
        agree_forced += int((s_arg == t_arg).sum())
        count += len(reference)
    return {
        "reverse_kl": sum(kls) / len(kls),
        "greedy_agreement": agree_free / count,
        "argmax_agreement": agree_forced / count,
    }


def _student_after(run_dir: Path) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    from rl_algos.export import locate_checkpoint, read_weights

    source = locate_checkpoint(run_dir)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(source.hf_dir))
    model.load_state_dict(read_weights(source), strict=True)
    return model.eval()


@pytest.mark.timeout(600)
def test_student_distils_a_larger_teacher(make_config, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    student_dir = resolve_model_path("tiny-random:qwen2")
    teacher_dir = _peaked_teacher(student_dir, tmp_path / "teacher")
    tokenizer = AutoTokenizer.from_pretrained(student_dir)
    prompts = [_prompt_ids(tokenizer, text) for text in HELD_OUT]
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir).eval()
    before = _evaluate(AutoModelForCausalLM.from_pretrained(student_dir).eval(), teacher, prompts)

    run_dir = tmp_path / "run"
    cfg = make_config(
        "grpo",
        [
            f"distill.teacher_path={teacher_dir}",
            "reward.rule_based=false",
            "trainer.backend=local",
            "trainer.num_workers=1",
            f"trainer.total_steps={STEPS}",
            f"trainer.save_every={STEPS}",
            "actor.mini_batch_size=4",
            "actor.optim.lr=3e-3",
            "rollout.n=4",
        ],
        output_dir=run_dir,
    )
    start = time.perf_counter()
    trainer = RLTrainer(cfg)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    seconds = time.perf_counter() - start
    after = _evaluate(_student_after(run_dir), teacher, prompts)
    print(f"\nbefore {before}\nafter  {after}\n{STEPS} steps in {seconds:.1f} s")
    estimates = [h["distill/reverse_kl"] for h in history if "distill/reverse_kl" in h]
    assert len(estimates) == STEPS
    # the loss's own sampled-token estimate falls too (the training signal is the KL)
    assert sum(estimates[-4:]) / 4 < 0.5 * sum(estimates[:4]) / 4
    assert after["reverse_kl"] <= 0.5 * before["reverse_kl"], (before, after)
    assert after["argmax_agreement"] > before["argmax_agreement"], (before, after)
    assert after["greedy_agreement"] >= before["greedy_agreement"], (before, after)


def test_rl_train_opd_tiny_example(tmp_path, run_rl):
    """`rl train examples/opd_tiny.yaml` (in-process backend), here in its other form: the
    KL loss term (`distill.mode=loss`) mixed with the task's reward (the learning test
    above runs the default, the advantage mode alone)."""
    from rl_algos.trainer.tracking import read_jsonl

    example = Path(__file__).resolve().parents[2] / "examples" / "opd_tiny.yaml"
    out = tmp_path / "run"
    result = run_rl("train", str(example), f"trainer.output_dir={out}", "trainer.backend=local",
                    "distill.mode=loss", "reward.rule_based=true", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]
    history = read_jsonl(out / "metrics.jsonl")
    steps = [h for h in history if h["step"] > 0]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        assert h["distill/teacher_log_prob"] < 0 and h["distill/kl_loss"] >= 0
        assert "reward/score_mean" in h  # the task's reward function ran
    assert "val/accuracy" in history[-1]


def test_a_teacher_with_another_vocabulary_stops_the_run_before_any_worker(make_config, tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from rl_algos.errors import ConfigError
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    teacher = tmp_path / "teacher"
    shutil.copytree(resolve_model_path("tiny-random:qwen2"), teacher)
    tokenizer = AutoTokenizer.from_pretrained(teacher)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|tool|>"]})
    tokenizer.save_pretrained(teacher)
    cfg = make_config("grpo", [f"distill.teacher_path={teacher}", "trainer.backend=local",
                              "trainer.num_workers=1"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"^distill\.teacher_path: .*distill\.token_map") as err:
        RLTrainer(cfg)
    assert "\n" not in str(err.value)
    # with a token map the teacher is accepted: its superset vocabulary keeps the policy's ids
    trainer = RLTrainer(make_config("grpo", [f"distill.teacher_path={teacher}",
                                             "distill.token_map=by_text", "trainer.backend=local",
                                             "trainer.num_workers=1"]))  # fmt: skip
    try:
        assert trainer.teacher_token_ids == list(range(len(trainer.tokenizer.get_vocab())))
    finally:
        trainer.close()


def _say_rows(second_prompt_key: str) -> list[dict[str, Any]]:
    """Four "Say <word>" rows, each with a second prompt under `second_prompt_key`: the same
    request after one worked demo."""
    return [
        {
            "prompt": [{"role": "user", "content": f"Say {w}"}],
            second_prompt_key: [
                {"role": "user", "content": "Say 12"},
                {"role": "assistant", "content": "12"},
                {"role": "user", "content": f"Say {w}"},
            ],
            "data_source": "digits",
            "reward_model": {"style": "rule", "ground_truth": "12"},
        }
        for w in ("apples", "rivers", "clouds", "stones")
    ]


def test_context_distillation_teacher_reads_its_own_prompt(make_config, tmp_path):
    """``distill.teacher_prompt_key``: the teacher's log-probs of each sampled response are
    those after the row's teacher prompt (checked against a single-process Hugging Face
    forward pass of that prompt + response), not after the student's prompt."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_algos.data import write_rows
    from rl_algos.distill import TEACHER_LOG_PROB
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    rows = _say_rows("teacher_prompt")
    train = write_rows(rows, tmp_path / "train.jsonl")
    model = resolve_model_path("tiny-random:qwen2")
    cfg = make_config("grpo", [
        f"data.train_files=[{train}]", f"distill.teacher_path={model}",
        "distill.teacher_prompt_key=teacher_prompt", "trainer.backend=local",
        "trainer.num_workers=1", "trainer.total_steps=1", "trainer.val_before_train=false",
    ])  # fmt: skip
    trainer = RLTrainer(cfg)
    seen: list[tuple[Any, Any]] = []
    teacher_log_probs = trainer._teacher_log_probs

    def recording(batch: Any) -> Any:
        out = teacher_log_probs(batch)
        seen.append((batch, out.batch[TEACHER_LOG_PROB]))
        return out

    trainer._teacher_log_probs = recording
    try:
        trainer.fit()
    finally:
        trainer.close()
    ((batch, got),) = seen
    tokenizer = AutoTokenizer.from_pretrained(model)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    mask = batch.batch["response_mask"].bool()
    temperature = float(batch.meta_info["temperature"])
    differs = 0
    for i in range(len(batch)):
        length = int(batch.batch["attention_mask"][i, -mask.shape[1] :].sum())
        response = batch.batch["responses"][i, :length].tolist()
        for key, expect_equal in (("teacher_prompt_ids", True), ("raw_prompt_ids", False)):
            prompt = list(batch.non_tensor_batch[key][i])
            with torch.no_grad():
                logits = reference(torch.tensor([prompt + response])).logits[0].double()
            logp = (logits[len(prompt) - 1 : -1] / temperature).log_softmax(-1)
            want = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
            close = torch.allclose(got[i, :length].double(), want, atol=2e-4)
            if expect_equal:
                assert close, (i, got[i, :length], want)
            else:
                differs += not close
    assert differs == len(batch)  # the student's prompt gives other log-probs
    assert tokenizer.decode(batch.non_tensor_batch["teacher_prompt_ids"][0]).count("Say") == 2


@pytest.mark.parametrize("guided_temperature", [None, 0.0])
def test_guided_samples_are_generated_after_the_guide_and_trained_after_the_own_prompt(
    make_config, tmp_path, guided_temperature
):
    """``rollout.guide_prompt_key``: the first ``guided_n`` samples of each group are
    generated after the row's guide prompt, then scored and trained as responses to the
    row's own prompt: the update's old log-probs of a guided response are those after the
    own prompt (a single-process Hugging Face forward pass), not after the guide, at
    ``rollout.temperature`` whatever ``rollout.guided_temperature`` (0: the guided
    responses are the reference's greedy ones after the guide)."""
    from transformers import AutoModelForCausalLM

    from rl_algos.data import write_rows
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    rows = _say_rows("guide")
    train = write_rows(rows, tmp_path / "train.jsonl")
    model = resolve_model_path("tiny-random:qwen2")
    cfg = make_config("grpo", [
        f"data.train_files=[{train}]", "rollout.guide_prompt_key=guide", "rollout.n=4",
        "data.max_prompt_length=64",
        "rollout.guided_n=1", "actor.recompute_old_log_probs=true", "trainer.backend=local",
        "trainer.num_workers=1", "trainer.total_steps=1", "trainer.val_before_train=false",
        f"rollout.guided_temperature={'null' if guided_temperature is None else guided_temperature}",
    ])  # fmt: skip
    trainer = RLTrainer(cfg)
    generated: list[tuple[Any, Any]] = []
    generate = trainer.rollout.generate_sequences

    def recording_generate(batch: Any) -> Any:
        out = generate(batch)
        generated.append((batch, out))
        return out

    updates: list[Any] = []
    update_actor = trainer.groups.actor.update_actor
    trainer.rollout.generate_sequences = recording_generate
    trainer.groups.actor.update_actor = lambda b: (updates.append(b), update_actor(b))[1]
    try:
        (metrics,) = trainer.fit()
    finally:
        trainer.close()
    ((asked, sampled),) = generated
    (batch,) = updates
    nt = asked.non_tensor_batch
    guided = nt["guided"]
    assert guided.tolist() == [i % 4 == 0 for i in range(len(asked))]
    for i in range(len(asked)):  # the generator read the guide on guided rows only
        want = nt["guide_ids"][i] if guided[i] else nt["own_prompt_ids"][i]
        assert list(nt["raw_prompt_ids"][i]) == list(want)
        assert list(nt["own_prompt_ids"][i]) != list(nt["guide_ids"][i])
    assert metrics["rollout/guided_share"] == 0.25
    assert {"reward/guided_mean", "reward/own_mean"} <= set(metrics)
    assert "rollout_log_probs" not in set(batch.batch.keys())  # they belong to the guide
    assert "temperature" not in batch.non_tensor_batch  # the sampling's, not the update's
    want_temperature = [guided_temperature if g else None for g in guided]
    if guided_temperature is None:
        assert "temperature" not in nt
    else:
        assert nt["temperature"].tolist() == want_temperature
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    temperature = float(batch.meta_info["temperature"])
    assert temperature == cfg.rollout.temperature == 1.0
    greedy_rows = 0
    for j in range(len(sampled)):  # guided at temperature 0: each token the guide's argmax
        length = int(sampled.batch["response_mask"][j].sum())
        if guided_temperature != 0.0 or not guided[j] or length == 0:
            continue
        guide, response = list(nt["guide_ids"][j]), sampled.batch["responses"][j, :length]
        with torch.no_grad():
            logits = reference(torch.tensor([guide + response.tolist()])).logits[0]
        assert logits[len(guide) - 1 : -1].argmax(-1).tolist() == response.tolist(), j
        greedy_rows += 1
    assert greedy_rows == (int(guided.sum()) if guided_temperature == 0.0 else 0)
    mask = batch.batch["response_mask"].bool()
    rows_by_seed = {int(s): i for i, s in enumerate(sampled.non_tensor_batch["seed"])}
    for i in range(len(batch)):
        j = rows_by_seed[int(batch.non_tensor_batch["seed"][i])]
        length = int(mask[i].sum())
        response = batch.batch["responses"][i, :length].tolist()
        assert response == sampled.batch["responses"][j, :length].tolist()  # as generated
        prompt = list(batch.non_tensor_batch["raw_prompt_ids"][i])
        assert prompt == list(nt["own_prompt_ids"][j])  # trained after the own prompt
        real = batch.batch["attention_mask"][i, : batch.batch["prompts"].shape[1]].bool()
        assert batch.batch["prompts"][i][real].tolist() == prompt
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + response])).logits[0].double()
        logp = (logits[len(prompt) - 1 : -1] / temperature).log_softmax(-1)
        want = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        got = batch.batch["old_log_probs"][i, :length].double()
        assert torch.allclose(got, want, atol=2e-4), (i, got, want)


def test_reference_samples_are_not_generated_and_are_trained_after_the_own_prompt(
    make_config, tmp_path
):
    """``rollout.reference_key``: the first ``reference_n`` samples of each group are the
    row's reference answer (tokenized, with EOS), never sent to the generator; the next
    ``guided_n`` read the guide; all are scored and trained after the own prompt, the
    references' old log-probs those of a single-process float64 forward pass."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rl_algos.data import write_rows
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    rows = [{**row, "answer": "12"} for row in _say_rows("guide")]
    rows[2]["answer"] = "= 12"  # another reply per row
    train = write_rows(rows, tmp_path / "train.jsonl")
    model = resolve_model_path("tiny-random:qwen2")
    cfg = make_config("grpo", [
        f"data.train_files=[{train}]", "rollout.guide_prompt_key=guide", "rollout.n=4",
        "rollout.guided_n=1", "rollout.reference_key=answer", "rollout.reference_n=1",
        "data.max_prompt_length=64", "actor.recompute_old_log_probs=true",
        "trainer.backend=local", "trainer.num_workers=1", "trainer.total_steps=1",
        "trainer.val_before_train=false",
    ])  # fmt: skip
    trainer = RLTrainer(cfg)
    asked: list[Any] = []
    generate = trainer.rollout.generate_sequences
    trainer.rollout.generate_sequences = lambda b: (asked.append(b), generate(b))[1]
    updates: list[Any] = []
    update_actor = trainer.groups.actor.update_actor
    trainer.groups.actor.update_actor = lambda b: (updates.append(b), update_actor(b))[1]
    try:
        (metrics,) = trainer.fit()
    finally:
        trainer.close()
    (sent,), (batch,) = asked, updates
    prompts = len(batch) // 4
    assert len(sent) == 3 * prompts  # the references were not generated
    assert sent.non_tensor_batch["guided"].tolist() == [i % 3 == 0 for i in range(len(sent))]
    nt = batch.non_tensor_batch
    assert nt["reference"].tolist() == [i % 4 == 0 for i in range(len(batch))]
    assert nt["guided"].tolist() == [i % 4 < 2 for i in range(len(batch))]
    assert metrics["rollout/guided_share"] == 0.5
    assert {"reward/guided_mean", "reward/own_mean"} <= set(metrics)
    assert "rollout_log_probs" not in set(batch.batch.keys())
    tokenizer = AutoTokenizer.from_pretrained(model)
    reference = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    mask = batch.batch["response_mask"].bool()
    answers = {r["prompt"][0]["content"]: r["answer"] for r in rows}
    scores = []  # the reward file's: the share of the answer's characters that are digits
    for i in np.flatnonzero(nt["reference"]):
        prompt = list(nt["raw_prompt_ids"][i])
        text = tokenizer.decode(prompt)
        answer = next(a for q, a in answers.items() if q in text)
        scores.append(sum(ch in "0123456789" for ch in answer) / len(answer))
        want_ids = [*tokenizer(answer, add_special_tokens=False)["input_ids"],
                    tokenizer.eos_token_id]  # fmt: skip
        response = batch.batch["responses"][i, : int(mask[i].sum())].tolist()
        assert response == want_ids, i
        real = batch.batch["attention_mask"][i, : batch.batch["prompts"].shape[1]].bool()
        assert batch.batch["prompts"][i][real].tolist() == prompt
        with torch.no_grad():
            logits = reference(torch.tensor([prompt + response])).logits[0].double()
        logp = logits[len(prompt) - 1 : -1].log_softmax(-1)
        want = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        got = batch.batch["old_log_probs"][i, : len(response)].double()
        assert torch.allclose(got, want, atol=2e-4), (i, got, want)
    assert 0.5 in scores and metrics["reward/reference_mean"] == pytest.approx(np.mean(scores))


def _permuted_teacher(student_dir: str, out: Path) -> Path:
    """The student under other token ids: its BPE vocabulary's ids reversed (the added
    special tokens kept), the embedding and output rows moved with them."""
    import json
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(student_dir, out)
    spec = json.loads((out / "tokenizer.json").read_text())
    fixed = {token["id"] for token in spec["added_tokens"]}
    movable = sorted(set(spec["model"]["vocab"].values()) - fixed)
    new_id = dict(zip(movable, reversed(movable), strict=True))
    spec["model"]["vocab"] = {t: new_id.get(i, i) for t, i in spec["model"]["vocab"].items()}
    (out / "tokenizer.json").write_text(json.dumps(spec))
    weights = load_file(out / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        rows = torch.tensor([new_id.get(i, i) for i in range(len(weights[name]))])
        moved = torch.empty_like(weights[name])
        moved[rows] = weights[name]
        weights[name] = moved
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    return out


def test_a_token_map_lets_a_teacher_with_other_ids_score_the_students_tokens(make_config, tmp_path):
    """`distill.token_map: by_text`: a teacher that is the student itself under reordered
    token ids gives every sampled token the student's own log-prob."""
    from rl_algos.distill import TEACHER_LOG_PROB
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    student = resolve_model_path("tiny-random:qwen2")
    teacher = _permuted_teacher(student, tmp_path / "teacher")
    cfg = make_config("grpo", [f"distill.teacher_path={teacher}", "distill.token_map=by_text",
                              "reward.rule_based=false", "trainer.backend=local",
                              "trainer.num_workers=1", "trainer.total_steps=1",
                              "trainer.save_every=0"], output_dir=tmp_path / "run")  # fmt: skip
    trainer = RLTrainer(cfg)
    scored = []
    teacher_log_probs = trainer._teacher_log_probs
    trainer._teacher_log_probs = lambda b: scored.append((b, teacher_log_probs(b))) or scored[-1][1]
    try:
        assert trainer.teacher_token_ids[4:] == list(range(99, 3, -1))
        trainer.fit()
        batch, out = scored[0]
        student_log_probs = trainer.groups.actor.compute_ref_log_prob(batch)
    finally:
        trainer.close()
    mask = batch.batch["response_mask"].bool()
    theirs, mine = out.batch[TEACHER_LOG_PROB][mask], student_log_probs.batch["ref_log_prob"][mask]
    assert mask.sum() > 10 and theirs.mean() < -1.0
    torch.testing.assert_close(theirs, mine, rtol=0, atol=1e-5)
