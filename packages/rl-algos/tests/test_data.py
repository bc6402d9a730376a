"""Generated tasks, parquet/jsonl rows, chat-templated datasets and the resumable loader."""

from __future__ import annotations

import random
import re
from fractions import Fraction

import pytest
import torch

from rl_algos.data import (
    ArithmeticTask,
    CountdownTask,
    PromptDataLoader,
    PromptDataset,
    make_splits,
    read_rows,
    write_rows,
    write_task,
)
from rl_algos.data.generate import main as generate_main
from rl_algos.errors import DataError
from rl_algos.rewards import REWARDS


def test_arithmetic_answers_are_right():
    splits = make_splits(ArithmeticTask(min_value=0, max_value=50, num_operands=3), 300, 50, seed=3)
    assert len(splits["train"]) == 300 and len(splits["test"]) == 50
    for row in splits["train"] + splits["test"]:
        question = row["prompt"][-1]["content"]
        expression = re.match(r"What is (.+)\? Put the final answer", question).group(1)
        numbers = [int(n) for n in re.findall(r"\d+", expression)]
        assert len(numbers) == 3 and all(0 <= n <= 50 for n in numbers)
        assert row["reward_model"]["ground_truth"] == str(eval(expression))  # independent check
        assert row["data_source"] == "arithmetic"
        score = REWARDS.get("arithmetic")(
            "arithmetic", rf"\boxed{{{eval(expression)}}}", row["reward_model"]["ground_truth"]
        )
        assert score["score"] == 1.0
    train = {r["extra_info"]["expression"] for r in splits["train"]}
    test = {r["extra_info"]["expression"] for r in splits["test"]}
    assert not train & test and len(train) == 300


def test_generation_is_seeded():
    task = ArithmeticTask(max_value=9, ops=("*",), answer_format="hash", system_prompt="Be brief.")
    a = make_splits(task, 20, 5, seed=1)
    assert a == make_splits(task, 20, 5, seed=1)
    assert a != make_splits(task, 20, 5, seed=2)
    row = a["train"][0]
    assert row["prompt"][0] == {"role": "system", "content": "Be brief."}
    assert "####" in row["prompt"][1]["content"] and " * " in row["prompt"][1]["content"]


def test_train_repeats_follow_the_task_distribution_and_keep_the_held_out_splits():
    # digits [1, 2] with products capped at 9: a two-digit multiplier becomes 9, so about
    # half of the generator's "ab * c" are "ab * 9", of which only 90 problems exist
    task = ArithmeticTask(digits=[1, 2], max_multiplier=9, ops=("*",))
    extra = {"plain": (ArithmeticTask(digits=[1, 2], max_multiplier=9, ops=("*",)), 30)}
    distinct = make_splits(task, 600, 40, seed=4, extra=extra)
    repeats = make_splits(task, 600, 40, seed=4, extra=extra, train_repeats=True)
    for split in ("test", "plain"):  # drawn before train: row for row the same
        assert repeats[split] == distinct[split]
    held_out = {r["extra_info"]["expression"] for s in ("test", "plain") for r in repeats[s]}
    train = [r["extra_info"]["expression"] for r in repeats["train"]]
    assert len(train) == 600 and not held_out & set(train)
    assert len(set(train)) < 600  # problems recur
    assert len(set(r["extra_info"]["expression"] for r in distinct["train"])) == 600

    def nine_share(rows: list[dict]) -> float:
        products = [r for r in rows if r["kind"] == "ab*c"]
        return sum(r["extra_info"]["expression"].endswith("* 9") for r in products) / len(products)

    # the generator's share is 1/2 + 1/20; 90 - held-out problems cap the distinct split
    assert nine_share(distinct["train"]) < 0.35  # 12-13% on seeds 4-6
    assert 0.4 < nine_share(repeats["train"]) < 0.65  # 46-50% on seeds 4-6


def test_too_small_problem_space_fails_clearly():
    with pytest.raises(ValueError, match="distinct problems"):
        make_splits(ArithmeticTask(min_value=0, max_value=1, ops=("+",)), 10, 2)
    with pytest.raises(ValueError, match="num_operands"):
        ArithmeticTask(num_operands=1)


def test_arithmetic_digits_multiplier_and_varied_phrasings():
    task = ArithmeticTask(digits=(1, 2), max_multiplier=9, nonnegative=True, phrasings="varied")
    rows = make_splits(task, 600, 0, seed=5)["train"]
    digit_counts, ops, questions = set(), set(), set()
    for row in rows:
        a, op, b = row["extra_info"]["expression"].split()
        a, b = int(a), int(b)
        assert 0 <= a <= 99 and 0 <= b <= 99
        digit_counts |= {len(str(a)), len(str(b))}
        ops.add(op)
        if op == "*":
            assert b <= 9  # the multiplier cap
        if op == "-":
            assert a >= b  # nonnegative
        truth = {"+": a + b, "-": a - b, "*": a * b}[op]  # independent of safe_eval
        assert row["reward_model"]["ground_truth"] == str(truth)
        question = row["prompt"][-1]["content"]
        assert question.endswith(r"Put the final answer in \boxed{}, e.g. \boxed{7}.")
        assert str(a) in question and str(b) in question
        questions.add(re.sub(r"\d+", "N", question))
    assert digit_counts == {1, 2} and ops == {"+", "-", "*"}
    operands = [n for r in rows for n in r["extra_info"]["expression"].split()[::2]]
    one_digit = sum(len(n) == 1 for n in operands) / len(operands)
    assert 0.3 < one_digit < 0.6  # both common (fewer one-digit: duplicates are dropped)
    assert len(questions) >= 20  # worded and symbolic forms, three product symbols
    assert any("\u00d7" in q for q in questions) and any(" x " in q for q in questions)
    assert any(q.startswith("Subtract N from N") for q in questions)
    plain = make_splits(ArithmeticTask(digits=(1,)), 20, 0, seed=5)["train"]
    assert all(re.fullmatch(r"What is \d \S \d\? .*", r["prompt"][-1]["content"]) for r in plain)
    with pytest.raises(ValueError, match="digits"):
        ArithmeticTask(digits=(0,))
    with pytest.raises(ValueError, match="phrasings 'fancy'"):
        ArithmeticTask(phrasings="fancy")
    with pytest.raises(ValueError, match="max_multiplier"):
        ArithmeticTask(max_multiplier=0)


def test_arithmetic_few_shot_demos():
    options = dict(digits=(1, 2), max_multiplier=9, nonnegative=True, phrasings="varied")
    plain = make_splits(ArithmeticTask(**options), 50, 20, seed=7)
    shots = make_splits(
        ArithmeticTask(**options, few_shot=3, system_prompt="Calc."), 50, 20, seed=7
    )
    assert shots == make_splits(
        ArithmeticTask(**options, few_shot=3, system_prompt="Calc."), 50, 20, seed=7
    )
    for split in ("train", "test"):
        for row, base in zip(shots[split], plain[split], strict=True):
            # the problems themselves are those drawn without demos
            assert row["extra_info"] == base["extra_info"]
            assert row["reward_model"] == base["reward_model"]
            prompt = row["prompt"]
            assert prompt[0] == {"role": "system", "content": "Calc."}
            # the same question; the instruction's example answer is left to the demos
            asked = base["prompt"][-1]["content"].replace(r", e.g. \boxed{7}.", ".")
            assert prompt[-1] == {"role": "user", "content": asked}
            assert asked.endswith(r"Put the final answer in \boxed{}.")
            demos = prompt[1:-1]
            assert [m["role"] for m in demos] == ["user", "assistant"] * 3
            for question, reply in zip(demos[::2], demos[1::2], strict=True):
                a, op, b, answer, boxed = re.fullmatch(
                    r"(\d+) ([-+*]) (\d+) = (\d+)\. \\boxed\{(\d+)\}", reply["content"]
                ).groups()
                assert (
                    answer
                    == boxed
                    == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
                )
                assert a in question["content"] and b in question["content"]
                assert question["content"] != prompt[-1]["content"]
    # plain phrasings and both formats: each demo's reply is the value of its question
    for fmt, reply_pattern in (
        ("boxed", r"(.+) = (-?\d+)\. \\boxed\{(-?\d+)\}"),
        ("hash", r"(.+) = (-?\d+)\. #### (-?\d+)"),
    ):
        task = ArithmeticTask(max_value=20, answer_format=fmt, few_shot=2)
        for row in make_splits(task, 30, 0, seed=1)["train"]:
            demos = row["prompt"][:-1]
            assert len(demos) == 4
            for question, reply in zip(demos[::2], demos[1::2], strict=True):
                asked = re.fullmatch(r"What is (.+)\? (Put|End) .*\.", question["content"])
                shown, answer, final = re.fullmatch(reply_pattern, reply["content"]).groups()
                assert shown == asked.group(1)
                assert int(answer) == int(final) == eval(shown)
    for bad in (-1, 9, 1.5, True):
        with pytest.raises(ValueError, match=rf"few_shot must be .*0\.\.8, got {bad!r}"):
            ArithmeticTask(few_shot=bad)


def test_arithmetic_teacher_prompt_is_the_problem_after_worked_demos(tokenizer):
    options = dict(digits=(1, 2), phrasings="varied", instruction_share=0.5)
    plain = make_splits(ArithmeticTask(**options), 30, 0, seed=3)["train"]
    rows = make_splits(ArithmeticTask(**options, teacher_few_shot=2), 30, 0, seed=3)["train"]
    for row, base in zip(rows, plain, strict=True):
        assert row["prompt"] == base["prompt"]  # the student's prompt does not change
        teacher = row["teacher_prompt"]
        assert teacher[-1] == row["prompt"][-1] and len(teacher) == 5
        assert [m["role"] for m in teacher[:-1]] == ["user", "assistant"] * 2
        assert all(r"\boxed{" in m["content"] for m in teacher[1:-1:2])
    dataset = PromptDataset(rows, tokenizer, 1024, extra_prompt_keys=["teacher_prompt"])
    item = dataset[0]
    assert tokenizer.decode(item["teacher_prompt_ids"]).count("<|im_start|>user") == 3
    assert item["raw_prompt_ids"] != item["teacher_prompt_ids"]
    with pytest.raises(DataError, match="row 0, column 'teacher_prompt': missing"):
        PromptDataset(plain, tokenizer, 1024, extra_prompt_keys=["teacher_prompt"])
    for bad in (-1, 9, True):
        with pytest.raises(ValueError, match=rf"teacher_few_shot must be .*0\.\.8, got {bad!r}"):
            ArithmeticTask(teacher_few_shot=bad)


def test_arithmetic_teacher_system_prompt_opens_the_teacher_prompt_only():
    calc = "You are a calculator."
    task = ArithmeticTask(digits=(1,), teacher_few_shot=1, teacher_system_prompt=calc)
    for row in make_splits(task, 5, 0, seed=3)["train"]:
        assert [m["role"] for m in row["prompt"]] == ["user"]
        assert row["teacher_prompt"][0] == {"role": "system", "content": calc}
        assert row["teacher_prompt"][-1] == row["prompt"][-1]
    both = ArithmeticTask(digits=(1,), system_prompt="S", teacher_few_shot=1,
                          teacher_system_prompt=calc)  # fmt: skip
    row = make_splits(both, 1, 0, seed=3)["train"][0]
    assert row["prompt"][0]["content"] == "S"
    assert [m["content"] for m in row["teacher_prompt"] if m["role"] == "system"] == [calc]
    for bad, words in (("", "non-empty string"), (3, "non-empty string")):
        with pytest.raises(ValueError, match=f"teacher_system_prompt must be .*{words}"):
            ArithmeticTask(teacher_few_shot=1, teacher_system_prompt=bad)
    with pytest.raises(ValueError, match="teacher_system_prompt needs teacher_few_shot >= 1"):
        ArithmeticTask(teacher_system_prompt=calc)


def test_a_guide_prompt_is_held_to_max_prompt_length_the_teachers_is_not(tokenizer):
    rows = make_splits(ArithmeticTask(digits=(1,), teacher_few_shot=3), 20, 0, seed=3)["train"]
    own = max(len(i["raw_prompt_ids"]) for i in PromptDataset(rows, tokenizer, 1024))
    guides = sorted(
        len(i["teacher_prompt_ids"])
        for i in PromptDataset(rows, tokenizer, 1024, extra_prompt_keys=["teacher_prompt"])
    )
    limit = guides[10]  # every own prompt fits, some guides do not
    assert own <= limit < guides[-1]
    taught = PromptDataset(rows, tokenizer, limit, extra_prompt_keys=["teacher_prompt"])
    assert len(taught) == 20  # a teacher's prompt is read, not generated after
    guided = PromptDataset(rows, tokenizer, limit, generation_prompt_keys=["teacher_prompt"],
                           filter_overlong_prompts=True)  # fmt: skip
    assert 0 < len(guided) < 20 and guided.num_filtered == 20 - len(guided)
    assert all(len(i["teacher_prompt_ids"]) <= limit for i in guided)
    with pytest.raises(DataError, match=rf"column 'teacher_prompt': \d+ tokens > "
                       rf"data.max_prompt_length={limit} \(the rollout generates after it"):  # fmt: skip
        PromptDataset(rows, tokenizer, limit, generation_prompt_keys=["teacher_prompt"])


def test_reference_answers_become_response_ids_ended_with_eos(tokenizer):
    task = ArithmeticTask(digits=(2,), ops=("*",), max_multiplier=9, demo_steps=True,
                          product_steps="partial")  # fmt: skip
    rows = make_splits(task, 6, 0, seed=3)["train"]
    for row in rows:  # the reply a demo of the problem gives, steps included
        expression = row["extra_info"]["expression"]
        want = task._demo_turns(expression, "q", row["reward_model"]["ground_truth"])[1]
        assert row["worked_answer"] == want["content"]
    assert any(row["worked_answer"].count(" = ") == 3 for row in rows)  # partial products
    data = PromptDataset(rows, tokenizer, 256)
    data.tokenize_references("worked_answer", 64)
    for item in data:
        text = tokenizer.decode(item["worked_answer_ids"][:-1])
        assert text == item["worked_answer"]
        assert item["worked_answer_ids"][-1] == tokenizer.eos_token_id
    longest = max(len(item["worked_answer_ids"]) for item in data)
    data.tokenize_references("worked_answer", longest)  # fits exactly
    with pytest.raises(DataError, match=rf"column 'worked_answer': {longest} tokens with EOS > "
                       rf"data.max_response_length={longest - 1} \(a cut reference"):  # fmt: skip
        data.tokenize_references("worked_answer", longest - 1)
    for bad in ("", "  ", None, 12):
        broken = [dict(rows[0]), {**rows[1], "worked_answer": bad}]
        with pytest.raises(DataError, match=r"row 1, column 'worked_answer': .*non-empty string"):
            PromptDataset(broken, tokenizer, 256).tokenize_references("worked_answer", 64)
    del rows[2]["worked_answer"]
    with pytest.raises(DataError, match=r"row 2, column 'worked_answer': None: expected"):
        PromptDataset(rows, tokenizer, 256).tokenize_references("worked_answer", 64)


def test_generate_command_takes_the_new_arithmetic_options(tmp_path):
    out = tmp_path / "arith"
    args = ["arithmetic", "--out", str(out), "--train-size", "30", "--test-size", "5"]
    args += ["--digits", "1", "2", "--max-multiplier", "5", "--nonnegative", "--ops", "*", "-"]
    assert generate_main([*args, "--phrasings", "varied", "--format", "jsonl"]) == 0
    for row in read_rows(out / "train.jsonl"):
        a, op, b = row["extra_info"]["expression"].split()
        assert int(b) <= 5 if op == "*" else int(a) >= int(b)


def test_countdown_solutions_are_valid():
    splits = make_splits(
        CountdownTask(num_numbers=4, max_number=12, max_target=60), 200, 20, seed=0
    )
    score = REWARDS.get("countdown")
    for row in splits["train"] + splits["test"]:
        truth = row["reward_model"]["ground_truth"]
        solution = row["extra_info"]["solution"]
        used = sorted(int(n) for n in re.findall(r"\d+", solution))
        assert used == truth["numbers"] and len(used) == 4
        exact = re.sub(r"\d+", lambda m: f"Fraction({m.group()})", solution)
        value = eval(
            exact, {"Fraction": Fraction}
        )  # independent check of the generator, in exact arithmetic
        assert value == truth["target"] and 1 <= truth["target"] <= 60
        assert score("countdown", rf"\boxed{{{solution}}}", truth)["score"] == 1.0
        assert str(truth["target"]) in row["prompt"][-1]["content"]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_rows_round_trip_through_files(tmp_path, fmt):
    rows = make_splits(CountdownTask(), 30, 5, seed=0)["train"]
    path = write_rows(rows, tmp_path / f"rows.{fmt}")
    assert read_rows(path) == rows
    assert read_rows([path, path]) == rows + rows
    with pytest.raises(ValueError, match=r"unknown format '\.csv'"):
        read_rows(tmp_path / "x.csv")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_rows(tmp_path / "missing.parquet")


def test_generate_command_writes_splits(tmp_path, capsys):
    out = tmp_path / "arith"
    code = generate_main(
        [
            "arithmetic",
            "--out",
            str(out),
            "--train-size",
            "40",
            "--test-size",
            "8",
            "--max-value",
            "9",
            "--ops",
            "+",
            "-",
        ]
    )
    assert code == 0
    train, test = read_rows(out / "train.parquet"), read_rows(out / "test.parquet")
    assert len(train) == 40 and len(test) == 8
    assert all("*" not in r["extra_info"]["expression"] for r in train)
    assert "arithmetic train" in capsys.readouterr().out
    paths = write_task("countdown", tmp_path / "cd", 10, 2, file_format="jsonl", num_numbers=3)
    assert sorted(p.name for p in paths.values()) == ["test.jsonl", "train.jsonl"]


def rows_of_length(lengths):
    return [
        {
            "data_source": "arithmetic",
            "prompt": [{"role": "user", "content": "x" * n}],
            "reward_model": {"style": "rule", "ground_truth": str(n)},
            "extra_info": {"n": n},
        }
        for n in lengths
    ]


def test_dataset_applies_the_chat_template_and_refuses_or_filters_long_prompts(tokenizer):
    # the template adds 19 tokens around the content (one per character here)
    dataset = PromptDataset(
        rows_of_length([1, 5, 30, 2]), tokenizer, 34, name="train", filter_overlong_prompts=True
    )
    assert len(dataset) == 3 and dataset.num_filtered == 1
    assert dataset.stats() == {
        "data/train_rows": 4.0,
        "data/train_filtered_overlong": 1.0,
        "data/train_prompts": 3.0,
    }
    item = dataset[1]
    expected = "<|im_start|>user\nxxxxx<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(item["raw_prompt_ids"]) == expected
    assert item["index"] == 1 and item["raw_prompt"] == [{"role": "user", "content": "xxxxx"}]
    with pytest.raises(
        ValueError, match=r"row 2: prompt has 49 tokens > data\.max_prompt_length=34"
    ):
        PromptDataset(rows_of_length([1, 5, 30]), tokenizer, 34)  # the default: refused
    with pytest.raises(ValueError, match="no prompts left"):
        PromptDataset(rows_of_length([30]), tokenizer, 34, filter_overlong_prompts=True)


def test_dataset_input_errors_and_plain_text(tokenizer):
    with pytest.raises(DataError, match="data row 0, column 'data_source': missing"):
        PromptDataset([{"prompt": "hi"}], tokenizer, 64)
    with pytest.raises(ValueError, match="must be text or a list of"):
        PromptDataset([{"prompt": 5, "data_source": "x"}], tokenizer, 64)
    plain = PromptDataset(
        [{"prompt": "2+2=", "data_source": "x"}], tokenizer, 64, apply_chat_template=False
    )
    assert tokenizer.decode(plain[0]["raw_prompt_ids"]) == "2+2="
    with pytest.raises(ValueError, match="apply_chat_template is false"):
        PromptDataset(rows_of_length([1]), tokenizer, 64, apply_chat_template=False)


def test_collated_batches_are_left_padded(tokenizer):
    dataset = PromptDataset(rows_of_length([1, 4, 2]), tokenizer, 64)
    (batch,) = list(PromptDataLoader(dataset, 3, shuffle=False))
    ids, mask, pos = (
        batch.batch["input_ids"],
        batch.batch["attention_mask"],
        batch.batch["position_ids"],
    )
    assert ids.shape == (3, 23) and mask[:, -1].all()
    assert mask.sum(-1).tolist() == [20, 23, 21]
    assert (ids[0, :3] == tokenizer.pad_token_id).all() and ids[
        0, 3
    ] == tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert pos[0, :4].tolist() == [0, 0, 0, 0] and pos[0, -1] == 19
    assert [len(p) for p in batch.non_tensor_batch["raw_prompt_ids"]] == [20, 23, 21]
    assert batch.non_tensor_batch["ground_truth"].tolist() == ["1", "4", "2"]
    assert batch.non_tensor_batch["data_source"].tolist() == ["arithmetic"] * 3
    assert batch.non_tensor_batch["extra_info"][1] == {"n": 4}
    assert batch.meta_info == {"epoch": 0, "batch_in_epoch": 0}


def uids(batch):
    return batch.non_tensor_batch["index"].tolist()


def test_loader_resumes_exactly_across_epochs(tokenizer):
    dataset = PromptDataset(rows_of_length(range(1, 12)), tokenizer, 64)  # 11 prompts
    reference = PromptDataLoader(dataset, 3, seed=7)
    assert len(reference) == 3  # drop_last
    full = [uids(b) for _ in range(3) for b in reference]  # three epochs
    assert len(full) == 9 and full[:3] != full[3:6]  # reshuffled every epoch
    assert len({i for batch in full[:3] for i in batch}) == 9  # 2 prompts dropped per epoch
    for stop in (0, 2, 3, 4, 8):
        first = PromptDataLoader(dataset, 3, seed=7)
        seen = []
        while len(seen) < stop:
            for batch in first:
                seen.append(uids(batch))
                if len(seen) == stop:
                    break
        state = first.state_dict()
        resumed = PromptDataLoader(dataset, 3, seed=7)  # a new process would build this
        resumed.load_state_dict(state)
        while len(seen) < 9:
            seen.extend(uids(b) for b in resumed)
        assert seen[:9] == full, f"resume after {stop} batches"


def test_loader_resume_after_the_data_grew_keeps_the_position(tokenizer, caplog):
    old = PromptDataset(rows_of_length(range(1, 11)), tokenizer, 64)  # 10 prompts
    grown = PromptDataset(rows_of_length(range(1, 17)), tokenizer, 64)  # 6 appended
    first = PromptDataLoader(old, 2, seed=3)
    batches = iter(first)
    seen = [uids(next(batches)) for _ in range(2)]  # 4 of the 10 in epoch 0
    state = first.state_dict()
    resumed = PromptDataLoader(grown, 2, seed=3)
    with caplog.at_level("WARNING"):
        resumed.load_state_dict(state)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert "grew from 10 to 16 prompts" in lines[0] and "(epoch 0, batch 2)" in lines[0]
    rest = [uids(b) for b in resumed]  # the rest of epoch 0
    epoch_0 = [i for batch in seen + rest for i in batch]
    assert sorted(epoch_0) == list(range(16))  # none twice, none skipped, the new ones in
    drawn = {i for batch in seen for i in batch}
    assert [i for batch in rest[:3] for i in batch] == [
        i for i in first.order(0).tolist() if i not in drawn
    ]  # the old prompts' own order first
    assert min(i for batch in rest[3:] for i in batch) >= 10
    # a checkpoint inside the grown epoch resumes the same order (no second warning)
    again = PromptDataLoader(grown, 2, seed=3)
    middle = PromptDataLoader(grown, 2, seed=3)
    middle.load_state_dict(state)
    it = iter(middle)
    next(it)
    again.load_state_dict(middle.state_dict())
    assert [uids(b) for b in again] == rest[1:]
    # epoch 1 shuffles all 16
    assert sorted(i for b in resumed for i in uids(b)) == list(range(16))
    # a data set that shrank is refused
    with pytest.raises(ValueError, match="dataset_size=16 but this run has dataset_size=10"):
        PromptDataLoader(old, 2, seed=3).load_state_dict(resumed.state_dict())


def test_loader_state_taken_at_an_epoch_end_continues_with_the_next_epoch(tokenizer):
    dataset = PromptDataset(rows_of_length(range(1, 7)), tokenizer, 64)
    loader = PromptDataLoader(dataset, 2, seed=5)
    batches = iter(loader)
    epoch_0 = [uids(next(batches)) for _ in range(3)]  # the last batch of epoch 0
    resumed = PromptDataLoader(dataset, 2, seed=5)
    resumed.load_state_dict(loader.state_dict())
    assert (resumed.epoch, resumed.position) == (1, 0)
    epoch_1 = [uids(b) for b in resumed]
    assert len(epoch_1) == 3 and epoch_1 != epoch_0
    assert epoch_1 == [[int(i) for i in loader.order(1)[k : k + 2]] for k in (0, 2, 4)]


def test_loader_state_mismatch_and_tail_batch(tokenizer):
    dataset = PromptDataset(rows_of_length(range(1, 6)), tokenizer, 64)
    state = PromptDataLoader(dataset, 2, seed=1).state_dict()
    with pytest.raises(ValueError, match="the checkpoint has seed=1 but this run has seed=2"):
        PromptDataLoader(dataset, 2, seed=2).load_state_dict(state)
    tail = PromptDataLoader(dataset, 2, shuffle=False, drop_last=False)
    assert [uids(b) for b in tail] == [[0, 1], [2, 3], [4]]
    with pytest.raises(ValueError, match="batch_size 9 is larger than the 5 prompts"):
        PromptDataLoader(dataset, 9)
    assert isinstance(next(iter(tail)).batch["input_ids"], torch.Tensor)


def test_arithmetic_fixed_few_shot_demos_are_shared_cover_the_ops_and_are_never_asked():
    options = dict(digits=(1, 2), max_multiplier=9, nonnegative=True, phrasings="varied")
    task = ArithmeticTask(**options, few_shot=3, few_shot_demos="fixed", system_prompt="Calc.")
    splits = make_splits(task, 300, 100, seed=7)
    rows = splits["train"] + splits["test"]
    demos = rows[0]["prompt"][1:-1]
    assert [m["role"] for m in demos] == ["user", "assistant"] * 3
    shown = [re.match(r"(\d+) ([-+*]) (\d+) =", m["content"]).groups() for m in demos[1::2]]
    assert [op for _, op, _ in shown] == ["+", "-", "*"]  # one op after the other
    demo_expressions = {" ".join(parts) for parts in shown}
    for row in rows:
        assert row["prompt"][1:-1] == demos  # every prompt: the same demos
        assert row["extra_info"]["expression"] not in demo_expressions
    # rows own their messages: editing one prompt leaves the others alone
    rows[0]["prompt"][1]["content"] = "changed"
    assert rows[1]["prompt"][1]["content"] != "changed"
    # per-problem demos (the default) differ between problems
    default = make_splits(ArithmeticTask(**options, few_shot=3), 10, 0, seed=7)["train"]
    assert len({str(r["prompt"][:-1]) for r in default}) > 1
    with pytest.raises(ValueError, match=r"few_shot_demos 'shared'; expected 'per_problem' or"):
        ArithmeticTask(few_shot=1, few_shot_demos="shared")


def test_arithmetic_fixed_demos_that_leave_no_problem_is_a_named_error():
    # four problems in all (3 + 3, 3 + 4, 4 + 3, 4 + 4), all taken as demos
    task = ArithmeticTask(min_value=3, max_value=4, ops=["+"], few_shot=4, few_shot_demos="fixed")
    with pytest.raises(ValueError, match=r"few_shot 4 needs demo problems, and these options"):
        task.sample(random.Random(0))


def test_arithmetic_few_shot_without_other_problems_is_a_named_error():
    task = ArithmeticTask(min_value=3, max_value=3, ops=["+"], few_shot=1)
    with pytest.raises(ValueError, match=r"few_shot 1 needs demo problems other than '3 \+ 3'"):
        task.sample(random.Random(0))


def test_held_out_phrasings_are_never_the_varied_ones():
    from rl_algos.data import tasks as t

    varied = ArithmeticTask(digits=(1, 2), max_multiplier=9, phrasings="varied")
    held_out = ArithmeticTask(digits=(1, 2), max_multiplier=9, phrasings="held_out")

    def stems(task, seed):  # the question with its numbers blanked out
        rows = make_splits(task, 400, 0, seed=seed)["train"]
        return {re.sub(r"\d+", "N", r["prompt"][-1]["content"].split(" Put ")[0]) for r in rows}

    seen_varied, seen_held_out = stems(varied, 1), stems(held_out, 1)
    assert not seen_varied & seen_held_out
    # every held-out form occurs (4 worded per op, 4 symbolic, x 3 symbols for a product)
    worded = {f.format(a="N", b="N") for forms in t._HELD_OUT_WORDED.values() for f in forms}
    assert worded <= seen_held_out
    assert {"How much is N + N?", "N - N?", "quick question: N \u00d7 N"} <= seen_held_out


def test_few_shot_min_mixes_demo_counts_and_keeps_the_problems():
    options = dict(digits=(1, 2), max_multiplier=9, phrasings="varied", instruction_example=False)
    fixed = make_splits(ArithmeticTask(**options, few_shot=3), 300, 0, seed=5)["train"]
    mixed = make_splits(ArithmeticTask(**options, few_shot=3, few_shot_min=0), 300, 0, seed=5)
    counts = []
    for row, base in zip(mixed["train"], fixed, strict=True):
        assert row["extra_info"] == base["extra_info"]  # the same problems, in order
        assert row["prompt"][-1] == base["prompt"][-1]  # and the same question
        demos = len(row["prompt"]) - 1
        assert demos % 2 == 0
        counts.append(demos // 2)
        assert row["prompt"][:-1] == base["prompt"][:demos]  # the first of the same demos
    # uniform over 0..3: 75 expected of each in 300 (each within 5 sigma)
    assert {c: counts.count(c) for c in range(4)} == {
        c: pytest.approx(75, abs=38) for c in range(4)
    }
    assert mixed == make_splits(ArithmeticTask(**options, few_shot=3, few_shot_min=0), 300, 0, 5)
    with pytest.raises(
        ValueError, match=r"few_shot_min must be null or an integer in 0..few_shot \(2\), got 3"
    ):
        ArithmeticTask(few_shot=2, few_shot_min=3)
    with pytest.raises(ValueError, match="few_shot_min needs few_shot_demos 'per_problem'"):
        ArithmeticTask(few_shot=2, few_shot_min=0, few_shot_demos="fixed")


def test_instruction_share_and_example():
    bare = ArithmeticTask(max_value=50, instruction_share=0.0)
    for row in make_splits(bare, 50, 0, seed=2)["train"]:
        assert re.fullmatch(r"What is \d+ [-+*] \d+\?", row["prompt"][-1]["content"])
    half = make_splits(ArithmeticTask(max_value=50, instruction_share=0.5), 400, 0, seed=2)
    asked = [r"\boxed{}" in r["prompt"][-1]["content"] for r in half["train"]]
    assert sum(asked) == pytest.approx(200, abs=50)  # 5 sigma of a binomial(400, 0.5)
    no_example = ArithmeticTask(max_value=50, instruction_example=False)
    for row in make_splits(no_example, 20, 0, seed=2)["train"]:
        assert row["prompt"][-1]["content"].endswith(r"? Put the final answer in \boxed{}.")
    for bad in (-0.1, 1.5, True, "half"):
        with pytest.raises(
            ValueError, match=rf"instruction_share must be a number in \[0, 1\], got {bad!r}"
        ):
            ArithmeticTask(instruction_share=bad)


def test_extra_split_is_disjoint_and_uses_its_own_options(tmp_path):
    from rl_algos.config.schema import PLAIN_SPLIT_OPTIONS

    options = dict(digits=(1, 2), max_multiplier=9, phrasings="varied", few_shot=3, few_shot_min=0)
    options["system_prompt"] = "Calc."
    paths = write_task(
        "arithmetic",
        tmp_path,
        300,
        40,
        seed=7,
        extra_splits={"plain_test": (120, dict(PLAIN_SPLIT_OPTIONS))},
        **options,
    )
    assert sorted(paths) == ["plain_test", "test", "train"]
    splits = {name: read_rows(path) for name, path in paths.items()}
    assert [len(splits[n]) for n in ("train", "test", "plain_test")] == [300, 40, 120]
    keys = {n: {r["extra_info"]["expression"] for r in rows} for n, rows in splits.items()}
    assert not keys["train"] & keys["plain_test"] and not keys["test"] & keys["plain_test"]
    assert not keys["train"] & keys["test"]
    negative = 0
    for row in splits["plain_test"]:
        assert len(row["prompt"]) == 1 and row["prompt"][0]["role"] == "user"  # no system, no demos
        assert row["extra_info"]["split"] == "plain_test"
        assert "e.g." not in row["prompt"][0]["content"]
        negative += row["reward_model"]["ground_truth"].startswith("-")
    assert negative > 10  # differences may be negative (nonnegative is off)
