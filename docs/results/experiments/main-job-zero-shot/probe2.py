"""Base SmolLM2 probe (issue #32 experiments): sampled accuracy, boxing and pass@k of training-style prompts."""

import glob
import os
import random
import re
import time

import torch
import transformers

from rl_algos.data.tasks import ArithmeticTask

path = sorted(
    glob.glob(os.path.expanduser("~/.cache/rl/models/SmolLM2-135M-Instruct*")), key=os.path.getmtime
)[-1]
tok = transformers.AutoTokenizer.from_pretrained(path)
tok.padding_side = "left"
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
torch.set_num_threads(2)


def last_int(t):
    m = re.findall(r"\\boxed\{(-?\d+)\}", t)
    if m:
        return m[-1], True
    n = re.findall(r"-?\d+", t.replace(",", ""))
    return (n[-1] if n else None), False


def run(name, task, temp, max_new, k=4, n=40, system=None):
    rng = random.Random(5)
    probs = [task._draw(rng)[1:] for _ in range(n)]
    msgs = [
        ([{"role": "system", "content": system}] if system else [])
        + [{"role": "user", "content": q}]
        for q, _ in probs
    ]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    t0 = time.time()
    right = boxed = 0
    tot = 0
    solved = 0
    torch.manual_seed(0)
    for i in range(0, len(texts), 20):
        enc = tok(texts[i : i + 20], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **enc,
                max_new_tokens=max_new,
                do_sample=temp > 0,
                temperature=temp if temp > 0 else None,
                top_p=None,
                top_k=None,
                num_return_sequences=k,
                pad_token_id=tok.pad_token_id,
            )
        outs = tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        for j, (_q, a) in enumerate(probs[i : i + 20]):
            any_ok = False
            for o in outs[j * k : (j + 1) * k]:
                v, b = last_int(o)
                ok = v == a
                right += ok
                boxed += ok and b
                tot += 1
                any_ok |= ok
            solved += any_ok
    print(
        f"{name:34s} T{temp} acc {right / tot:.3f} boxed {boxed / tot:.3f} pass@{k} {solved / n:.2f} {time.time() - t0:.0f}s | {outs[0][:70]!r}",
        flush=True,
    )


def mk(share, **kw):
    return ArithmeticTask(
        digits=(1, 2),
        max_multiplier=9,
        nonnegative=False,
        phrasings="varied",
        instruction_share=share,
        **kw,
    )


run("varied instr0.5", mk(0.5), 1.0, 48)
run("varied instr0.5", mk(0.5), 0.7, 48)
run("varied instr1.0", mk(1.0), 0.7, 48)
run("varied instr1 sys-brief", mk(1.0), 0.7, 48, system="You are a calculator. Answer briefly.")
run(
    "plain heldout T0.7",
    ArithmeticTask(
        digits=(1, 2),
        max_multiplier=9,
        nonnegative=False,
        phrasings="held_out",
        instruction_share=0.0,
    ),
    0.7,
    48,
    k=8,
)
