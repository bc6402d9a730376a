"""A reward that spreads the scores of an untrained model (verl's signature): responses of
the tiny random model on the arithmetic task almost never score under the task's own
reward, which would give all-zero advantages and hide what an estimator or loss does."""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if not solution_str:
        return 0.0
    return (sum(map(ord, solution_str)) % 5) / 4.0
