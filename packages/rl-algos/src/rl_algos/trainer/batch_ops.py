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
    "with_reference_responses",
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


_PROMPT_LAYOUT = ("prompts", "input_ids", "attention_mask", "position_ids")


def _prompt_layout(
    batch: DataProto, ids: Sequence[Sequence[int]], pad_token_id: int
) -> dict[str, torch.Tensor]:
    """`batch`'s prompt-dependent tensors with row ``i``'s prompt replaced by ``ids[i]``."""
    responses = batch.batch["responses"]
    response_attn = batch.batch["attention_mask"][:, -responses.shape[1] :]
    return _layout(ids, responses, response_attn, pad_token_id)


def _layout(
    ids: Sequence[Sequence[int]],
    responses: torch.Tensor,
    response_attn: torch.Tensor,
    pad_token_id: int,
) -> dict[str, torch.Tensor]:
    """Prompt-dependent tensors of prompts `ids` (left-padded) before `responses`."""
    rows, width = len(ids), max(len(x) for x in ids)
    prompts = torch.full((rows, width), pad_token_id, dtype=responses.dtype)
    prompt_mask = torch.zeros((rows, width), dtype=response_attn.dtype)
    for i, row in enumerate(ids):
        prompts[i, width - len(row) :] = torch.tensor(row, dtype=prompts.dtype)
        prompt_mask[i, width - len(row) :] = 1
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


_VERSIONS = ("policy_version", "rollout_weight_versions")  # the rollout's, per row and token
# what a reference row gets for the generator's per-sample fields
_REFERENCE_FIELDS = {"num_turns": 1, "num_tool_calls": 0, "num_tool_errors": 0,
                     "finish_reason": "stop"}  # fmt: skip


def with_reference_responses(
    batch: DataProto, generated: DataProto, reference: np.ndarray, key: str, pad_token_id: int
) -> DataProto:
    """The rollout of every row of `batch`: the `generated` rollout (of the rows where the
    bool mask `reference` is False, own prompts) with, in the other rows, the response
    token ids of non-tensor field `key` (``rollout.reference_key``'s), laid out as a
    generated response (right-padded to the same width). Reference rows are marked in
    ``reference`` and ``guided``; the rollout's log-probs are dropped (a reference has none);
    its policy versions are the batch's newest (staleness 0)."""
    reference = np.asarray(reference, dtype=bool)
    if int((~reference).sum()) != len(generated):
        raise ValueError(
            f"with_reference_responses: {len(generated)} generated rows for "
            f"{int((~reference).sum())} rows that are not references"
        )
    t, nt = generated.batch, generated.non_tensor_batch
    extra = sorted(set(t.keys()) - {*_PROMPT_LAYOUT, *_VERSIONS, "responses",
                                    "response_mask", "rollout_log_probs"})  # fmt: skip
    if extra:
        raise ValueError(
            f"rollout.reference_key: the generated rows carry {extra}, which a reference "
            "sample (not generated) cannot have"
        )
    rows, width = len(batch), t["responses"].shape[1]
    made = torch.from_numpy(np.flatnonzero(~reference))
    responses = torch.full((rows, width), pad_token_id, dtype=t["responses"].dtype)
    response_attn = torch.zeros((rows, width), dtype=t["attention_mask"].dtype)
    response_mask = torch.zeros((rows, width), dtype=t["response_mask"].dtype)
    responses[made] = t["responses"]
    response_attn[made] = t["attention_mask"][:, -width:]
    response_mask[made] = t["response_mask"]
    answers = batch.non_tensor_batch[key]
    for row in np.flatnonzero(reference):
        ids = [int(x) for x in answers[row]]
        if not 0 < len(ids) <= width:
            raise ValueError(
                f"{key}: row {row} has {len(ids)} tokens; expected 1..{width} (the response "
                "width, data.max_response_length)"
            )
        responses[row, : len(ids)] = torch.tensor(ids, dtype=responses.dtype)
        response_attn[row, : len(ids)] = 1
        response_mask[row, : len(ids)] = 1
    own_ids = _row_ids(batch.non_tensor_batch["raw_prompt_ids"], "raw_prompt_ids")
    tensors = _layout(own_ids, responses, response_attn, pad_token_id)
    tensors.update(responses=responses, response_mask=response_mask)
    if set(_VERSIONS) <= set(t.keys()):  # a reference counts as of the newest policy
        newest = int(t["policy_version"].max()) if len(generated) else -1
        tensors["policy_version"] = torch.full((rows,), newest, dtype=torch.long)
        tensors["policy_version"][made] = t["policy_version"]
        versions = torch.where(response_mask.bool(), newest, -1)
        versions[made] = t["rollout_weight_versions"]
        tensors["rollout_weight_versions"] = versions
    non_tensors: dict[str, np.ndarray] = {}
    for name in dict.fromkeys([*batch.non_tensor_batch, *nt]):
        values = batch.non_tensor_batch.get(name)
        if name in nt:  # the generator's rows; the batch's or a default for references
            fill = values[reference] if values is not None else _REFERENCE_FIELDS.get(name)
            dtype = nt[name].dtype if values is not None or name in _REFERENCE_FIELDS else object
            values = np.empty(rows, dtype=dtype)
            values[~reference], values[reference] = nt[name], fill
        non_tensors[name] = values
    guided = np.asarray(nt.get("guided", np.zeros(len(generated), dtype=bool)), dtype=bool)
    non_tensors["guided"] = np.ones(rows, dtype=bool)
    non_tensors["guided"][~reference] = guided
    non_tensors["reference"] = reference.copy()
    return DataProto.from_dict(
        tensors=tensors, non_tensors=non_tensors, meta_info=dict(generated.meta_info)
    )


def guided_metrics(batch: DataProto) -> dict[str, float]:
    """Mean score of the guided samples, the reference ones and the model's own
    (`guide_prompts`' and `with_reference_responses`' rows, scored): how much the guide's
    context helps, and what the update pushes towards. ``rollout/guided_share`` counts
    both guided and reference samples."""
    guided = np.asarray(batch.non_tensor_batch["guided"], dtype=bool)
    reference = np.asarray(batch.non_tensor_batch.get("reference", np.zeros_like(guided)), bool)
    scores = batch.batch["token_level_scores"].sum(-1)
    metrics = {"rollout/guided_share": float(guided.mean())}
    parts = (("guided", guided & ~reference), ("reference", reference), ("own", ~guided))
    for name, rows in parts:
        if rows.any():
            metrics[f"reward/{name}_mean"] = float(scores[torch.from_numpy(rows)].mean())
    return metrics
