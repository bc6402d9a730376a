"""Test helpers: VLM RL batches built through the real data path (shapes rows ->
VLMPromptDataset -> collate_prompts)."""

from __future__ import annotations

import random

import torch


def shapes_rows(count: int, seed: int = 0) -> list[dict]:
    from rl_multimodal.vlm import ShapesTask

    task, rng = ShapesTask(), random.Random(seed)
    return [task.sample(rng)[1] for _ in range(count)]


def vlm_rl_batch(model_dir: str, num_seqs: int, response_len: int, seed: int = 0):
    """Prompts with images (left-padded) + random right-padded responses, the RL layout."""
    from transformers import AutoTokenizer

    from rl_algos.data import collate_prompts
    from rl_core.protocol import DataProto
    from rl_multimodal.vlm import VLMPromptDataset

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    dataset = VLMPromptDataset(shapes_rows(num_seqs, seed), tokenizer, 256)
    prompts = collate_prompts([dataset[i] for i in range(num_seqs)], dataset.pad_token_id)
    g = torch.Generator().manual_seed(seed)
    responses = torch.randint(3, 90, (num_seqs, response_len), generator=g)  # plain characters
    lengths = torch.randint(1, response_len + 1, (num_seqs,), generator=g)
    response_mask = (torch.arange(response_len)[None] < lengths[:, None]).long()
    responses = responses * response_mask + dataset.pad_token_id * (1 - response_mask)
    attention_mask = torch.cat([prompts.batch["attention_mask"], response_mask], dim=1)
    tensors = {
        "prompts": prompts.batch["input_ids"],
        "responses": responses,
        "input_ids": torch.cat([prompts.batch["input_ids"], responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "response_mask": response_mask,
        "advantages": torch.randn(num_seqs, response_len, generator=g) * response_mask,
    }
    return DataProto.from_dict(
        tensors, dict(prompts.non_tensor_batch), meta_info={"temperature": 1.0}
    )
