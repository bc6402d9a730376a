"""The rollout manager forwards each row's images to the engine: the log-probs it returns
are those of a float64 Hugging Face forward with those images, not with other ones."""

from __future__ import annotations

import numpy as np
import torch
from transformers import AutoModelForImageTextToText, AutoTokenizer
from vlm_cases import shapes_rows

from rl_algos.data import collate_prompts
from rl_core.rollout import RolloutConfig
from rl_multimodal.vlm import VLMPromptDataset
from rl_rollout.agent_loop.base import AgentLoopConfig
from rl_rollout.manager import RolloutManager, RolloutManagerConfig


def _reference(model, prompt, tokens, mm) -> torch.Tensor:
    ids = torch.tensor([prompt + tokens[:-1]])
    with torch.no_grad():
        logits = model(
            input_ids=ids,
            pixel_values=mm["pixel_values"].double(),
            image_grid_thw=mm["image_grid_thw"],
            mm_token_type_ids=(ids == model.config.image_token_id).int(),
        ).logits[0, len(prompt) - 1 :]
    logits[:, [model.config.image_token_id, model.config.video_token_id]] = float("-inf")
    return logits.log_softmax(-1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def test_manager_generates_with_each_rows_images(vlm_dirs):
    path = vlm_dirs["qwen2_5_vl"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    dataset = VLMPromptDataset(shapes_rows(4, seed=3), tokenizer, 256)
    batch = collate_prompts([dataset[i] for i in range(4)], dataset.pad_token_id)
    batch.non_tensor_batch["seed"] = np.array([11, 12, 13, 14], dtype=object)
    batch.meta_info.update(temperature=1.0)
    config = RolloutManagerConfig(
        rollout=RolloutConfig(model_path=path),
        loop=AgentLoopConfig(response_length=5),
        placement="colocated",
    )
    with RolloutManager(config, tokenizer=tokenizer) as manager:
        out = manager.generate_sequences(batch)
    model = AutoModelForImageTextToText.from_pretrained(path).double().eval()
    mm = batch.non_tensor_batch["multi_modal_inputs"]
    assert out.non_tensor_batch["multi_modal_inputs"][0] is mm[0]  # kept, not copied
    for i in range(4):
        n = int(out.batch["response_mask"][i].sum())
        tokens = out.batch["responses"][i, :n].tolist()
        got = out.batch["rollout_log_probs"][i, :n].double()
        torch.testing.assert_close(
            got, _reference(model, dataset[i]["raw_prompt_ids"], tokens, mm[i]), atol=1e-4, rtol=0
        )
        other = _reference(model, dataset[i]["raw_prompt_ids"], tokens, mm[(i + 1) % 4])
        assert (other - got).abs().max() > 1e-4  # another image gives other numbers
