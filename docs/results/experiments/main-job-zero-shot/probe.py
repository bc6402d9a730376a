"""Base SmolLM2 probe (issue #32 experiments): greedy accuracy of plain questions at several response lengths and prompts."""

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
model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
torch.set_num_threads(2)
plain = ArithmeticTask(
    digits=(1, 2), max_multiplier=9, nonnegative=False, phrasings="held_out", instruction_share=0.0
)
rng = random.Random(11)
probs = []
for _i in range(60):
    expr, q, ans = plain._draw(rng)
    probs.append((q, ans))


def last_int(t):
    m = re.findall(r"\\boxed\{(-?\d+)\}", t)
    if m:
        return m[-1], True
    n = re.findall(r"-?\d+", t.replace(",", ""))
    return (n[-1] if n else None), False


def run(name, make, max_new):
    msgs = [make(q) for q, _ in probs]
    texts = [tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True) for m in msgs]
    t0 = time.time()
    right = boxed = 0
    outs = []
    for i in range(0, len(texts), 30):
        enc = tok(texts[i : i + 30], return_tensors="pt", padding=True)
        with torch.no_grad():
            out = model.generate(
                **enc, max_new_tokens=max_new, do_sample=False, pad_token_id=tok.pad_token_id
            )
        outs += tok.batch_decode(out[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
    for (_q, a), o in zip(probs, outs):
        v, b = last_int(o)
        ok = v == a
        right += ok
        boxed += ok and b
    print(
        f"{name:40s} acc {right / len(probs):.3f} boxed-of-right {boxed / max(right, 1):.2f} {time.time() - t0:.0f}s | {outs[0][:80]!r} | {outs[1][:80]!r}",
        flush=True,
    )


INS = " Put the final answer in \\boxed{}, e.g. \\boxed{7}."
run("plain 24", lambda q: [{"role": "user", "content": q}], 24)
run("plain 64", lambda q: [{"role": "user", "content": q}], 64)
run("plain+instr 48", lambda q: [{"role": "user", "content": q + INS}], 48)
run(
    "sys answer-only 32",
    lambda q: [
        {
            "role": "system",
            "content": "You are a calculator. Reply with only the final answer in \\boxed{}, for example \\boxed{42}.",
        },
        {"role": "user", "content": q},
    ],
    32,
)
