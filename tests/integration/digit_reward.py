"""A reward the tiny random model can learn within a few steps (verl's signature).

The score is the fraction of the response's characters that occur in the ground truth
(a string of target characters, e.g. the ten digits): an untrained character-level model
emits about one in ten, a trained one more.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not solution_str:
        return 0.0
    return sum(ch in ground_truth for ch in solution_str) / len(solution_str)


def starts_with_target(data_source, solution_str, ground_truth, extra_info=None):
    """1 when the response starts with a target character, else 0 (a sparse reward:
    most groups of an untrained model score all 0, which DAPO's dynamic sampling drops)."""
    return float(bool(solution_str) and solution_str[0] in ground_truth)
