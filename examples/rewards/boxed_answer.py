"""A user reward function in the verl signature, loaded with reward.function_path.

1.0 for the right answer in \\boxed{} (the format the prompt asks for); 0.5 for the right
answer given any other way (as the last number of the reply); 0 otherwise. A boxed but
wrong answer earns nothing, so copying the prompt's example ("e.g. \\boxed{7}") does not
pay: a first version that gave format credit was gamed exactly that way within 5 steps.

``acc`` (the trainer's ``val/accuracy``) is whether the answer is right, in any format;
``boxed`` (``val/boxed``) whether it is right and boxed.
"""

from rl_algos.rewards.math_answer import compute_score as math_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    boxed = math_score(data_source, solution_str, ground_truth, extra_info, methods=("boxed",))
    if boxed["acc"]:
        return {"score": 1.0, "acc": 1.0, "boxed": 1.0}
    anywhere = math_score(
        data_source, solution_str, ground_truth, extra_info, methods=(), last_number_fallback=True
    )
    right = bool(anywhere["acc"])
    return {"score": 0.5 if right else 0.0, "acc": float(right), "boxed": 0.0}
