"""A reward function that misbehaves by prompt (``extra_info["index"] % 8``), for the
fault-injection suite: each prompt's samples hang, raise, return NaN, 1e301 or a wrong
type, or kill the scoring worker process that runs them."""

import os
import signal
import time

BEHAVIOUR = {1: "hang", 2: "raise", 3: "nan", 4: "huge", 5: "wrong type", 6: "kill worker"}


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    what = BEHAVIOUR.get(int(extra_info["index"]) % 8, "ok")
    if what == "hang":
        time.sleep(3600)
    if what == "raise":
        raise RuntimeError("the reward function broke")
    if what == "nan":
        return float("nan")
    if what == "huge":
        return 1e301
    if what == "wrong type":
        return ["not", "a", "score"]
    if what == "kill worker":
        os.kill(os.getpid(), signal.SIGKILL)
    return 0.5
