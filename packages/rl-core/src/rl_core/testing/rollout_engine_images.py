"""Image cases of the rollout-engine conformance suite (vision-language models).

A rollout package whose engine accepts ``multi_modal_data={"image": [PIL images]}`` runs
them by subclassing::

    from rl_core.testing.rollout_engine_images import ImageRolloutEngineConformance

    class TestMyEngineImages(ImageRolloutEngineConformance):
        backend = "my-engine"

The suite saves a tiny random Qwen2.5-VL (or Qwen2-VL: ``model_arch = "qwen2_vl"``) with a
Qwen2-VL image processor, and checks: log-probs of image requests against a separate
float64 Hugging Face forward (which derives the multimodal rotary positions itself),
several images and left-padding in concurrent batches, that the image changes the output,
text-only requests on the same model, and clear errors. Prompt ids follow the contract:
one image placeholder token per vision token (the processor-expanded ids). A vision model
never samples its image/video placeholder tokens (a generated one would be read as an image
slot by every later forward): log-probs are those of the distribution without them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch

from rl_core.rollout import SamplingParams
from rl_core.testing.rollout_engine import TINY_VOCAB, EngineUnderTest

__all__ = ["ImageRolloutEngineConformance", "save_tiny_vlm", "solid_image"]

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 500, 501, 502, 503
PATCH, MERGE = 14, 2


def save_tiny_vlm(path: str | Path, arch: str = "qwen2_5_vl", seed: int = 0) -> str:
    """Save a tiny random Qwen2(.5)-VL (vocab 512; text hidden 64, 2 layers; vision hidden
    32, 2 blocks) and its image processor (14-pixel patches, 2x2 merge); return the path."""
    import transformers

    text = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 6, 6]},
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    vision = dict(depth=2, num_heads=2, patch_size=PATCH, spatial_merge_size=MERGE,
                  temporal_patch_size=2, initializer_range=0.2)  # fmt: skip
    if arch == "qwen2_5_vl":
        vision.update(hidden_size=32, intermediate_size=64, out_hidden_size=64, window_size=56,
                      fullatt_block_indexes=[1])  # fmt: skip
        cls = transformers.Qwen2_5_VLConfig
    elif arch == "qwen2_vl":
        vision.update(embed_dim=32, hidden_size=64, mlp_ratio=2)
        cls = transformers.Qwen2VLConfig
    else:
        raise ValueError(f"arch={arch!r} is invalid: expected 'qwen2_5_vl' or 'qwen2_vl'")
    config = cls(
        text_config=text,
        vision_config=vision,
        image_token_id=IMAGE_TOKEN,
        video_token_id=VIDEO_TOKEN,
        vision_start_token_id=VISION_START,
        vision_end_token_id=VISION_END,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForImageTextToText.from_config(config)
    model.save_pretrained(str(path))
    processor = transformers.Qwen2VLImageProcessor(
        patch_size=PATCH, merge_size=MERGE, temporal_patch_size=2,
        min_pixels=28 * 28, max_pixels=112 * 112,
    )  # fmt: skip
    processor.save_pretrained(str(path))
    return str(path)


def solid_image(seed: int, width: int, height: int) -> Any:
    """A random-noise RGB PIL image of ``width`` x ``height`` (multiples of 28)."""
    from PIL import Image

    g = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=g, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), mode="RGB")


def image_tokens(width: int, height: int) -> int:
    return (width // PATCH) * (height // PATCH) // MERGE**2


class ImageRolloutEngineConformance(EngineUnderTest):
    """Subclass with ``backend = "<name>"`` (a class named ``Test...``)."""

    model_arch: ClassVar[str] = "qwen2_5_vl"
    save_model = staticmethod(save_tiny_vlm)

    @pytest.fixture(scope="class")
    @classmethod
    def reference(cls, model_path):
        import transformers

        model = transformers.AutoModelForImageTextToText.from_pretrained(model_path)
        processor = transformers.AutoImageProcessor.from_pretrained(model_path)
        return model.double().eval(), processor

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def prompt(seed: int, sizes: list[tuple[int, int]], text: int = 5) -> list[int]:
        """Random text ids around one vision block per image (expanded placeholders)."""
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(3, IMAGE_TOKEN, (text,), generator=g).tolist()
        for width, height in sizes:
            ids += [VISION_START] + [IMAGE_TOKEN] * image_tokens(width, height) + [VISION_END]
            ids += torch.randint(3, IMAGE_TOKEN, (3,), generator=g).tolist()
        return ids

    def run(self, runner, coro):
        return runner.run(coro, self.request_timeout)

    @staticmethod
    def reference_log_probs(reference, prompt, images, tokens, temperature) -> torch.Tensor:
        """Float64 forward of prompt+tokens with the images (HF derives the positions);
        log-probs of the distribution without the placeholder tokens."""
        model, processor = reference
        ids = torch.tensor([prompt + tokens[:-1]])
        kwargs: dict[str, Any] = {}
        if images:
            vision = processor(images=images, return_tensors="pt")
            kwargs = {
                "pixel_values": vision["pixel_values"].double(),
                "image_grid_thw": vision["image_grid_thw"],
                "mm_token_type_ids": (ids == IMAGE_TOKEN).int(),
            }
        with torch.no_grad():
            logits = model(input_ids=ids, **kwargs).logits[0, len(prompt) - 1 :].double()
        logits[:, [IMAGE_TOKEN, VIDEO_TOKEN]] = float("-inf")
        rows = (logits / temperature if temperature > 0 else logits).log_softmax(-1)
        return rows.gather(-1, torch.tensor(tokens)[:, None]).squeeze(-1)

    # ------------------------------------------------------------------ cases
    def test_image_log_probs_match_reference_forward(self, engine, runner, reference):
        cases = [
            ([(56, 56)], 4, 1.0),
            ([(84, 56)], 9, 0.7),
            ([(56, 56), (56, 84)], 2, 1.0),  # two images in one prompt
            ([(112, 56)], 13, 1.3),
        ]
        requests = []
        for i, (sizes, text, temperature) in enumerate(cases):
            images = [solid_image(10 * i + j, w, h) for j, (w, h) in enumerate(sizes)]
            prompt = self.prompt(i, sizes, text)
            params = SamplingParams(temperature=temperature, max_tokens=12, seed=i)
            requests.append((prompt, images, params))

        async def all_at_once():  # one left-padded batch of different lengths and images
            import asyncio

            return await asyncio.gather(
                *(
                    engine.generate(p, sp, f"img-lp-{i}", {"image": imgs})
                    for i, (p, imgs, sp) in enumerate(requests)
                )
            )

        outs = self.run(runner, all_at_once())
        for (prompt, images, params), (out,) in zip(requests, outs):
            assert len(out.token_ids) == 12 and out.finish_reason == "length"
            ref = self.reference_log_probs(
                reference, prompt, images, out.token_ids, params.temperature
            )
            got = torch.tensor(out.log_probs, dtype=torch.float64)
            torch.testing.assert_close(got, ref, atol=self.logprob_atol, rtol=0)

    def test_the_image_changes_the_output(self, engine, runner, reference):
        prompt = self.prompt(7, [(56, 56)])
        params = SamplingParams(temperature=0.0, max_tokens=8)
        log_probs = []
        for seed in (1, 2):
            image = solid_image(seed, 56, 56)
            (out,) = self.run(
                runner, engine.generate(prompt, params, f"img-{seed}", {"image": [image]})
            )
            first = self.reference_log_probs(reference, prompt, [image], out.token_ids[:1], 1.0)
            log_probs.append(float(first[0]))
        assert abs(log_probs[0] - log_probs[1]) > 1e-6

    def test_text_only_request_on_a_vision_model(self, engine, runner, reference):
        prompt = self.prompt(8, [], text=9)
        params = SamplingParams(temperature=1.0, max_tokens=10, seed=5)
        (out,) = self.run(runner, engine.generate(prompt, params, "img-text-only"))
        ref = self.reference_log_probs(reference, prompt, [], out.token_ids, 1.0)
        torch.testing.assert_close(
            torch.tensor(out.log_probs, dtype=torch.float64), ref, atol=self.logprob_atol, rtol=0
        )

    def test_placeholder_tokens_are_never_sampled(self, engine, runner, reference):
        model, _ = reference
        prompt, image = self.prompt(11, [(56, 56)]), solid_image(5, 56, 56)
        greedy = SamplingParams(temperature=0.0, max_tokens=1)
        (first,) = self.run(runner, engine.generate(prompt, greedy, "img-g", {"image": [image]}))
        original = model.lm_head.weight.detach().float().clone()
        boosted = original.clone()  # placeholder logits = 10x the greedy token's logit
        boosted[[IMAGE_TOKEN, VIDEO_TOKEN]] = 10 * original[first.token_ids[0]]
        self.run(runner, engine.update_weights([("lm_head.weight", boosted)]))
        try:
            params = SamplingParams(temperature=1.0, max_tokens=20, seed=4, n=4)
            outs = self.run(
                runner, engine.generate(prompt, params, "img-no-pad", {"image": [image]})
            )
        finally:
            self.run(runner, engine.update_weights([("lm_head.weight", original)]))
        assert all(len(o.token_ids) == 20 for o in outs)
        assert all(IMAGE_TOKEN not in o.token_ids and VIDEO_TOKEN not in o.token_ids for o in outs)

    def test_image_token_count_mismatch_is_rejected(self, engine, runner):
        prompt = self.prompt(9, [(56, 56)])  # placeholders for one 56x56 image (4 tokens)
        image = solid_image(3, 112, 112)  # needs 16
        with pytest.raises(ValueError, match="image"):
            self.run(
                runner,
                engine.generate(
                    prompt, SamplingParams(max_tokens=2), "img-bad", {"image": [image]}
                ),
            )
        with pytest.raises(ValueError, match="multi_modal_data"):  # placeholders, no images
            self.run(runner, engine.generate(prompt, SamplingParams(max_tokens=2), "img-none"))
