"""Reward functions: extraction, numeric equality, format, countdown, dispatch, user files."""

from __future__ import annotations

import pickle
from fractions import Fraction

import pytest

from rl_algos.errors import ConfigError
from rl_algos.rewards import (
    REWARDS,
    default_compute_score,
    load_reward_function,
    reward_for_data_source,
)
from rl_algos.rewards.countdown import compute_score as countdown_score
from rl_algos.rewards.countdown import safe_eval
from rl_algos.rewards.format import compute_score as format_score
from rl_algos.rewards.math_answer import (
    answers_equal,
    extract_answer,
    extract_boxed,
    extract_hash_answer,
    extract_last_number,
    parse_number,
)
from rl_algos.rewards.math_answer import compute_score as math_score


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{42}.", "42"),
        (r"\boxed{\frac{3}{4}}", r"\frac{3}{4}"),
        (r"\boxed{\left\{1, 2\right\}}", r"\left\{1, 2\right\}"),
        (r"first \boxed{1} then \boxed{ {a}+{b} }", "{a}+{b}"),
        (r"\fbox{7}", "7"),
        (r"\boxed 5$", "5"),
        (r"\boxed{unclosed", None),
        ("no box here", None),
        (r"\boxedx", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_extract_hash_and_last_number():
    assert extract_hash_answer("steps...\n#### 1,234\n") == "1,234"
    assert extract_hash_answer("#### 5\nmore\n#### -7 apples") == "-7 apples"
    assert extract_hash_answer("####   ") is None
    assert extract_hash_answer("nothing") is None
    assert extract_last_number("it is 3, then 4.5 and finally -1,000.") == "-1,000"
    assert extract_last_number("ratio 3 / 4") == "3/4"
    assert extract_last_number("no digits") is None
    assert extract_answer(r"#### 3 \boxed{4}", ("hash", "boxed")) == r"3 \boxed{4}"
    assert extract_answer("the answer is 9", ("boxed", "hash")) is None
    assert extract_answer("the answer is 9", ("boxed", "last_number")) == "9"
    with pytest.raises(ValueError, match="unknown answer extraction 'box'"):
        extract_answer("x", ("box",))


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", Fraction(42)),
        ("-7", Fraction(-7)),
        ("3/4", Fraction(3, 4)),
        ("-3/4", Fraction(-3, 4)),
        (r"\frac{3}{4}", Fraction(3, 4)),
        (r"\dfrac{-3}{4}", Fraction(-3, 4)),
        (r"-\frac{1}{2}", Fraction(-1, 2)),
        (r"\frac12", Fraction(1, 2)),
        ("1,234", Fraction(1234)),
        ("1,234,567.5", Fraction(2469135, 2)),
        ("$5", Fraction(5)),
        (r"\$18.00", Fraction(18)),
        ("0.75", Fraction(3, 4)),
        (".5", Fraction(1, 2)),
        ("1e3", Fraction(1000)),
        ("50%", Fraction(50)),
        ("x=5", Fraction(5)),
        (r"90^\circ", Fraction(90)),
        (r"12\text{ cm}", None),
        ("1,2", None),
        ("3/0", None),
        ("1/2/3", None),
        ("abc", None),
        ("", None),
    ],
)
def test_parse_number(text, value):
    assert parse_number(text) == value


@pytest.mark.parametrize(
    ("pred", "truth", "equal"),
    [
        ("0.75", "3/4", True),
        (r"\frac{3}{4}", "0.75", True),
        ("1,000", "1000", True),
        ("-2", "-2.0", True),
        ("2", "-2", False),
        ("3.1415926", "3.1415927", True),  # within the default relative tolerance 1e-6
        ("3.14", "3.1416", False),
        ("0.333", "1/3", False),
        ("x + 1", "x+1", True),
        (r"\text{(A)}", "(A)", True),
        ("5", "five", False),
        (None, "5", False),
        ("12", 12, True),  # ground truth given as an int
    ],
)
def test_answers_equal(pred, truth, equal):
    assert answers_equal(pred, truth) is equal


def test_answers_equal_with_a_custom_tolerance():
    assert answers_equal("0.333", "1/3", rel_tol=1e-2)
    assert not answers_equal("0.3", "1/3", rel_tol=1e-2)


def test_math_score_values():
    assert math_score("math", r"... \boxed{3/4}", "0.75") == {
        "score": 1.0,
        "acc": 1.0,
        "pred": "3/4",
    }
    wrong = math_score("math", r"\boxed{5}", "6", format_score=0.1)
    assert wrong == {"score": 0.1, "acc": 0.0, "pred": "5"}
    assert math_score("math", "It is 6", "6")["score"] == 0.0
    assert math_score("math", "It is 6", "6", last_number_fallback=True)["score"] == 1.0
    gsm = REWARDS.get("gsm8k")
    assert gsm("openai/gsm8k", "So 1,200 total.\n#### 1,200", "1200")["score"] == 1.0
    assert gsm("openai/gsm8k", "The total is 1200 dollars.", "1200")["score"] == 1.0


def test_format_reward():
    good = "<think>add them</think>\n<answer>5</answer>"
    assert format_score("x", good) == 1.0
    assert format_score("x", "<answer>5</answer>") == 0.0
    assert format_score("x", good + " trailing text") == 0.0
    assert format_score("x", "Answer: 5", pattern=r"Answer: \d+", score=0.5) == 0.5


def test_safe_eval_allows_only_integer_arithmetic():
    assert safe_eval("(25 - 5) * 3 / 4") == (Fraction(15), [25, 5, 3, 4])
    assert safe_eval("-(3 - 10)") == (Fraction(7), [3, 10])
    for bad in [
        "__import__('os')",
        "2 ** 10",
        "1.5 + 2",
        "a + 1",
        "3 / (2 - 2)",
        "[1]",
        "1;2",
        "9" * 300,
    ]:
        with pytest.raises(ValueError):
            safe_eval(bad)


def test_countdown_scoring():
    truth = {"target": 24, "numbers": [4, 6, 1]}
    assert countdown_score("countdown", r"\boxed{4 * 6 * 1}", truth)["score"] == 1.0
    assert (
        countdown_score("countdown", "<answer>(6 \\times 4) / 1 = 24</answer>", truth)["acc"] == 1.0
    )
    assert countdown_score("countdown", r"\boxed{4 * 6}", truth)["score"] == 0.0  # 1 unused
    assert (
        countdown_score("countdown", r"\boxed{4 * 6}", truth, use_all_numbers=False)["score"] == 1.0
    )
    assert (
        countdown_score("countdown", r"\boxed{4 * 6 * 1 * 1}", truth, use_all_numbers=False)[
            "score"
        ]
        == 0.0
    )  # 1 used twice
    assert (
        countdown_score("countdown", r"\boxed{4 + 6 + 1}", truth, format_score=0.1)["score"] == 0.1
    )
    assert countdown_score("countdown", r"\boxed{open('x')}", truth)["score"] == 0.0
    assert (
        countdown_score("countdown", "no answer", '{"target": 24, "numbers": [4, 6, 1]}')["pred"]
        is None
    )
    with pytest.raises(ValueError, match="countdown ground_truth must be"):
        countdown_score("countdown", "x", {"numbers": [1]})


def test_builtin_rewards_and_dispatch_by_data_source():
    assert {"math", "gsm8k", "arithmetic", "countdown", "format"} <= set(REWARDS.names())
    assert reward_for_data_source("lighteval/MATH") is REWARDS.get("math")
    assert default_compute_score("arithmetic", r"\boxed{12}", "12")["score"] == 1.0
    assert default_compute_score("openai/gsm8k", "#### 3", "3")["score"] == 1.0
    with pytest.raises(
        ValueError, match=r"no reward function for data_source 'countdwn'.*did you mean 'countdown'"
    ):
        default_compute_score("countdwn", "x", "1")


def test_user_reward_function_from_a_file(tmp_path):
    path = tmp_path / "my_reward.py"
    path.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
        "    return float(solution_str.strip() == ground_truth) + bonus\n"
        "def other(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return {'score': 0.5, 'note': data_source}\n"
    )
    fn = load_reward_function(path)
    assert fn("d", " yes ", "yes", {}) == 1.0
    assert load_reward_function(path, kwargs={"bonus": 0.5})("d", "no", "yes", {}) == 0.5
    assert load_reward_function(str(path), "other")("d", "", "", None) == {
        "score": 0.5,
        "note": "d",
    }
    restored = pickle.loads(pickle.dumps(fn))  # travels to worker processes as path + name
    assert restored("d", "yes", "yes", None) == 1.0
    with pytest.raises(
        ConfigError,
        match=r"reward.function_name: invalid value 'compute_scor'.*did you mean 'compute_score'",
    ):
        load_reward_function(path, "compute_scor")
    with pytest.raises(
        ConfigError,
        match=r"reward\.function_path: invalid value .*; expected an existing Python file$",
    ):
        load_reward_function(tmp_path / "missing.py")
