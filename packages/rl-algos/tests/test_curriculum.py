"""The curriculum by kind (rl_algos.data.curriculum): scores, draw probabilities by hand,
the batch's shift towards a kind near p = 0.5 and away as it saturates, exact resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rl_algos.config.curriculum_section import CurriculumConfig
from rl_algos.data import PromptDataset
from rl_algos.data.curriculum import CurriculumLoader, KindCurriculum, learnability
from rl_algos.data.tasks import ArithmeticTask, arithmetic_kind
from rl_core import DataProto
from rl_core.config import ConfigError


def test_learnability_scores_by_hand():
    p = np.array([0.0, 0.1, 0.5, 0.9, 1.0])
    assert learnability(p, "variance").tolist() == pytest.approx([0, 0.36, 1, 0.36, 0])
    # 1 - 0.1^8 - 0.9^8 = 1 - 1e-8 - 0.43046721
    informative = learnability(p, "informative", group_size=8)
    assert informative.tolist() == pytest.approx([0, 0.56953278, 1 - 2 / 256, 0.56953278, 0])
    with pytest.raises(ValueError, match="'entropy'"):
        learnability(p, "entropy")


def _update(c: KindCurriculum, mid_successes: int) -> None:
    """One batch of 8 samples per kind: `easy` all right, `hard` all wrong, `mid` some."""
    kinds = ["easy"] * 8 + ["hard"] * 8 + ["mid"] * 8
    c.update(kinds, [1.0] * 8 + [0.0] * 8 + [1.0] * mid_successes + [0.0] * (8 - mid_successes))


def test_the_draw_shifts_towards_a_kind_near_half_and_away_as_it_saturates():
    c = KindCurriculum(["easy", "hard", "mid"], floor=0.1, ema=0.5, prior=0.5)
    mid = c.kinds.index("mid")
    assert c.probabilities().tolist() == pytest.approx([1 / 3] * 3)  # all at the prior
    # mid stays at 0.5; easy goes 0.75, 0.875, ...; hard 0.25, 0.125, ... (s = 4p(1-p))
    # easy and hard: s = 0.75, 0.4375, 0.234375, 0.12109375, then below the floor 0.1
    expected_mid = [1 / 2.5, 1 / 1.875, 1 / 1.46875, 1 / 1.2421875, 1 / 1.2]
    for want in expected_mid:
        _update(c, 4)
        assert c.probabilities()[mid] == pytest.approx(want)
    assert c.rate["mid"] == 0.5 and c.rate["easy"] == pytest.approx(0.984375)
    # mid saturates: 0.75, 0.875, 0.9375, 0.96875, 0.984375 (s below the floor: uniform)
    expected_mid = [0.75 / 0.95, 0.4375 / 0.6375, 0.234375 / 0.434375, 0.12109375 / 0.32109375]
    for want in expected_mid:
        _update(c, 8)
        assert c.probabilities()[mid] == pytest.approx(want)
    _update(c, 8)
    assert c.probabilities().tolist() == pytest.approx([1 / 3] * 3)
    assert c.observed == {"easy": 80, "hard": 80, "mid": 80}


def test_sharpness_raises_the_scores_to_a_power_above_the_floor():
    # after one update (ema 0.5): easy p 0.75, hard 0.25 (s = 0.75), mid 0.5 (s = 1)
    flat = KindCurriculum(["easy", "hard", "mid"], floor=0.1, ema=0.5)
    sharp = KindCurriculum(["easy", "hard", "mid"], floor=0.1, sharpness=3, ema=0.5)
    for c in (flat, sharp):
        _update(c, 4)
    assert flat.probabilities().tolist() == pytest.approx([0.75 / 2.5, 0.75 / 2.5, 1 / 2.5])
    total = 2 * 0.75**3 + 1
    assert sharp.probabilities().tolist() == pytest.approx([0.75**3 / total] * 2 + [1 / total])
    # easy and hard at s = 0.4375: 0.4375^3 ~ 0.084 is below the floor, which holds
    _update(sharp, 4)
    assert sharp.probabilities().tolist() == pytest.approx([0.1 / 1.2, 0.1 / 1.2, 1 / 1.2])
    with pytest.raises(
        ConfigError, match=r"sharpness: invalid value 0; expected a finite number > 0"
    ):
        CurriculumConfig(sharpness=0)


def test_guided_gap_draws_the_kinds_the_guide_solves_and_the_policy_does_not():
    # q(1-p) by hand: learned (p 1), guide helps (q 1, p 0), hopeless (q 0, p 0), mid
    p, q = np.array([1.0, 0.0, 0.0, 0.5]), np.array([1.0, 1.0, 0.0, 0.8])
    assert learnability(p, "guided_gap", q=q).tolist() == pytest.approx([0, 1, 0, 0.4])
    with pytest.raises(
        ValueError,
        match=r"'guided_gap' needs q \(the guided samples' success rate per kind\), got q=None",
    ):
        learnability(p, "guided_gap")
    c = KindCurriculum(["guidable", "hopeless", "learned"], score="guided_gap", ema=1.0)
    assert c.probabilities().tolist() == pytest.approx([1 / 3] * 3)  # 0.25 each at the prior
    # 4 guided then 4 own samples per kind; only the guided ones solve "guidable"
    guided = ([True] * 4 + [False] * 4) * 3
    kinds = ["guidable"] * 8 + ["hopeless"] * 8 + ["learned"] * 8
    c.update(kinds, [1.0] * 4 + [0.0] * 4 + [0.0] * 8 + [1.0] * 8, guided)
    assert c.rate == {"guidable": 0.0, "hopeless": 0.0, "learned": 1.0}  # own samples only
    assert c.guided_rate == {"guidable": 1.0, "hopeless": 0.0, "learned": 1.0}
    assert c.probabilities().tolist() == pytest.approx([1 / 1.2, 0.1 / 1.2, 0.1 / 1.2])
    # the policy learns the kind: its own samples right too, the draw goes back to uniform
    c.update(kinds, [1.0] * 8 + [0.0] * 8 + [1.0] * 8, guided)
    assert c.probabilities().tolist() == pytest.approx([1 / 3] * 3)
    # resumed from its state: the same rates, guided ones included
    again = KindCurriculum(c.kinds, score="guided_gap")
    again.load_state_dict(c.state_dict())
    assert again.probabilities().tolist() == c.probabilities().tolist()
    assert again.guided_rate == c.guided_rate
    with pytest.raises(ValueError, match="24 kinds for 24 successes, 3 guided"):
        c.update(kinds, [1.0] * 24, [True] * 3)


def test_guided_gap_is_refused_without_guided_samples(dataset, tokenizer):
    from rl_algos.config import load_config

    loader = CurriculumLoader(dataset, 2, CurriculumConfig(enabled=True, score="guided_gap"))
    with pytest.raises(ValueError, match="score='guided_gap' needs guided samples"):
        loader.observe(_scored(loader.next_batch(), {"easy": 1, "hard": 0, "mid": 0}))
    from pathlib import Path

    job = str(Path(__file__).parents[3] / "examples" / "grpo_smollm2_arithmetic.yaml")
    with pytest.raises(
        ConfigError,
        match=r"data\.curriculum\.score.*'guided_gap'.*without rollout\.guide_prompt_key or "
        r"rollout\.reference_key",
    ):
        load_config(job, ["rollout.reference_key=null", "rollout.reference_n=0"])


def _rows(kinds: list[str]) -> list[dict]:
    return [
        {
            "prompt": [{"role": "user", "content": f"question {i}"}],
            "data_source": "x",
            "kind": kind,
            "reward_model": {"ground_truth": "1"},
        }
        for i, kind in enumerate(kinds)
    ]


def _scored(prompts: DataProto, success_of: dict[str, float], n: int = 8) -> DataProto:
    """`prompts` sampled n times; a sample of kind k scores 1 with the first
    round(n * success_of[k]) samples of its group."""
    kinds = list(prompts.non_tensor_batch["kind"])
    rows_kind = [k for k in kinds for _ in range(n)]
    wins = [float(j < round(n * success_of[k])) for k in kinds for j in range(n)]
    scores = torch.zeros(len(rows_kind), 3)
    scores[:, -1] = torch.tensor(wins)
    uids = [f"{i}" for i in range(len(kinds)) for _ in range(n)]
    return DataProto.from_dict(
        tensors={"token_level_scores": scores},
        non_tensors={"kind": rows_kind, "uid": uids},
    )


@pytest.fixture
def dataset(tokenizer):
    kinds = ["easy"] * 20 + ["hard"] * 20 + ["mid"] * 20
    return PromptDataset(_rows(kinds), tokenizer, 64, name="train")


def test_the_loaders_batches_follow_the_probabilities(dataset):
    cfg = CurriculumConfig(enabled=True, floor=0.1, ema=0.5)
    loader = CurriculumLoader(dataset, 4, cfg, seed=3)
    success = {"easy": 1.0, "hard": 0.0, "mid": 0.5}
    every_kind = DataProto.from_dict(non_tensors={"kind": ["easy", "hard", "mid"]})
    for _ in range(5):  # as in the hand computation above: mid's weight 1 / 1.2
        loader.observe(_scored(every_kind, success))
    assert loader.curriculum.rate["mid"] == 0.5
    assert loader.probabilities().tolist() == pytest.approx([1 / 12, 1 / 12, 5 / 6])
    drawn = [k for _ in range(300) for k in loader.next_batch().non_tensor_batch["kind"]]
    share = drawn.count("mid") / len(drawn)
    assert abs(share - 5 / 6) < 0.045  # 1200 draws: 4 standard deviations
    assert drawn.count("easy") > 40 and drawn.count("hard") > 40  # the floor: none starves
    metrics = loader.metrics(_scored(loader.next_batch(), success))
    assert metrics["curriculum/weight/mid"] == pytest.approx(5 / 6)
    assert metrics["curriculum/success/easy"] == pytest.approx(0.984375)
    assert sum(metrics[f"curriculum/share/{k}"] for k in ("easy", "hard", "mid")) == 1.0
    assert loader.epoch == 301 * 4 // 60
    # every row of a kind comes once per pass over that kind
    assert loader.kind_epoch["mid"] >= 1


def test_a_resumed_loader_draws_the_same_prompts(dataset):
    cfg = CurriculumConfig(enabled=True, floor=0.05, ema=0.3, score="informative")

    def run(loader: CurriculumLoader, batches: int) -> list[list[int]]:
        drawn = []
        for b in range(batches):
            prompts = loader.next_batch()
            drawn.append(list(prompts.non_tensor_batch["index"]))
            # successes that change with time: mid becomes easy
            loader.observe(_scored(prompts, {"easy": 1.0, "hard": 0.125, "mid": min(1, b / 8)}))
        return drawn

    whole = run(CurriculumLoader(dataset, 4, cfg, seed=5), 12)
    first = CurriculumLoader(dataset, 4, cfg, seed=5)
    head = run(first, 6)
    state = first.state_dict()
    resumed = CurriculumLoader(dataset, 4, cfg, seed=5)  # a new process would build this
    resumed.load_state_dict(state)

    def tail(loader: CurriculumLoader) -> list[list[int]]:
        drawn = []
        for b in range(6, 12):
            prompts = loader.next_batch()
            drawn.append(list(prompts.non_tensor_batch["index"]))
            loader.observe(_scored(prompts, {"easy": 1.0, "hard": 0.125, "mid": min(1, b / 8)}))
        return drawn

    assert head + tail(resumed) == whole
    assert len({tuple(b) for b in whole}) == 12  # not one batch repeated
    other = CurriculumLoader(dataset, 4, cfg, seed=6)
    with pytest.raises(ValueError, match="seed=5 but this run has seed=6"):
        other.load_state_dict(state)


def test_bad_input_names_the_field(dataset, tokenizer):
    with pytest.raises(ConfigError, match="floor"):
        CurriculumConfig(floor=0)
    with pytest.raises(ConfigError, match="score"):
        CurriculumConfig(score="entropy")  # type: ignore[arg-type]
    rows = [*_rows(["a"]), {"prompt": [{"role": "user", "content": "q"}], "data_source": "x"}]
    unkinded = PromptDataset(rows, tokenizer, 64, name="train")
    with pytest.raises(ValueError, match=r"train row 1: data\.curriculum\.kind_key='kind' is None"):
        CurriculumLoader(unkinded, 1, CurriculumConfig(enabled=True))
    loader = CurriculumLoader(dataset, 2, CurriculumConfig(enabled=True, metric="reward_acc"))
    with pytest.raises(KeyError, match=r"data\.curriculum\.metric"):
        loader.observe(_scored(loader.next_batch(), {"easy": 1, "hard": 0, "mid": 0}))


def test_arithmetic_rows_carry_their_kind():
    assert arithmetic_kind("45 * 7", 315) == "ab*c"
    assert arithmetic_kind("7 - 45", -38) == "a-cd<0"
    assert arithmetic_kind("45 - 17", 28) == "ab-cd"
    assert arithmetic_kind("3 - 5", -2) == "a-c<0"
    assert arithmetic_kind("12 + 3 * 4", 24) == "nn+n*n"
    assert arithmetic_kind("123 + 4", 127) == "3d+c"
    import random

    task = ArithmeticTask(digits=(1, 2), max_multiplier=9)
    for seed in range(50):
        expression, row = task.sample(random.Random(seed))
        left, op, right = expression.split()
        assert row["kind"].startswith("ab"[: len(left)] + op + "cd"[: len(right)])


def test_worked_demos_of_the_problems_own_kind_leave_the_problems_alone():
    import random

    plain = ArithmeticTask(digits=(1, 2), max_multiplier=9, teacher_few_shot=3)
    guided = ArithmeticTask(
        digits=(1, 2), max_multiplier=9, teacher_few_shot=3, demo_steps=True, demo_same_kind=1
    )
    rng_a, rng_b = random.Random(11), random.Random(11)
    for _ in range(60):
        (expression, row), (same_expression, same_row) = plain.sample(rng_a), guided.sample(rng_b)
        assert (expression, row["prompt"]) == (same_expression, same_row["prompt"])
        demos = same_row["teacher_prompt"][:-1]
        assert len(demos) == 6
        last_demo, last_reply = demos[-2]["content"], demos[-1]["content"]
        demo_expression = last_reply.split(" = ")[0]
        answer = int(last_reply.rsplit("{", 1)[1].rstrip("}"))
        assert arithmetic_kind(demo_expression, answer) == row["kind"], (last_demo, row["kind"])
    # the steps, by hand
    task = ArithmeticTask(demo_steps=True)
    reply = task._demo_turns("7 - 45", "q", "-38")[1]["content"]
    assert reply == "7 - 45 = -(45 - 7) = -38. \\boxed{-38}"
    assert task._demo_turns("34 * 7", "q", "238")[1]["content"] == (
        "34 * 7 = 210 + 28 = 238. \\boxed{238}"
    )
    assert task._demo_turns("30 * 7", "q", "210")[1]["content"] == "30 * 7 = 210. \\boxed{210}"
    assert task._demo_turns("45 - 7", "q", "38")[1]["content"] == "45 - 7 = 38. \\boxed{38}"
    assert (
        task._demo_turns("7 + 91", "q", "98")[1]["content"] == "7 + 91 = 91 + 7 = 98. \\boxed{98}"
    )
    with pytest.raises(ValueError, match=r"demo_same_kind must be an integer 0\.\.8, got 9"):
        ArithmeticTask(demo_same_kind=9)


def test_demo_steps_by_operator_show_steps_only_for_the_listed_ones():
    only_minus = ArithmeticTask(demo_steps=["-"])

    def reply(task, expression, answer):
        return task._demo_turns(expression, "q", answer)[1]["content"]

    assert reply(only_minus, "7 - 45", "-38") == "7 - 45 = -(45 - 7) = -38. \\boxed{-38}"
    assert reply(only_minus, "34 * 7", "238") == "34 * 7 = 238. \\boxed{238}"
    assert reply(only_minus, "7 + 91", "98") == "7 + 91 = 98. \\boxed{98}"
    both = ArithmeticTask(demo_steps=("*", "+"))
    assert reply(both, "34 * 7", "238") == "34 * 7 = 210 + 28 = 238. \\boxed{238}"
    assert reply(both, "7 - 45", "-38") == "7 - 45 = -38. \\boxed{-38}"
    assert reply(ArithmeticTask(demo_steps=[]), "7 - 45", "-38") == "7 - 45 = -38. \\boxed{-38}"
    for bad in ("yes", ["/"], 1):
        with pytest.raises(ValueError, match=r"demo_steps must be true, false or a list of the"):
            ArithmeticTask(demo_steps=bad)


def test_partial_product_steps_name_each_partial_product():
    task = ArithmeticTask(demo_steps=True, product_steps="partial")
    reply = task._demo_turns("67 * 9", "q", "603")[1]["content"]
    assert reply == "67 * 9 = 60 * 9 + 7 * 9 = 540 + 63 = 603. \\boxed{603}"
    assert task._demo_turns("60 * 9", "q", "540")[1]["content"] == "60 * 9 = 540. \\boxed{540}"
    assert (
        task._demo_turns("7 + 91", "q", "98")[1]["content"] == "7 + 91 = 91 + 7 = 98. \\boxed{98}"
    )
    no_steps = ArithmeticTask(product_steps="partial")  # steps only where demo_steps asks
    assert no_steps._demo_turns("67 * 9", "q", "603")[1]["content"] == "67 * 9 = 603. \\boxed{603}"
    with pytest.raises(ValueError, match=r"product_steps 'tens'; expected 'sum' .* or 'partial'"):
        ArithmeticTask(product_steps="tens")


def test_an_answer_hint_shows_the_worked_answer_in_every_guide_question_only():
    import random

    options = dict(digits=(1, 2), max_multiplier=9, teacher_few_shot=3, demo_steps=True)
    plain, hinted = ArithmeticTask(**options), ArithmeticTask(**options, teacher_answer_hint=True)
    rng_a, rng_b = random.Random(5), random.Random(5)
    for _ in range(40):
        (expression, row), (_, hinted_row) = plain.sample(rng_a), hinted.sample(rng_b)
        assert hinted_row["prompt"] == row["prompt"]  # the trained prompt does not change
        guide, unhinted = hinted_row["teacher_prompt"], row["teacher_prompt"]
        assert [m["role"] for m in guide] == [m["role"] for m in unhinted]
        for turn, (user, reply) in enumerate(zip(guide[0:-1:2], guide[1::2], strict=True)):
            assert reply == unhinted[2 * turn + 1]  # the demo replies as they were
            assert (
                user["content"]
                == f"{unhinted[2 * turn]['content']} (Worked answer: {reply['content']})"
            )
        answer = row["reward_model"]["ground_truth"]
        worked = plain._demo_turns(expression, "q", answer)[1]["content"]
        assert guide[-1]["content"] == f"{row['prompt'][-1]['content']} (Worked answer: {worked})"
    # by hand: a negative difference's hint carries its steps and its answer
    row = ArithmeticTask(**options, teacher_answer_hint=True)._demo_turns(
        "7 - 45", "q?", "-38", hint=True
    )
    assert row[0]["content"] == "q? (Worked answer: 7 - 45 = -(45 - 7) = -38. \\boxed{-38})"
    with pytest.raises(ValueError, match="teacher_answer_hint must be true or false, got 'yes'"):
        ArithmeticTask(teacher_few_shot=1, teacher_answer_hint="yes")
    with pytest.raises(ValueError, match="teacher_answer_hint needs teacher_few_shot >= 1"):
        ArithmeticTask(teacher_answer_hint=True)
