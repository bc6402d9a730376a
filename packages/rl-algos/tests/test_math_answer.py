"""Math answers: plain arithmetic graded exactly (the held-out evaluation's answers),
symbolic equivalence through math-verify, and adversarial answers that must neither hang
nor crash."""

from __future__ import annotations

import re
import threading
import time

import pytest

from rl_algos.rewards import REWARDS, math_answer
from rl_algos.rewards.math_answer import answers_equal, parse_number, symbolically_equal
from rl_algos.rewards.math_answer import compute_score as math_score


# sums, negative differences, small products, written the ways models write them
@pytest.mark.parametrize(
    ("solution", "truth", "acc"),
    [
        (r"\boxed{-12}", "-12", 1.0),
        (r"3 - 15 = \boxed{-12}", -12, 1.0),  # an int ground truth
        (r"\boxed{-7}", "-7", 1.0),
        (r"\boxed{1,234}", "1234", 1.0),
        (r"\boxed{1234}", "1,234", 1.0),
        (r"\boxed{12.0}", "12", 1.0),
        (r"\boxed{12.00}", 12, 1.0),
        (r"\boxed{56}", "56", 1.0),
        (r"\boxed{ -12 }", "-12", 1.0),
        (r"\boxed{\$1,234}", "1234", 1.0),
        (r"\boxed{7}", "-7", 0.0),  # the sign matters
        (r"\boxed{-12}", "12", 0.0),
        (r"\boxed{1,235}", "1234", 0.0),
        (r"\boxed{12.5}", "12", 0.0),
        (r"\boxed{1,2}", "12", 0.0),  # not a thousands separator
        ("-12", "-12", 0.0),  # no boxed answer: the boxed contract gives nothing
    ],
)
def test_plain_arithmetic_is_graded_exactly(solution, truth, acc):
    assert REWARDS.get("arithmetic")("arithmetic", solution, truth)["acc"] == acc


@pytest.mark.parametrize(
    ("solution", "truth"),
    [("-12", "-12"), ("So 3 - 15 = -12.", "-12"), ("1,234", "1234"), ("12.0", "12")],
)
def test_bare_numbers_count_with_the_last_number_fallback(solution, truth):
    assert math_score("arithmetic", solution, truth, last_number_fallback=True)["acc"] == 1.0
    assert REWARDS.get("gsm8k")("openai/gsm8k", solution, truth)["acc"] == 1.0


@pytest.mark.parametrize(
    ("pred", "truth", "equal"),
    [
        (r"\sqrt{4}", "2", True),
        (r"\frac{\sqrt2}{2}", r"\sqrt{2}/2", True),
        ("x+1", "1+x", True),
        (r"\{1,2\}", r"\{2,1\}", True),
        (r"2\pi", r"\pi \cdot 2", True),
        (r"\sqrt{5}", "2", False),
        ("2, 3", "2", False),  # two answers are not the answer
        (r"2 \text{ or } 3", "2", False),
        ("x+2", "1+x", False),
    ],
)
def test_symbolic_equivalence_through_math_verify(pred, truth, equal):
    assert answers_equal(pred, truth) is equal


def test_symbolic_check_works_outside_the_main_thread():
    """math-verify's own time-out uses SIGALRM (main thread only); elsewhere it is off."""
    out = []
    thread = threading.Thread(target=lambda: out.append(symbolically_equal(r"\sqrt{4}", "2")))
    thread.start()
    thread.join(60)
    assert out == [True]


ADVERSARIAL = [
    r"\boxed{1e99999999}",
    r"\boxed{-1e-99999999}",
    r"\boxed{1" + "0" * 6000 + "}",  # more digits than int() converts
    r"\boxed{10^{10^{10^{10}}}}",
    r"\boxed{9^9^9^9}",
    r"\boxed{2^{99999999}}",
    r"\boxed{2**99999999}",
    r"\boxed{99999!}",
    r"\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}",
    r"\boxed{" + r"\frac{" * 300 + "1" + "}{2}" * 300 + "}",
    r"\boxed{" + "(" * 2000 + "1" + ")" * 2000 + "}",
    r"\boxed{" + "1+" * 20000 + "1}",
    r"\boxed{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{\sqrt{2}}}}}}}}}}}}}}",
    "\\boxed{" * 3000,
]


@pytest.mark.parametrize("solution", ADVERSARIAL, ids=lambda s: s[:24])
def test_adversarial_answers_neither_hang_nor_crash(solution):
    symbolically_equal(r"\sqrt{4}", "2")  # math-verify imported before the clock starts
    start = time.monotonic()
    result = math_score("math", solution, "1")
    assert result["acc"] == 0.0
    assert time.monotonic() - start < 1.0


def test_huge_but_exact_numbers_still_compare():
    assert parse_number("1e400") == 10**400
    assert answers_equal("1e400", "1e400") and not answers_equal("1e400", "2e400")
    assert parse_number("1e401") is None  # past MAX_EXPONENT: not built
    assert answers_equal("1e300", "1" + "0" * 300)


def test_math_verify_time_out_bounds_an_expensive_answer(monkeypatch):
    """With the input screen off, sympy would compute 9**999999999: math-verify's alarm
    (SYMBOLIC_TIMEOUT_S, main thread) stops it."""
    symbolically_equal(r"\sqrt{4}", "2")
    monkeypatch.setattr(math_answer, "_EXPLOSIVE", re.compile(r"(?!)"))
    monkeypatch.setattr(math_answer, "SYMBOLIC_TIMEOUT_S", 1)
    start = time.monotonic()
    assert symbolically_equal("9^{999999999}", "1") is False
    assert time.monotonic() - start < 8  # parse, parse and verify: 1 s each at most
