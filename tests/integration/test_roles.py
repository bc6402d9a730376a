"""The distillation teacher and the generative judge as roles of their own (``nox -s
tests-faults``): one real run on embedded Ray with the teacher on a pool of its own
(``distill.placement: split``) and the judge served by an hf rollout replica of its own
(``reward.judge.placement: split``).

* After set-up the driver process holds no `torch.nn.Module` and no tensor over 1 MB (a
  `gc.get_objects()` scan): the models live in the workers and replicas only.
* The start-up log names every role with its pool and processes, teacher and judge included.
* The teacher group's log-probs of step 1 are those of a single-process Hugging Face
  forward pass of the teacher (float64) on the same prompts and responses.
* After step 1 the teacher's process and the judge's replica are killed with SIGKILL: the
  teacher's group is rebuilt by the trainer's failover (``trainer.restarts`` 1, the step
  replayed from the in-memory snapshot), the judge's replica is replaced by the judge's
  rollout manager; the run ends with every step logged once.

About 60-90 s on 2 CPUs.
"""

from __future__ import annotations

import gc
import logging
import os
import signal
import time

import pytest
import torch

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.ray]
MB = 1 << 20


def _models_and_big_tensors() -> list[str]:
    """Every module that holds a parameter or buffer (parameterless activation modules that
    libraries create at import, e.g. transformers' ACT2FN, hold no model) or is a Hugging
    Face model, and every tensor over 1 MB, in this process."""
    from transformers import PreTrainedModel

    found = []
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.nn.Module):
                state = next(iter(obj.state_dict().values()), None)
                if state is not None or isinstance(obj, PreTrainedModel):
                    found.append(f"module {type(obj).__name__}")
            elif isinstance(obj, torch.Tensor) and obj.nelement() * obj.element_size() > MB:
                found.append(f"tensor {tuple(obj.shape)} {obj.dtype}")
        except ReferenceError:  # a dead weak proxy
            continue
    return found


@pytest.mark.timeout(400)
def test_teacher_and_judge_are_roles_of_their_own(ray_cluster, make_config, caplog):
    from rl_algos.trainer.loop import RLTrainer
    from rl_algos.trainer.model_source import resolve_model_path

    judge_path = resolve_model_path("tiny-random:llama")
    cfg = make_config("grpo", [
        "distill.teacher_path=tiny-random:llama", "distill.placement=split",
        f"reward.judge.model_path={judge_path}", "reward.judge.max_new_tokens=4",
        "reward.judge.on_failure=score", "reward.judge.failure_score=0",
        "reward.judge.score_range=[0,1e12]", "reward.judge.weight=0.1",
        "trainer.num_workers=1", "trainer.total_steps=3", "trainer.max_restarts=2",
        "trainer.restart_backoff_s=0", "trainer.snapshot_every=1",
        "reward.judge.cpus_per_replica=0.5", "trainer.cpus_per_worker=0.5",
        "data.max_response_length=4",
    ])  # fmt: skip
    with caplog.at_level(logging.INFO, logger="rl_algos.trainer.placement"):
        trainer = RLTrainer(cfg)
    try:
        gc.collect()
        assert _models_and_big_tensors() == []
        roles = [r.getMessage() for r in caplog.records if r.getMessage().startswith("role ")]
        by_role = {line.split(":")[0][len("role ") :]: line for line in roles}
        assert set(by_role) == {"actor", "teacher", "rollout", "judge"}, roles
        assert "pool teacher, 1 process(es): rank 0 pid" in by_role["teacher"]
        assert "pool actor," in by_role["actor"]
        assert by_role["judge"].startswith("role judge: pool judge (split), rollout replica 0")
        teacher_pid = int(trainer.groups.teacher.peak_memory()[0]["pid"])
        assert teacher_pid != int(trainer.groups.actor.peak_memory()[0]["pid"])
        judge_pid = trainer.judge.generator.manager.replicas[0].info["pid"]
        assert judge_pid != os.getpid()

        step, teacher_log_probs = trainer.train_step, trainer._teacher_log_probs
        killed, seen = [], []
        trainer._teacher_log_probs = lambda b: seen.append((b, teacher_log_probs(b))) or seen[-1][1]

        def train_step():
            if trainer.global_step == 1 and not killed:
                killed.append(True)
                os.kill(teacher_pid, signal.SIGKILL)
                os.kill(judge_pid, signal.SIGKILL)
                time.sleep(1.0)
            return step()

        trainer.train_step = train_step
        history = trainer.fit()
    finally:
        trainer.close()
    assert [h["step"] for h in history] == [1, 2, 3]
    assert history[-1]["trainer/restarts"] == 1
    assert history[1]["failover/from_snapshot"] == 1
    assert max(h.get("judge/replicas_replaced", 0) for h in history) == 1
    assert all(h["distill/teacher_log_prob"] < 0 for h in history)
    assert all(h["judge/timeouts"] == h["judge/errors"] == 0 for h in history)
    _check_teacher_log_probs(*seen[0], resolve_model_path("tiny-random:llama"))


def _check_teacher_log_probs(batch, out, teacher_path: str) -> None:
    from transformers import AutoModelForCausalLM

    from rl_algos.distill import TEACHER_LOG_PROB

    teacher = AutoModelForCausalLM.from_pretrained(teacher_path, dtype=torch.float64).eval()
    got, mask = out.batch[TEACHER_LOG_PROB], batch.batch["response_mask"].bool()
    temperature = float(batch.meta_info["temperature"])
    for i in range(len(batch)):
        length = int(mask[i].sum())
        prompt = list(batch.non_tensor_batch["raw_prompt_ids"][i])
        response = batch.batch["responses"][i, :length].tolist()
        with torch.no_grad():
            logits = teacher(torch.tensor([prompt + response])).logits[0]
        logp = (logits[len(prompt) - 1 : -1] / temperature).log_softmax(-1)
        want = logp.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
        assert torch.allclose(got[i, :length].double(), want, atol=2e-4), (i, got[i], want)
