"""`TinyHFEngine`: one process, the whole model on one device, plain AdamW.

Everything the contract asks of an engine, in the simplest form: padded forward passes,
sum-style losses accumulated over micro-batches (rl-core splits them), a global-norm
clip, an LR schedule from `OptimizerConfig.lr_factor`, atomic checkpoints, offload.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from rl_core.checkpoint import (
    discard_staging,
    publish,
    staging_path,
    verify_manifest,
    write_manifest,
)
from rl_core.config import check
from rl_core.engine import (
    INFER_KEYS,
    TRAIN_KEYS,
    EngineConfig,
    LossContext,
    LossFn,
    TrainEngine,
    check_batch,
    check_outputs,
    iter_layer_buckets,
    local_micro_batch_count,
    split_micro_batches,
    token_log_probs_and_entropy,
)
from rl_core.platform import get_platform
from rl_core.protocol import DataProto

_STATE = "state.pt"


@dataclass(frozen=True)
class TinyHFOptions:
    """This engine's own options (``EngineConfig.engine_kwargs``): the Hugging Face
    attention kernel. Declared as the engine's ``options_class``, so a trainer checks them
    before any worker starts."""

    attn_implementation: str = "sdpa"

    def check(self) -> None:
        check(bool(self.attn_implementation), "attn_implementation", self.attn_implementation,
              "a Hugging Face kernel name, e.g. 'sdpa' or 'eager'")  # fmt: skip


class TinyHFEngine(TrainEngine):
    """A Hugging Face causal LM (or 1-label token-classification value model) trained in
    this process; `dp_size` is 1."""

    options_class: ClassVar[type] = TinyHFOptions

    def __init__(self, config: EngineConfig) -> None:
        from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

        self.config = config.validate()
        self.options: TinyHFOptions = self.parse_options(config)
        model_cfg = config.model
        if model_cfg.path is None or not os.path.isdir(model_cfg.path):
            raise FileNotFoundError(
                f"ModelConfig.path={model_cfg.path!r} is not a directory: expected a local "
                "Hugging Face model directory"
            )
        self._device = get_platform().process_device()
        torch.manual_seed(config.seed)
        auto = AutoModelForTokenClassification if model_cfg.value_head else AutoModelForCausalLM
        self.model = auto.from_pretrained(
            model_cfg.path,
            dtype=getattr(torch, model_cfg.dtype),
            attn_implementation=self.options.attn_implementation,
        ).to(self._device)
        self.value_model = model_cfg.value_head
        self.tied = bool(getattr(self.model.config, "tie_word_embeddings", False))
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None
        if config.inference_only:
            self.model.requires_grad_(False)
        else:
            opt = config.optim
            self.optimizer = torch.optim.AdamW(
                self.model.parameters(),
                lr=opt.lr,
                betas=opt.betas,
                eps=opt.eps,
                weight_decay=opt.weight_decay,
            )
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, opt.lr_factor)
        self._step = 0
        self._offloaded = False

    # ---- layout: one process holds everything ------------------------------------
    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def dp_rank(self) -> int:
        return 0

    @property
    def dp_size(self) -> int:
        return 1

    @property
    def is_collect_rank(self) -> bool:
        return True

    @property
    def global_step(self) -> int:
        return self._step

    # ---- forward ------------------------------------------------------------------
    def _forward(
        self, mb: DataProto, outputs: Sequence[str], temperature: float
    ) -> dict[str, Tensor]:
        t = mb.batch
        resp_len = t["responses"].shape[1]
        out = self.model(
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).logits
        # the token at position i predicts token i + 1: responses come from the R logits
        # ending one before the last position
        out = out[:, -resp_len - 1 : -1]
        real = t["attention_mask"][:, -resp_len:].to(torch.float32)  # padding reads 0
        if self.value_model:
            return {"values": out[..., 0].float() * real}
        log_probs, entropy = token_log_probs_and_entropy(
            out, t["responses"], temperature, with_entropy="entropy" in outputs
        )
        result = {"log_probs": log_probs * real} if "log_probs" in outputs else {}
        if entropy is not None:
            result["entropy"] = entropy * real
        return result

    def _temperature(self, batch: DataProto, temperature: float | None) -> float:
        value = batch.meta_info.get("temperature", 1.0) if temperature is None else temperature
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"temperature={value!r} is invalid: expected a finite number > 0")
        return float(value)

    def _require(self, what: str) -> None:
        if self._offloaded:
            raise RuntimeError(f"{what} called while offloaded: call onload() first")

    # ---- training -----------------------------------------------------------------
    def train_batch(
        self, batch: DataProto, loss_fn: LossFn, outputs: Sequence[str] | None = None
    ) -> dict[str, float]:
        self._require("train_batch")
        if self.optimizer is None:
            raise RuntimeError(
                "train_batch on an EngineConfig.inference_only engine: it holds no optimizer"
            )
        check_batch(batch, TRAIN_KEYS)
        outputs = check_outputs(
            outputs or (("values",) if self.value_model else ("log_probs",)), self.value_model
        )
        temperature = self._temperature(batch, None)
        num_tokens = int(batch.batch["response_mask"].sum())
        num_micro = local_micro_batch_count(batch, self.config.micro_batch)
        self.model.train()
        loss_sum, finite, metrics = 0.0, True, {}
        for index, (mb, _) in enumerate(
            split_micro_batches(batch, self.config.micro_batch, num_micro)
        ):
            ctx = LossContext(num_tokens, len(batch), 1, index, num_micro, temperature)
            mb = mb.to(self._device)
            loss, mb_metrics = loss_fn(self._forward(mb, outputs, temperature), mb, ctx)
            loss.backward()
            loss_sum += float(loss.detach())
            finite = finite and math.isfinite(float(loss.detach()))
            for key, value in mb_metrics.items():
                metrics[key] = metrics.get(key, 0.0) + float(value)
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        grad_norm = (
            float(
                torch.linalg.vector_norm(
                    torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])
                )
            )
            if grads
            else 0.0
        )
        finite = finite and math.isfinite(grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        if finite:
            if self.config.optim.grad_clip:
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.grad_clip)
            self.optimizer.step()
            self.scheduler.step()
            self._step += 1
        self.optimizer.zero_grad(set_to_none=True)
        if not finite and self.config.on_nan == "raise":
            raise FloatingPointError(
                f"non-finite loss or gradient norm at step {self._step} (loss={loss_sum}, "
                f"grad_norm={grad_norm}); no optimizer step was taken"
            )
        return {
            "loss": loss_sum,
            "grad_norm": grad_norm,
            "lr": lr,
            "num_tokens": float(num_tokens),
            "num_seqs": float(len(batch)),
            "num_micro_batches": float(num_micro),
            "skipped": 0.0 if finite else 1.0,
            **metrics,
        }

    @torch.no_grad()
    def infer_batch(
        self,
        batch: DataProto,
        outputs: Sequence[str] = ("log_probs",),
        temperature: float | None = None,
    ) -> DataProto:
        self._require("infer_batch")
        check_batch(batch, INFER_KEYS)
        outputs = check_outputs(outputs, self.value_model)
        temperature = self._temperature(batch, temperature)
        cfg = self.config.infer_micro_batch or self.config.micro_batch
        parts = split_micro_batches(batch, cfg, local_micro_batch_count(batch, cfg))
        self.model.eval()
        resp_len = batch.batch["responses"].shape[1]
        result = {k: torch.zeros(len(batch), resp_len) for k in outputs}
        for mb, indices in parts:
            out = self._forward(mb.to(self._device), outputs, temperature)
            for key in outputs:
                result[key][indices] = out[key].float().cpu()  # back in batch order, on CPU
        return DataProto.from_dict(tensors=result)

    # ---- weights, checkpoints, memory ---------------------------------------------
    def export_weights(
        self, bucket_bytes: int = 512 * 1024 * 1024, dtype: Any = None
    ) -> Iterator[list[tuple[str, Tensor]]]:
        if not isinstance(bucket_bytes, int) or bucket_bytes < 1:
            raise ValueError(f"bucket_bytes={bucket_bytes!r} is invalid: expected an integer >= 1")
        # whole layers per bucket (rl-core's helper): a rollout's fused parameters (qkv,
        # gate_up) never straddle two buckets
        yield from iter_layer_buckets(self._named_weights(dtype), bucket_bytes)

    def _named_weights(self, dtype: Any) -> Iterator[tuple[str, Tensor]]:
        for name, tensor in self.model.state_dict().items():
            if self.tied and name == "lm_head.weight":
                continue  # exported once, as the input embedding
            yield name, (tensor.detach().to(dtype) if dtype is not None else tensor.detach())

    def save(self, path: str) -> None:
        self._require("save")
        if self.optimizer is None:
            raise RuntimeError("save on an EngineConfig.inference_only engine: nothing to resume")
        if not all(bool(torch.isfinite(p).all()) for p in self.model.parameters()):
            raise FloatingPointError(f"refusing to save {path!r}: parameters are not finite")
        path = os.path.abspath(path.rstrip("/"))
        partial = staging_path(path)  # rl-core's integrity rules: stage, manifest, publish
        discard_staging(path)
        os.makedirs(partial)
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "step": self._step,
            "world_size": 1,
            "cpu_rng": torch.get_rng_state(),
        }
        torch.save(state, os.path.join(partial, _STATE))
        write_manifest(partial, {"engine": "tiny-hf"})  # fsyncs, written last
        publish(partial, path)  # an existing checkpoint is exchanged, never deleted first

    def load(self, path: str) -> None:
        self._require("load")
        if self.optimizer is None:
            raise RuntimeError("load on an EngineConfig.inference_only engine")
        file = os.path.join(path, _STATE)
        if os.path.isdir(path):
            verify_manifest(path)  # names a corrupt or truncated file
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"{path!r} is not a tiny-hf checkpoint (no {_STATE}): expected a directory "
                "written by TinyHFEngine.save (it cannot load other engines' checkpoints)"
            )
        state = torch.load(file, map_location=self._device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self._step = int(state["step"])
        torch.set_rng_state(state["cpu_rng"].cpu())

    def offload(self) -> None:
        if not self._offloaded:
            self._move(torch.device("cpu"))
            self._offloaded = True

    def onload(self) -> None:
        if self._offloaded:
            self._move(self._device)
            self._offloaded = False

    def _move(self, device: torch.device) -> None:
        if self._device.type == "cpu":
            return
        self.model.to(device)
        if self.optimizer is not None:
            for state in self.optimizer.state.values():
                for key, value in state.items():
                    if isinstance(value, Tensor) and key != "step":
                        state[key] = value.to(device)
        if device.type == "cpu":
            get_platform().empty_cache()
