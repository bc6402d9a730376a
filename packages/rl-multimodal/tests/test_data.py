"""VLM data: images from bytes/paths/dicts, `<image>` placeholders, processor outputs in the
batch without per-sample copies, and errors that name the row."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import AutoImageProcessor, AutoTokenizer
from vlm_cases import shapes_rows

from rl_algos.data import collate_prompts, write_rows
from rl_multimodal.vlm import ImageTextProcessor, VLMPromptDataset, load_image, load_processor


def _png(colour=(10, 200, 30), size=(56, 56)) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, format="PNG")
    return out.getvalue()


def test_load_image_from_every_supported_form(tmp_path):
    path = tmp_path / "a.png"
    path.write_bytes(_png())
    forms = [_png(), {"bytes": _png()}, {"path": str(path)}, str(path), Image.open(path)]
    for form in forms:
        image = load_image(form, "row 0")
        assert image.mode == "RGB" and image.size == (56, 56)
        assert image.getpixel((3, 3)) == (10, 200, 30)


@pytest.mark.parametrize(
    "value, match",
    [("/nonexistent/x.png", "No such file"), (b"not an image", "cannot be read"), (3, "got int")],
)
def test_unreadable_images_name_the_row(vlm_dirs, value, match):
    tokenizer = AutoTokenizer.from_pretrained(vlm_dirs["qwen2_5_vl"])
    rows = shapes_rows(3)
    rows[2]["images"] = [value]
    with pytest.raises(ValueError, match=rf"train row 2, images\[0\]: .*{match}"):
        VLMPromptDataset(rows, tokenizer, 256, name="train")


def test_placeholder_count_must_match_the_images(vlm_dirs):
    tokenizer = AutoTokenizer.from_pretrained(vlm_dirs["qwen2_5_vl"])
    rows = shapes_rows(2)
    rows[1]["images"] = rows[1]["images"] * 2
    with pytest.raises(ValueError, match=r"row 1: 2 image\(s\) in 'images' but 1 '<image>'"):
        VLMPromptDataset(rows, tokenizer, 256)


def test_processor_expands_one_token_per_merged_patch(vlm_dirs):
    path = vlm_dirs["qwen2_5_vl"]
    processor = load_processor(path)
    image_id = AutoTokenizer.from_pretrained(path).convert_tokens_to_ids("<|image_pad|>")
    images = [Image.new("RGB", (56, 56)), Image.new("RGB", (112, 56))]
    text = (
        "a<|vision_start|><|image_pad|><|vision_end|>b<|vision_start|><|image_pad|><|vision_end|>"
    )
    out = processor(text=[text], images=images, return_tensors="pt")
    # 56x56 -> 4x4 patches of 14 -> 2x2 merged tokens; 112x56 -> 4x8 patches -> 8 tokens
    assert out["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 8]]
    assert int((out["input_ids"] == image_id).sum()) == 4 + 8
    assert out["pixel_values"].shape == (16 + 32, 3 * 2 * 14 * 14)
    # the fallback processor gives what the image processor alone gives
    if isinstance(processor, ImageTextProcessor):
        ref = AutoImageProcessor.from_pretrained(path)(images=images, return_tensors="pt")
        torch.testing.assert_close(out["pixel_values"], ref["pixel_values"])


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_dataset_from_files_and_batch_layout(vlm_dirs, tmp_path, fmt):
    tokenizer = AutoTokenizer.from_pretrained(vlm_dirs["qwen2_5_vl"])
    rows = shapes_rows(4)
    if fmt == "jsonl":  # JSON holds no bytes: images as paths
        for i, row in enumerate(rows):
            image = tmp_path / f"{i}.png"
            image.write_bytes(row["images"][0]["bytes"])
            row["images"] = [str(image)]
    path = write_rows(rows, tmp_path / f"train.{fmt}")
    dataset = VLMPromptDataset(str(path), tokenizer, 256)
    image_id = tokenizer.convert_tokens_to_ids("<|image_pad|>")
    item = dataset[0]
    assert item["multi_modal_inputs"]["image_grid_thw"].tolist() == [[1, 4, 4]]
    assert item["raw_prompt_ids"].count(image_id) == 4
    assert item["multi_modal_data"]["image"][0].size == (56, 56)
    assert "images" not in item
    batch = collate_prompts([dataset[i] for i in range(4)], dataset.pad_token_id)
    repeated = batch.repeat(3, interleave=True)
    mm = repeated.non_tensor_batch["multi_modal_inputs"]
    assert len(repeated) == 12 and mm.dtype == object
    # references, not copies: the three samples of a prompt share its pixel tensor
    assert (
        mm[0]["pixel_values"]
        is mm[2]["pixel_values"]
        is dataset[0]["multi_modal_inputs"]["pixel_values"]
    )
    assert mm[0]["pixel_values"] is not mm[3]["pixel_values"]
    json.dumps(repeated.non_tensor_batch["reward_model"].tolist())  # plain fields stay plain
    assert isinstance(repeated.non_tensor_batch["multi_modal_data"], np.ndarray)


def test_image_tokens_count_towards_max_prompt_length(vlm_dirs):
    tokenizer = AutoTokenizer.from_pretrained(vlm_dirs["qwen2_5_vl"])
    small = shapes_rows(1)[0]
    fits = len(VLMPromptDataset([small], tokenizer, 256)[0]["raw_prompt_ids"])
    # the same text with a 112x112 image: 8x8 patches, 16 merged tokens instead of 4
    large = {**small, "images": [{"bytes": _png(size=(112, 112))}]}
    with pytest.raises(ValueError, match=rf"data row 1: prompt has {fits + 12} tokens \(image "
                       rf"tokens included\) > data.max_prompt_length={fits} \(raise it"):  # fmt: skip
        VLMPromptDataset([small, large], tokenizer, fits)  # refused by default
    kept = VLMPromptDataset([small, large], tokenizer, fits, filter_overlong_prompts=True)
    assert len(kept) == 1 and kept.num_filtered == 1 and kept[0]["index"] == 0
