"""A user reward function in the verl signature, loaded with reward.function_path.

Full credit for the right answer in \\boxed{}; a small credit for a boxed answer that is
wrong, so a model that has not yet learned the answer format gets a gradient toward it.
"""

from rl_algos.rewards.math_answer import compute_score as math_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return math_score(
        data_source, solution_str, ground_truth, extra_info, methods=("boxed",), format_score=0.1
    )
