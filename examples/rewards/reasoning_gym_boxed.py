"""reasoning-gym's reward without the half credit for an unboxed answer (reward.function_path).

`rl_algos.rewards.reasoning_gym` pays a right answer in another form half; a small model
that copies a demo's box then learns to stop boxing (val/strict fell 0.104 -> 0.057 while
val/accuracy rose 0.10 -> 0.26 in the mix example with it). Here the score is ``strict``
(1.0 for the right answer in \\boxed{}, else 0); ``acc``, ``strict`` and ``any_score`` are
reported as before.
"""

from rl_algos.rewards.reasoning_gym import compute_score as reasoning_gym_score


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    out = reasoning_gym_score(data_source, solution_str, ground_truth, extra_info)
    return {**out, "score": out["strict"]}
