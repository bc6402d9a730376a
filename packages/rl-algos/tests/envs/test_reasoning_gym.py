"""reasoning-gym as a data source, its scorer as the reward, and as a text environment:
against the real package (rl-algos[reasoning-gym]; nox -s tests-envs)."""

from __future__ import annotations

import pytest

pytest.importorskip("reasoning_gym", reason="needs rl-algos[reasoning-gym] (nox -s tests-envs)")

import reasoning_gym

from rl_algos.data.reasoning_gym import ReasoningGymTask, regenerate_entry
from rl_algos.data.reasoning_gym_env import draw_rows
from rl_algos.data.tasks import make_splits, task_factory
from rl_algos.rewards.reasoning_gym import answer_candidates, compute_score
from rl_algos.rewards.registry import default_compute_score
from rl_core.testing.text_env import TextEnvConformance
from rl_core.text_env import ModelTurn, make_text_env

OPTIONS = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def task(**kw):
    return ReasoningGymTask(dataset="basic_arithmetic", config=dict(OPTIONS), **kw)


def test_rows_are_reasoning_gyms_own_entries_and_the_splits_are_disjoint():
    splits = make_splits(task(), 300, 200, seed=5)
    test_q = {r["prompt"][-1]["content"] for r in splits["test"]}
    train_q = {r["prompt"][-1]["content"] for r in splits["train"]}
    assert len(test_q) == 200 and len(train_q) == 300 and not test_q & train_q
    # the same problems reasoning-gym itself generates for that seed and index
    reference = reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=100_000, **OPTIONS)
    for row in splits["test"][:20]:
        index = row["extra_info"]["reasoning_gym"]["index"]
        entry = reference[index]
        assert (
            row["prompt"][-1]["content"]
            == entry["question"] + "\n\nPut the final answer in \\boxed{}."
        )
        assert row["reward_model"]["ground_truth"] == entry["answer"]
        assert row["data_source"] == "reasoning_gym"
        assert row["extra_info"]["kind"] == "num_digits=1,num_terms=2"
    # seeded: the same seed gives the same rows
    assert make_splits(task(), 300, 200, seed=5) == splits
    assert task_factory("reasoning_gym") is ReasoningGymTask


def test_few_shot_demos_are_never_a_problem():
    t = task(few_shot=2, system_prompt="Be brief.")
    rows = make_splits(t, 50, 50, seed=1)
    prompt = rows["test"][0]["prompt"]
    assert [m["role"] for m in prompt] == [
        "system",
        "user",
        "assistant",
        "user",
        "assistant",
        "user",
    ]
    demos = {prompt[1]["content"], prompt[3]["content"]}
    assert prompt[2]["content"].startswith("\\boxed{")
    for row in rows["test"] + rows["train"]:
        assert row["prompt"][-1]["content"] not in demos


def test_the_reward_is_reasoning_gyms_score_of_the_extracted_answer():
    row = make_splits(task(), 0, 1, seed=3)["test"][0]
    _, entry = regenerate_entry(row["extra_info"]["reasoning_gym"])
    answer = entry["answer"]
    wrong = str(int(answer) + 1)

    def score(reply):
        return compute_score("reasoning_gym", reply, answer, row["extra_info"])

    assert score(f"So {entry['question']} gives \\boxed{{{answer}}}") == {
        "score": 1.0, "acc": 1.0, "strict": 1.0, "any_score": 1.0,
    }  # fmt: skip
    assert score(f"The answer is {answer}.") == {
        "score": 0.5, "acc": 1.0, "strict": 0.0, "any_score": 1.0,
    }  # fmt: skip
    assert score(f"<answer>{answer}</answer>")["acc"] == 1.0
    assert score(f"\\boxed{{{wrong}}}")["score"] == 0.0
    assert score(f"\\boxed{{{wrong}}} no wait, {answer}")["acc"] == 1.0  # any format: last number
    assert score("")["acc"] == 0.0
    # the registered reward by data source
    assert (
        default_compute_score("reasoning_gym", f"\\boxed{{{answer}}}", answer, row["extra_info"])[
            "acc"
        ]
        == 1.0
    )
    assert answer_candidates("x\n\\boxed{ 12 }.")["boxed"] == "12"


def test_bad_input_is_named():
    with pytest.raises(ValueError, match=r"'basic_arithmetc' is not one of .*basic_arithmetic"):
        ReasoningGymTask(dataset="basic_arithmetc")
    with pytest.raises(ValueError, match=r"options .*min_terms.* rejected"):
        ReasoningGymTask(dataset="basic_arithmetic", config={"min_terms": 0})
    with pytest.raises(ValueError, match="config is list"):
        ReasoningGymTask(dataset="basic_arithmetic", config=[1])
    row = make_splits(task(), 0, 1, seed=3)["test"][0]
    with pytest.raises(ValueError, match="regenerates with answer"):
        compute_score("reasoning_gym", "1", "not the answer", row["extra_info"])
    with pytest.raises(ValueError, match="no 'reasoning_gym' record"):
        compute_score("reasoning_gym", "1", "1", {})


MIX = [
    {"name": "chain_sum", "weight": 1, "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
    {"name": "products", "config": {"min_terms": 2, "max_terms": 2, "max_digits": 1}},
    {"name": "gcd", "weight": 2.0, "config": {"max_numbers": 2, "max_value": 20}},
]


def test_a_composite_mix_has_one_kind_per_dataset_and_its_scorer_scores_each():
    from reasoning_gym.composite import DatasetSpec

    mix = ReasoningGymTask(dataset="composite", config={"datasets": MIX}, few_shot=2)
    splits = make_splits(mix, 300, 90, seed=2)
    test_q = {r["prompt"][-1]["content"] for r in splits["test"]}
    train_q = {r["prompt"][-1]["content"] for r in splits["train"]}
    assert len(test_q) == 90 and len(train_q) == 300 and not test_q & train_q
    assert {r["kind"] for r in splits["test"]} == {"chain_sum", "products", "gcd"}
    # reasoning-gym's own composite of the same specs: the same entries, kind = its source
    specs = [DatasetSpec(m["name"], float(m.get("weight", 1)), m["config"]) for m in MIX]
    reference = reasoning_gym.create_dataset("composite", seed=0, size=100_000, datasets=specs)
    for row in splits["test"][:30]:
        entry = reference[row["extra_info"]["reasoning_gym"]["index"]]
        assert row["kind"] == row["ability"] == entry["metadata"]["source_dataset"]
        assert row["prompt"][-1]["content"].startswith(entry["question"])
        answer = entry["answer"]
        assert row["reward_model"]["ground_truth"] == answer
        # the reward: the composite's scorer (delegating to the entry's dataset)
        score = compute_score("reasoning_gym", f"\\boxed{{{answer}}}", answer, row["extra_info"])
        assert score["strict"] == 1.0 and score["score"] == 1.0
        wrong = compute_score(
            "reasoning_gym", f"\\boxed{{{int(answer) + 1}}}", answer, row["extra_info"]
        )
        assert wrong["strict"] == 0.0 and wrong["score"] == 0.0


def test_a_bad_composite_names_the_field():
    def mix(datasets):
        return ReasoningGymTask(dataset="composite", config={"datasets": datasets})

    with pytest.raises(ValueError, match=r"config\.datasets: invalid value None; expected a list"):
        ReasoningGymTask(dataset="composite")
    with pytest.raises(
        ValueError, match=r"config\.datasets\[1\]\.name 'gcdd' is not one of .*'gcd'"
    ):
        mix([MIX[0], {"name": "gcdd"}])
    with pytest.raises(
        ValueError, match=r"config\.datasets\[1\]\.weight: invalid value 0; expected a number > 0"
    ):
        mix([MIX[0], {"name": "gcd", "weight": 0}])
    with pytest.raises(
        ValueError, match=r"config\.datasets\[0\]\.config: invalid value \[1\]; expected a mapping"
    ):
        mix([{"name": "gcd", "config": [1]}])
    with pytest.raises(
        ValueError,
        match=r"config\.datasets\[0\]: invalid value .*'weights'.*; expected a mapping of name",
    ):
        mix([{"name": "gcd", "weights": 1}])
    with pytest.raises(ValueError, match=r"rejected by reasoning-gym: .*Duplicate dataset names"):
        mix([MIX[2], MIX[2]])


def test_the_environment_scores_one_turn_and_holds_out_val():
    env = make_text_env("reasoning_gym:basic_arithmetic", {"config": OPTIONS})
    train, val = env.tasks("train", 0, 60), env.tasks("val", 0, 20)
    assert not {r["prompt"][-1]["content"] for r in train} & {
        r["prompt"][-1]["content"] for r in val
    }
    first = env.reset(val[0], seed=0)
    assert first.messages == val[0]["prompt"]
    answer = val[0]["reward_model"]["ground_truth"]
    step = env.step(ModelTurn(f"\\boxed{{{answer}}}", [1], [], "stop", 1))
    assert (step.reward, step.terminated, step.info["strict"]) == (1.0, True, 1.0)
    assert draw_rows(env.task, "val", 0, 20) == val
    # held out whatever the seeds: no question of any val draw is in any train draw
    trains = {r["prompt"][-1]["content"] for s in (0, 1, 2) for r in env.tasks("train", s, 60)}
    vals = {r["prompt"][-1]["content"] for s in (0, 5) for r in env.tasks("val", s, 20)}
    assert len(vals) > 20 and len(trains) > 60 and not trains & vals


class TestReasoningGymConformance(TextEnvConformance):
    env_name = "reasoning_gym:basic_arithmetic"
    env_options = {"config": OPTIONS}
    model_turns = ["\\boxed{3}"]
