"""Driver-side operations on rollout batches: ids, seeds, padding trims, metrics."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import contextmanager
from time import perf_counter
from typing import Any

import numpy as np
import torch

from rl_core.protocol import DataProto
from rl_core.rollout import ROUTED_EXPERTS

__all__ = [
    "add_group_ids_and_seeds",
    "batch_metrics",
    "guide_prompts",
    "guided_metrics",
    "timed",
    "tool_metrics",
    "trim_padding",
    "unguide_prompts",
    "with_prompts",
    "with_token_ids",
]


@contextmanager
def timed(timing: dict[str, float], name: str):
    """Add the wall time of the block to ``timing[name]`` (seconds)."""
    start = perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + perf_counter() - start


def add_group_ids_and_seeds(prompts: DataProto, n: int, step: int, seed: int) -> DataProto:
    """Repeat each prompt `n` times (interleaved): one ``uid`` per prompt, a sampling ``seed``
    per row from (seed, step, row) only, so a resumed run generates the same."""
    size = len(prompts)
    uids = np.array(
        [uuid.UUID(int=(seed << 64) ^ (step << 32) ^ i).hex for i in range(size)], dtype=object
    )
    prompts.non_tensor_batch["uid"] = uids
    out = prompts.repeat(n, interleave=True)
    base = np.random.default_rng([seed, step]).integers(0, 2**62)
    out.non_tensor_batch["seed"] = np.array([int(base) + i for i in range(len(out))], dtype=object)
    return out


def trim_padding(batch: DataProto) -> DataProto:
    """Cut all-padding columns: prompts and responses to their longest real ones."""
    t = batch.batch
    prompt_len = t["prompts"].shape[1]
    attn = t["attention_mask"]
    prompt_real = attn[:, :prompt_len].sum(-1)
    resp_real = attn[:, prompt_len:].sum(-1)
    keep_p = int(prompt_real.max()) if len(batch) else 0
    keep_r = max(1, int(resp_real.max())) if len(batch) else 1
    cols = torch.arange(prompt_len - keep_p, prompt_len + keep_r)
    out = {}
    for key in t.keys():  # noqa: SIM118 - iterating a TensorDict walks rows, not keys
        value = t[key]
        if key == "prompts":
            out[key] = value[:, prompt_len - keep_p :]
        elif key in ("input_ids", "attention_mask", "position_ids", ROUTED_EXPERTS):
            out[key] = value[:, cols]  # (routed experts: [B, P+R, layers, top_k])
        elif value.dim() == 2 and value.shape[1] == t["responses"].shape[1]:
            out[key] = value[:, :keep_r]
        else:
            out[key] = value
    return DataProto.from_dict(
        {k: v.contiguous() for k, v in out.items()}, dict(batch.non_tensor_batch), batch.meta_info
    )


def _stats(name: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {
        f"{name}/mean": float(values.mean()),
        f"{name}/max": float(values.max()),
        f"{name}/min": float(values.min()),
    }


def batch_metrics(batch: DataProto, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, lengths of a scored batch (verl's metric names)."""
    t = batch.batch
    keys = set(t.keys())
    mask = t["response_mask"].bool()
    prompt_len = t["prompts"].shape[1]
    resp_len = t["attention_mask"][:, prompt_len:].sum(-1)
    metrics = {}
    metrics.update(_stats("critic/score", t["token_level_scores"].sum(-1)))
    if "token_level_rewards" in keys:
        metrics.update(_stats("critic/rewards", t["token_level_rewards"].sum(-1)))
    if "advantages" in keys:
        metrics.update(_stats("critic/advantages", t["advantages"][mask]))
    if "returns" in keys:
        metrics.update(_stats("critic/returns", t["returns"][mask]))
    if "values" in keys:
        metrics.update(_stats("critic/values", t["values"][mask]))
    metrics.update(_stats("response_length", resp_len))
    metrics["response_length/clip_ratio"] = float((resp_len >= max_response_length).float().mean())
    metrics.update(_stats("prompt_length", t["attention_mask"][:, :prompt_len].sum(-1)))
    return metrics


def tool_metrics(batch: DataProto, prefix: str) -> dict[str, float]:
    """``<prefix>/tool_call_rate``, ``tool_calls/mean``, ``tool_errors/mean`` and
    ``num_turns/mean`` from the agent loop's per-sample counts; {} without them."""
    fields = batch.non_tensor_batch
    if "num_tool_calls" not in fields or len(batch) == 0:
        return {}
    calls = np.asarray(fields["num_tool_calls"], dtype=np.float64)
    metrics = {
        f"{prefix}/tool_call_rate": float((calls > 0).mean()),
        f"{prefix}/tool_calls/mean": float(calls.mean()),
    }
    for key, name in (("num_tool_errors", "tool_errors"), ("num_turns", "num_turns")):
        if key in fields:
            metrics[f"{prefix}/{name}/mean"] = float(np.asarray(fields[key], np.float64).mean())
    return metrics


def _prompt_layout(
    batch: DataProto, ids: Sequence[Sequence[int]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """`batch`'s prompt-dependent tensors with row ``i``'s prompt replaced by ``ids[i]``."""
    t = batch.batch
    rows, width = len(ids), max(len(x) for x in ids)
    prompts = torch.full((rows, width), pad_token_id, dtype=t["prompts"].dtype)
    prompt_mask = torch.zeros((rows, width), dtype=t["attention_mask"].dtype)
    for i, row in enumerate(ids):
        prompts[i, width - len(row) :] = torch.tensor(row, dtype=prompts.dtype)
        prompt_mask[i, width - len(row) :] = 1
    responses = t["responses"]
    response_attn = t["attention_mask"][:, -responses.shape[1] :]
    attention_mask = torch.cat([prompt_mask, response_attn], dim=1)
    return {
        "prompts": prompts,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(dim=1) - 1).clamp(min=0),
    }


def _row_ids(values: Any, key: str) -> list[list[int]]:
    """Each row's token ids of field `key`; a ValueError naming the first empty row."""
    ids = [[int(t) for t in x] for x in values]
    empty = next((i for i, row in enumerate(ids) if not row), None)
    if empty is not None:
        raise ValueError(f"{key}: row {empty} has no token ids (expected a non-empty prompt)")
    return ids


def with_prompts(batch: DataProto, key: str, pad_token_id: int) -> DataProto:
    """The rollout `batch` with each prompt replaced by the token ids in non-tensor field
    `key` (e.g. a teacher's prompt), left-padded, responses kept aligned; only the tensors
    a log-prob pass reads are carried."""
    if key not in batch.non_tensor_batch:
        raise KeyError(f"with_prompts: the batch has no non-tensor field {key!r}")
    ids = _row_ids(batch.non_tensor_batch[key], f"with_prompts: {key}")
    tensors = _prompt_layout(batch, ids, pad_token_id)
    tensors["responses"] = batch.batch["responses"]
    tensors["response_mask"] = batch.batch["response_mask"]
    return DataProto.from_dict(tensors=tensors, meta_info=dict(batch.meta_info))


def with_token_ids(batch: DataProto, table: Sequence[int], keys: Sequence[str]) -> DataProto:
    """A copy of `batch` whose tensors `keys` (token ids) are replaced by ``table[ids]``
    (``distill.token_map``); an id outside the table, or one it maps to -1, is refused."""
    tensors = dict(batch.batch.items())
    for key in keys:
        ids = tensors[key]
        lookup = torch.as_tensor(table, device=ids.device)
        inside = (ids >= 0) & (ids < len(table))
        mapped = torch.where(inside, lookup[ids.clamp(0, len(table) - 1)], -1)
        if (mapped < 0).any():
            bad = int(ids[mapped < 0][0])
            raise ValueError(
                f"distill.token_map: {key} holds token id {bad}, which model.path's tokenizer "
                f"has no token for (ids 0..{len(table) - 1}, gaps excluded); expected the "
                "policy tokenizer's ids (a model whose embedding is larger than its tokenizer "
                "can sample such ids)"
            )
        tensors[key] = mapped
    return DataProto.from_dict(tensors, dict(batch.non_tensor_batch), dict(batch.meta_info))


# what a rollout computed after its prompt: meaningless once the prompt is another
PROMPT_BOUND_TENSORS = ("rollout_log_probs", ROUTED_EXPERTS)


def guide_prompts(
    batch: DataProto, key: str, guided: np.ndarray, temperature: float | None = None
) -> DataProto:
    """Prompt rows for generation, the `guided` rows (bool mask) prompted by their field
    `key` (token ids); their own ids are kept in ``own_prompt_ids``. A `temperature` is
    the guided rows' own (the rollout's per-row non-tensor ``temperature``)."""
    nt = batch.non_tensor_batch
    if key not in nt:
        raise KeyError(
            f"rollout.guide_prompt_key: the prompt rows have no field {key!r} (fields: "
            f"{sorted(nt)}); the data must give every row that prompt"
        )
    out = DataProto.from_dict(
        tensors=dict(batch.batch.items()), non_tensors=dict(nt), meta_info=dict(batch.meta_info)
    )
    own = np.empty(len(batch), dtype=object)
    own[:] = [list(x) for x in nt["raw_prompt_ids"]]
    guide = _row_ids(nt[key], key)
    ids = own.copy()
    for i in np.flatnonzero(guided):
        ids[i] = guide[i]
    out.non_tensor_batch["own_prompt_ids"] = own
    out.non_tensor_batch["raw_prompt_ids"] = ids
    out.non_tensor_batch["guided"] = np.asarray(guided, dtype=bool)
    if temperature is not None:
        row_temperature = np.full(len(batch), None, dtype=object)
        row_temperature[np.asarray(guided, dtype=bool)] = float(temperature)
        out.non_tensor_batch["temperature"] = row_temperature
    return out


def unguide_prompts(batch: DataProto, pad_token_id: int) -> DataProto:
    """Undo `guide_prompts` on the rollout `batch`: own prompts, responses kept, without the
    tensors bound to the guide's prompt (`PROMPT_BOUND_TENSORS`) and the rows' sampling
    temperatures (the update's log-probs are at the batch's)."""
    nt = batch.non_tensor_batch
    own = nt["own_prompt_ids"]
    tensors = {k: v for k, v in batch.batch.items() if k not in PROMPT_BOUND_TENSORS}
    tensors.update(_prompt_layout(batch, _row_ids(own, "own_prompt_ids"), pad_token_id))
    non_tensors = {k: v for k, v in nt.items() if k not in ("own_prompt_ids", "temperature")}
    non_tensors["raw_prompt_ids"] = own
    return DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info=dict(batch.meta_info)
    )


def guided_metrics(batch: DataProto) -> dict[str, float]:
    """Mean score of the guided samples and of the model's own (`guide_prompts`' rows,
    scored): how much the guide's context helps, and what the update pushes towards."""
    guided = np.asarray(batch.non_tensor_batch["guided"], dtype=bool)
    scores = batch.batch["token_level_scores"].sum(-1)
    metrics = {"rollout/guided_share": float(guided.mean())}
    for name, rows in (("guided", guided), ("own", ~guided)):
        if rows.any():
            metrics[f"reward/{name}_mean"] = float(scores[torch.from_numpy(rows)].mean())
    return metrics
