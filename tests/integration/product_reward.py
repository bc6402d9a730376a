"""Reward of the tool-use test (verl's signature): 1 when the exact product appears as a
number in the response, else 0.

The response is everything after the prompt: the policy's turns and the tool results the
agent loop inserted. The policy cannot multiply four-digit numbers itself; a Python tool
call that prints the product puts it there.
"""

import re


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return float(
        re.search(rf"(?<!\d){re.escape(str(ground_truth))}(?!\d)", solution_str) is not None
    )
