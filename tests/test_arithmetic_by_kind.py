"""examples/arithmetic_by_kind.py: the kinds it reports and its table's arithmetic."""

import importlib.util
import random
from pathlib import Path

import pytest

from rl_algos.data.tasks import ArithmeticTask

_SCRIPT = Path(__file__).parents[1] / "examples" / "arithmetic_by_kind.py"


@pytest.fixture(scope="module")
def by_kind():
    spec = importlib.util.spec_from_file_location("arithmetic_by_kind", _SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(expression: str, question: str) -> dict:
    return {
        "extra_info": {"expression": expression},
        "prompt": [{"role": "user", "content": f"{question} Put the final answer in \\boxed{{}}."}],
    }


@pytest.mark.parametrize(
    ("expression", "question", "kind"),
    [
        ("7 + 91", "Calculate 7 + 91.", ("+", "a + cd", "symbolic")),
        ("56 - 2", "What is the difference 56 - 2?", ("-", "ab - c", "symbolic")),
        ("34 * 7", "34 \u00d7 7 = ?", ("*", "ab * c", "symbolic")),
        ("34 * 7", "Evaluate: 34 x 7", ("*", "ab * c", "symbolic")),
        (
            "8 + 4",
            "If you have 8 apples and get 4 more, how many apples do you have?",
            ("+", "a + c", "worded"),
        ),
        ("88 - 8", "Subtract 8 from 88.", ("-", "ab - c", "worded")),
        ("12 * 3", "What is the product of 12 and 3?", ("*", "ab * c", "worded")),
        ("123 + 4", "What is 123 plus 4?", ("+", "3 digits + c", "worded")),
    ],
)
def test_kind_of(by_kind, expression, question, kind):
    # "\boxed{}" holds an "x": the phrasing must not be read from single characters
    assert by_kind.kind_of(_row(expression, question)) == kind


@pytest.mark.parametrize("expression", [None, "7 + 91 - 3", 42])
def test_a_row_that_is_not_a_two_operand_problem_is_refused(by_kind, expression):
    row = _row("7 + 91", "Calculate 7 + 91.")
    row["extra_info"]["expression"] = expression
    with pytest.raises(ValueError, match=r"extra_info.expression=.*expected a two-operand"):
        by_kind.kind_of(row)


def test_every_generated_row_gets_a_kind(by_kind):
    task = ArithmeticTask(
        digits=[1, 2],
        max_multiplier=9,
        nonnegative=True,
        phrasings="varied",
        ops=["+", "-", "*"],
        answer_format="boxed",
        few_shot=3,
    )
    rng = random.Random(0)
    kinds = [by_kind.kind_of(task.sample(rng)[1]) for _ in range(300)]
    assert {k[0] for k in kinds} == {"+", "-", "*"}
    assert {k[2] for k in kinds} == {"worded", "symbolic"}
    # a product always has a one-digit factor (max_multiplier 9)
    assert {k[1] for k in kinds if k[0] == "*"} <= {"a * c", "ab * c"}


def test_table_counts_and_rates(by_kind):
    results = [
        {"kind": ("+", "a + c", "worded"), "acc": 1.0, "boxed": 1.0},
        {"kind": ("+", "ab + cd", "symbolic"), "acc": 1.0, "boxed": 0.0},
        {"kind": ("+", "ab + cd", "symbolic"), "acc": 0.0, "boxed": 0.0},
        {"kind": ("-", "ab - c", "symbolic"), "acc": 0.0, "boxed": 0.0},
    ]
    lines = by_kind.table(results).splitlines()[2:]
    rows = {line.split(" | ")[0][2:]: line for line in lines}
    assert list(rows) == ["all", "op +", "op -", "a + c", "ab + cd", "ab - c", "symbolic", "worded"]
    assert rows["all"] == "| all | 4 | 50.0% | 25.0% |"
    assert rows["op +"] == "| op + | 3 | 66.7% | 33.3% |"
    assert rows["ab + cd"] == "| ab + cd | 2 | 50.0% | 0.0% |"
    assert rows["symbolic"] == "| symbolic | 3 | 33.3% | 0.0% |"
    assert rows["worded"] == "| worded | 1 | 100.0% | 100.0% |"


def test_negative_results_get_a_row_of_their_own(by_kind):
    results = [
        {"kind": ("-", "a - cd", "worded"), "negative": True, "acc": 1.0, "boxed": 1.0},
        {"kind": ("-", "ab - cd", "symbolic"), "negative": True, "acc": 0.0, "boxed": 0.0},
        {"kind": ("-", "ab - cd", "symbolic"), "negative": False, "acc": 1.0, "boxed": 0.0},
    ]
    lines = by_kind.table(results).splitlines()[2:]
    rows = {line.split(" | ")[0][2:]: line for line in lines}
    assert list(rows) == [
        "all",
        "op -",
        "a - cd",
        "ab - cd",
        "negative results",
        "symbolic",
        "worded",
    ]
    assert rows["negative results"] == "| negative results | 2 | 50.0% | 50.0% |"
    row = {"reward_model": {"ground_truth": "-38"}}
    assert by_kind._negative(row) and not by_kind._negative({"reward_model": {"ground_truth": "5"}})
