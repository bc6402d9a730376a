"""A VLA policy: a Hugging Face VLM reads the image and the instruction and emits an action.

Heads ``tokens`` (OpenVLA action tokens, log-probs ``[B, action_dim]``) or ``gaussian`` (an
MLP on the prompt's last hidden state, log-prob of the unclipped sample ``[B, 1]``), a value
head on the same state, the image adapter (``image_grid > 0``). Prompts are left-padded. What
each part does and why: the package README ("Design notes of the policy").
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from rl_algos.config.vla_section import IMAGE_MARKUP
from rl_algos.errors import InputError
from rl_core.env import ActionSpec, EnvObservation
from rl_multimodal.vla.action_tokenizer import ActionTokenizer

__all__ = [
    "PolicyInputs",
    "PolicyOutput",
    "VLAPolicy",
    "VLAPolicyConfig",
    "action_tokenizer_for",
    "check_policy_fits",
]

EXPORT_METADATA = "rl_model.json"  # written by `rl export` (rl_algos.export)
EXPORT_HEADS = "vla_heads.safetensors"
HEADS = ("tokens", "gaussian")


@dataclass(frozen=True)
class VLAPolicyConfig:
    head: str = "tokens"
    n_bins: int = 3
    hidden_mlp: int = 64
    init_log_std: float = -0.5
    image_grid: int = 0  # > 0: the image adapter over a pooled image_grid^2 grid (see above)
    freeze_vision: bool = False  # keep the vision tower's weights fixed (no grad)
    freeze_language_model: bool = False  # keep the LM and its head fixed (train the heads)
    prompt: str = "{instruction}:" + IMAGE_MARKUP  # image last: the heads read the token after it

    def __post_init__(self) -> None:
        if self.head not in HEADS:
            raise ValueError(f"vla.head is {self.head!r}, expected one of {HEADS}")
        if int(self.image_grid) < 0:
            raise ValueError(f"vla.image_grid is {self.image_grid}, expected >= 0 (0: off)")


@dataclass
class PolicyInputs:
    """Processed observations of one batch (CPU tensors; pixels per row kept separately)."""

    input_ids: torch.Tensor  # [B, L], left-padded
    attention_mask: torch.Tensor  # [B, L]
    pixel_values: list[torch.Tensor]  # per row: [patches, dim]
    image_grid_thw: torch.Tensor  # [B, 3]

    def to(self, device: Any, pixel_dtype: torch.dtype) -> PolicyInputs:
        """These inputs on `device`, the pixels in `pixel_dtype` (the vision tower's)."""
        return PolicyInputs(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            [px.to(device, pixel_dtype) for px in self.pixel_values],
            self.image_grid_thw.to(device),
        )


@dataclass
class PolicyOutput:
    env_actions: np.ndarray  # float32 [B, action_dim], inside the action bounds
    actions: torch.Tensor  # tokens: long [B, D] ids; gaussian: float [B, D] raw sample
    log_probs: torch.Tensor  # [B, D] (tokens) or [B, 1] (gaussian)
    values: torch.Tensor  # [B]


def action_tokenizer_for(
    tokenizer: Any, vocab_size: int, action_spec: ActionSpec, config: Any
) -> ActionTokenizer:
    """The OpenVLA tokenizer of ``config.n_bins`` bins over the env's action space, on the last
    non-special ids; `InputError` when too few exist or the action space cannot be binned."""
    special = set(tokenizer.all_special_ids)
    usable = [i for i in range(min(vocab_size, len(tokenizer))) if i not in special]
    if config.n_bins > len(usable):
        raise InputError(
            f"vla.n_bins is {config.n_bins}, expected <= {len(usable)}: the model's "
            f"vocabulary ({vocab_size} ids) has that many non-special tokens to use as action "
            "bins"
        )
    low, high = np.asarray(action_spec.low), np.asarray(action_spec.high)
    try:
        return ActionTokenizer(low, high, config.n_bins, token_ids=usable[-config.n_bins :])
    except ValueError as exc:
        raise InputError(
            f"env action space low={low.tolist()} high={high.tolist()}: the action tokenizer "
            f"cannot cover it ({exc})"
        ) from None


def split_options(options: Any, where: str) -> tuple[ActionSpec, VLAPolicyConfig]:
    """The env's action space and the policy's config from the ``vla`` builder's options
    (`rl_algos.trainer.vla_episodes.vla_policy_options`); `ValueError` naming `where`."""
    options = dict(options)
    try:
        spec = ActionSpec(
            options.pop("action_low"), options.pop("action_high"), options.pop("max_chunk", 1)
        )
    except KeyError as exc:
        raise ValueError(f"{where}: missing {exc}, expected the env's action space") from None
    return spec, VLAPolicyConfig(**options)


def check_policy_fits(model_path: str, vla: Any, action_spec: ActionSpec) -> int:
    """`action_tokenizer_for`'s checks before any worker builds the policy; the pad token id."""
    from transformers import AutoConfig

    from rl_multimodal.vlm.processor import load_processor

    processor = load_processor(model_path)
    tokenizer = getattr(processor, "tokenizer", processor)
    vocab = int(AutoConfig.from_pretrained(model_path).get_text_config().vocab_size)
    action_tokenizer_for(tokenizer, vocab, action_spec, vla)
    return int(tokenizer.pad_token_id or 0)


class VLAPolicy(nn.Module):
    """A VLM (``AutoModelForImageTextToText``) with an action head and a value head."""

    def __init__(
        self, model: Any, processor: Any, action_spec: ActionSpec, config: VLAPolicyConfig
    ):
        super().__init__()
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.tokenizer.padding_side = "left"
        self.config = config
        self.action_spec = action_spec
        hidden = int(model.config.get_text_config().hidden_size)
        vocab = int(model.config.get_text_config().vocab_size)
        self.action_tokenizer = action_tokenizer_for(self.tokenizer, vocab, action_spec, config)
        self.image_adapter: nn.Linear | None = None
        self._takes_encoder_outputs: bool | None = None  # see _image_kwargs
        self._bias_terms = action_spec.action_dim if config.head == "tokens" else 1
        if config.image_grid:
            self.image_adapter = nn.Linear(hidden * config.image_grid**2, hidden * self._bias_terms)
            nn.init.zeros_(self.image_adapter.weight)
            nn.init.zeros_(self.image_adapter.bias)
        if config.freeze_vision:
            model.model.visual.requires_grad_(False)
        if config.freeze_language_model:
            model.model.language_model.requires_grad_(False)
            model.lm_head.requires_grad_(False)
        self.value_head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        if config.head == "gaussian":
            dim = action_spec.action_dim
            self.mean_head = nn.Sequential(
                nn.Linear(hidden, config.hidden_mlp), nn.Tanh(), nn.Linear(config.hidden_mlp, dim)
            )
            self.log_std = nn.Parameter(torch.full((dim,), float(config.init_log_std)))

    @classmethod
    def from_pretrained(
        cls, path: str, action_spec: ActionSpec, config: VLAPolicyConfig | None = None
    ) -> VLAPolicy:
        from transformers import AutoModelForImageTextToText

        from rl_multimodal.vlm.processor import load_processor

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
        return cls(model, load_processor(path), action_spec, config or VLAPolicyConfig())

    @classmethod
    def from_exported(cls, path: str) -> VLAPolicy:
        """The policy `rl export` wrote to `path` (the VLM, ``vla_heads.safetensors``,
        ``rl_model.json``); it acts as the trained policy did. `ValueError` on a mismatch."""
        from safetensors.torch import load_file

        meta = json.loads((Path(path) / EXPORT_METADATA).read_text())
        if meta.get("kind") != "vla_policy":
            raise ValueError(
                f"{path}: {EXPORT_METADATA} is not a VLA policy's (kind {meta.get('kind')!r})"
            )
        spec = ActionSpec(**meta["action_spec"])
        policy = cls.from_pretrained(path, spec, VLAPolicyConfig(**meta["policy"]))
        heads = load_file(str(Path(path) / EXPORT_HEADS))
        missing, unexpected = policy.load_state_dict(heads, strict=False)
        missing = [k for k in missing if not k.startswith("model.")]
        if missing or unexpected:
            raise ValueError(f"{path}: heads missing {missing[:4]}, unexpected {unexpected[:4]}")
        tok = meta["action_tokenizer"]
        if policy.action_tokenizer.token_ids.tolist() != tok["token_ids"]:
            raise ValueError(f"{path}: the model's action token ids differ from the export's")
        return policy

    def process(self, obs: EnvObservation) -> PolicyInputs:
        """Prompts and pixels of `obs` (CPU tensors)."""
        from PIL import Image

        texts = [self.config.prompt.format(instruction=t) for t in obs.instructions]
        images = [Image.fromarray(im) for im in obs.images]
        from rl_multimodal.vlm.processor import ImageTextProcessor

        pad = {} if isinstance(self.processor, ImageTextProcessor) else {"padding": True}
        out = self.processor(text=texts, images=images, return_tensors="pt", **pad)
        grid = out["image_grid_thw"]
        pixels = list(torch.split(out["pixel_values"], grid.prod(-1).tolist()))  # per row
        return PolicyInputs(out["input_ids"], out["attention_mask"], pixels, grid)

    def _image_features(self, inputs: PolicyInputs) -> Any:
        """The vision tower's output (``pooler_output``: per row its image tokens), once per
        forward for the language model's image placeholders and the image adapter."""
        return self.model.model.get_image_features(
            torch.cat(inputs.pixel_values), inputs.image_grid_thw
        )

    def _positions(self, ids: torch.Tensor, mask: torch.Tensor, grid: torch.Tensor) -> Any:
        """``[3, B, S]`` multimodal rotary positions from each row's first real token for
        models that have them (Qwen2-VL, Qwen2.5-VL), else None."""
        owner = self.model.model
        if not callable(getattr(owner, "get_rope_index", None)):
            return None
        types = (ids == self.model.config.image_token_id).int()
        positions, _ = owner.get_rope_index(
            input_ids=ids, mm_token_type_ids=types, image_grid_thw=grid, attention_mask=mask
        )
        return positions

    def _hidden(
        self, inputs: PolicyInputs, extra_ids: torch.Tensor | None, features: Any
    ) -> torch.Tensor:
        """``[B, L (+extra), H]`` last hidden states of the prompt (+ `extra_ids` appended);
        `features` is `_image_features`' output for `inputs`."""
        ids, mask = inputs.input_ids, inputs.attention_mask
        if extra_ids is not None and extra_ids.shape[1]:
            ids = torch.cat([ids, extra_ids], dim=1)
            mask = torch.cat([mask, torch.ones_like(extra_ids)], dim=1)
        out = self.model.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=self._positions(ids, mask, inputs.image_grid_thw),
            image_grid_thw=inputs.image_grid_thw,
            **self._image_kwargs(inputs, features),
        )
        return out.last_hidden_state

    def _image_kwargs(self, inputs: PolicyInputs, features: Any) -> dict[str, Any]:
        """The tower's output when the model takes it (transformers' ``mm_encoder_outputs``),
        else the pixels (an older transformers: the tower runs again, same values)."""
        if self._takes_encoder_outputs is None:
            params = inspect.signature(type(self.model.model).forward).parameters
            self._takes_encoder_outputs = "mm_encoder_outputs" in params
        if self._takes_encoder_outputs:
            return {"mm_encoder_outputs": {"image": features}}
        return {"pixel_values": torch.cat(inputs.pixel_values)}

    def _image_bias(self, inputs: PolicyInputs, features: Any) -> torch.Tensor | None:
        """The image adapter's terms for the heads' states (None: off): ``[B, action_dim, H]``
        (tokens: term ``d`` where dimension ``d`` is predicted) or ``[B, 1, H]`` (gaussian)."""
        if self.image_adapter is None:
            return None
        g = self.config.image_grid
        feats = features.pooler_output  # per row: [t*h*w/merge^2, H], raster order
        merge = int(self.model.config.vision_config.spatial_merge_size)
        pooled = []
        for f, (t, h, w) in zip(feats, inputs.image_grid_thw.tolist(), strict=True):
            f = nn.functional.layer_norm(f.float(), f.shape[-1:])  # the tower's scale is arbitrary
            maps = f.view(int(t), int(h) // merge, int(w) // merge, -1).mean(0).permute(2, 0, 1)
            grid = nn.functional.adaptive_avg_pool2d(maps, (g, g))
            pooled.append((grid - grid.mean(dim=(1, 2), keepdim=True)).flatten())
        terms = self.image_adapter(torch.stack(pooled))
        return terms.view(len(pooled), self._bias_terms, -1)

    def _bin_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self.model.lm_head(hidden)
        ids = torch.as_tensor(self.action_tokenizer.token_ids, device=logits.device)
        return logits[..., ids]

    rl_output_kinds = ("log_probs", "entropy", "values")

    @property
    def _no_split_modules(self) -> list[str]:
        """The VLM's layers: the fsdp engine shards each of them."""
        return list(getattr(self.model, "_no_split_modules", None) or [])

    @property
    def hf_config(self) -> Any:
        return self.model.config

    def forward(
        self, micro_batch: Any, outputs: tuple[str, ...] = ("log_probs",), temperature: float = 1.0
    ) -> dict[str, torch.Tensor]:
        """The engine's forward (`rl_core.engine.models`): ``[b, R]`` log-probs, entropy and
        values of the actions of `steps_to_batch` rows (the prompt, then ``R`` action tokens
        or one placeholder with ``raw_actions``); the rows' frames are processed again."""
        batch = micro_batch.batch
        width = batch["responses"].shape[1]
        ids, mask = batch["input_ids"], batch["attention_mask"]
        rows = micro_batch.non_tensor_batch["multi_modal_inputs"]
        images = np.stack([r["image"] for r in rows])
        no_proprio = np.zeros((len(rows), 0), np.float32)
        frames = self.process(EnvObservation(images, no_proprio, [r["instruction"] for r in rows]))
        inputs = PolicyInputs(
            ids[:, :-width], mask[:, :-width], frames.pixel_values, frames.image_grid_thw
        ).to(ids.device, self._pixel_dtype())
        actions = batch["responses"] if self.config.head == "tokens" else batch["raw_actions"]
        log_probs, values, entropy = self.evaluate(inputs, actions, temperature)
        return {  # fresh tensors, not views (FSDP hooks the outputs for backward)
            "log_probs": log_probs.clone(),
            "entropy": entropy.clone(),
            "values": values.unsqueeze(-1).repeat(1, log_probs.shape[-1]),
        }

    def _pixel_dtype(self) -> torch.dtype:
        """The vision tower's compute dtype (under FSDP's mixed precision the gathered one)."""
        for p in self.model.model.visual.parameters():
            return p.dtype if not hasattr(p, "to_local") else p.to_local().dtype
        return torch.float32

    def export_metadata(self) -> dict[str, Any]:
        """What an export writes beside the weights: the action tokenizer, heads and prompt."""
        tok = self.action_tokenizer
        return {
            "kind": "vla_policy",
            "hf_prefix": "model.",
            "extra_file": EXPORT_HEADS,
            "policy": dataclasses.asdict(self.config),
            "action_tokenizer": {
                "low": tok.low.tolist(),
                "high": tok.high.tolist(),
                "n_bins": tok.n_bins,
                "token_ids": tok.token_ids.tolist(),
            },
            "action_spec": {
                "low": np.asarray(self.action_spec.low).tolist(),
                "high": np.asarray(self.action_spec.high).tolist(),
                "max_chunk": int(self.action_spec.max_chunk),
            },
        }

    def evaluate(
        self, inputs: PolicyInputs, actions: torch.Tensor, temperature: float = 1.0
    ) -> tuple[torch.Tensor, ...]:
        """(log_probs, values, entropy) of `actions` (as in `PolicyOutput.actions`), with grad."""
        L = inputs.input_ids.shape[1]
        features = self._image_features(inputs)
        bias = self._image_bias(inputs, features)
        if self.config.head == "tokens":
            hidden = self._hidden(inputs, actions[:, :-1], features)
            heads_in = hidden[:, L - 1 :]  # [B, D, H]: position d predicts dimension d
            if bias is not None:
                heads_in = heads_in + bias
            state = heads_in[:, 0]
            logp_all = torch.log_softmax(self._bin_logits(heads_in).float() / temperature, -1)
            bins = torch.as_tensor(
                self.action_tokenizer.token_to_bin(actions), device=actions.device
            )
            log_probs = logp_all.gather(-1, bins.unsqueeze(-1)).squeeze(-1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
        else:
            state, dist = self._gaussian(inputs, features, bias)
            log_probs = dist.log_prob(actions.float()).sum(-1, keepdim=True)
            entropy = dist.entropy().sum(-1, keepdim=True)
        values = self.value_head(state.float()).squeeze(-1)
        return log_probs, values, entropy

    def _gaussian(
        self, inputs: PolicyInputs, features: Any, bias: Any
    ) -> tuple[torch.Tensor, torch.distributions.Normal]:
        """The prompt's last hidden state ``[B, H]`` (+ the image adapter's term) and the
        gaussian head's action distribution on it."""
        state = self._hidden(inputs, None, features)[:, -1]
        state = state if bias is None else state + bias[:, 0]
        mean = self.mean_head(state.float())
        return state, torch.distributions.Normal(mean, self.log_std.exp().expand_as(mean))

    @torch.no_grad()
    def act(self, inputs: PolicyInputs, greedy: bool = False) -> PolicyOutput:
        """Sample (or take the mode of) one action per row, with `evaluate`'s log-probs and
        values; no grad. The tower runs once, the LM once per action dimension (tokens)."""
        device = inputs.input_ids.device  # the model's (`act_on` moves the inputs there)
        low = torch.as_tensor(self.action_spec.low, device=device)
        high = torch.as_tensor(self.action_spec.high, device=device)
        features = self._image_features(inputs)
        bias = self._image_bias(inputs, features)
        if self.config.head == "tokens":
            ids = torch.as_tensor(self.action_tokenizer.token_ids, device=device)
            chosen = torch.zeros(len(inputs.input_ids), 0, dtype=torch.long, device=device)
            log_probs, values = [], None
            for d in range(self.action_spec.action_dim):
                last = self._hidden(inputs, chosen, features)[:, -1]
                if bias is not None:
                    last = last + bias[:, d]
                if values is None:  # the prompt's last position: the value head's state
                    values = self.value_head(last.float()).squeeze(-1)
                logp = torch.log_softmax(self._bin_logits(last).float(), -1)
                k = logp.argmax(-1) if greedy else torch.multinomial(logp.exp(), 1)[:, 0]
                log_probs.append(logp.gather(-1, k[:, None]))
                chosen = torch.cat([chosen, ids[k].unsqueeze(1)], dim=1)
            env_actions = self.action_tokenizer.decode(chosen)
            return PolicyOutput(env_actions, chosen, torch.cat(log_probs, -1), values)
        state, dist = self._gaussian(inputs, features, bias)
        raw = dist.mean if greedy else dist.sample()
        env_actions = torch.maximum(torch.minimum(raw, high), low).cpu().numpy().astype(np.float32)
        values = self.value_head(state.float()).squeeze(-1)
        return PolicyOutput(env_actions, raw, dist.log_prob(raw).sum(-1, keepdim=True), values)
