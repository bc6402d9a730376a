"""Megatron's distributed optimizer on any backend: `DistributedAdamW`.

megatron-core's ``DistributedOptimizer`` needs CUDA (and its ``DistributedDataParallel``
grad buffers); this one does the same job with plain tensors and torch.distributed
collectives, so it runs on gloo (CPU tests) and on NCCL alike. Per data-parallel
*partition* (dense parameters over the data-parallel group, expert parameters over the
expert-data-parallel group):

* the model parameters (compute dtype, e.g. bf16) are re-homed into one flat buffer,
  padded to a multiple of the group size and cut into equal contiguous ranges, one per
  rank;
* every gradient is added into a flat fp32 *grad buffer* of the same layout as it is
  produced (micro-batches accumulate in fp32, like megatron-core's ``main_grad``);
* `reduce_scatter_grads` reduce-scatters that buffer (a sum) over the group, so each rank
  holds the reduced gradients of its range only;
* the optimizer steps only its range: fp32 *main* parameters and AdamW moments exist for
  that range alone (the main range is a view of the parameter buffer when the model is
  fp32 itself);
* after the step the range is cast to the model dtype and all-gathered, in place, into
  the parameter buffer, so every rank holds the whole updated model.

Per parameter that is, with bf16 parameters: 2 (model) + 4 (grad buffer) + 12/DP (main
parameter, two moments) bytes per rank, Megatron's ``6 + 12/DP``.

Gradient clipping runs over the shards: `grad_squares` sums this rank's squares of the
reduced gradients of the parameters it is told to count (`set_norm_params`: each tensor-
or expert-parallel replica once); the engine all-reduces the sums over all ranks.

Checkpoints are written in *model space* (`rl_engines.megatron.checkpoint`): for each
parameter one rank of the group (its *writer*, chosen to balance bytes) assembles the full
fp32 main value and moments (`full_flat`) and writes them, so a checkpoint does not depend
on the data-parallel size and loads at another one (`load_full` writes the part of a full
tensor that falls in this rank's range; `publish` then all-gathers the model).

Every collective runs on tensors of the engine's device over the partition's group.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["DistributedAdamW"]

STATE_KEYS = ("exp_avg", "exp_avg_sq")


def _collective(fn: Callable[..., Any], *args: Any, what: str, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:
        raise RuntimeError(f"rank {dist.get_rank()}: {what} failed: {exc}") from exc


class _Partition:
    """Parameters that share one data-parallel group: flat parameter and grad buffers,
    this rank's range of them and the fp32 main parameters of that range."""

    def __init__(self, params: list[Tensor], group: Any, name: str) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"one partition holds parameters of dtypes {sorted(map(str, dtypes))}")
        self.name, self.params, self.group = name, params, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.total = sum(self.numels)
        self.chunk = -(-self.total // self.size)
        self.lo, self.hi = self.rank * self.chunk, (self.rank + 1) * self.chunk
        device = params[0].device
        self.param_buffer = torch.zeros(
            self.chunk * self.size, dtype=params[0].dtype, device=device
        )
        self.grad_buffer = torch.zeros(self.chunk * self.size, dtype=torch.float32, device=device)
        with torch.no_grad():
            for p, offset, n in zip(params, self.offsets, self.numels):
                self.param_buffer[offset : offset + n].copy_(p.detach().reshape(-1))
        self._view_params()
        self.main_is_view = self.param_buffer.dtype == torch.float32
        owned = self.param_buffer[self.lo : self.hi]
        self.main = nn.Parameter(owned if self.main_is_view else owned.float())
        # (parameter index, global a, global b) for every parameter overlapping the range
        self.overlaps = [
            (i, max(self.lo, off), min(self.hi, off + n))
            for i, (off, n) in enumerate(zip(self.offsets, self.numels))
            if max(self.lo, off) < min(self.hi, off + n)
        ]
        self.overlap_of = {i: (a, b) for i, a, b in self.overlaps}
        self.writers = self._balanced_writers()
        self.counted: list[tuple[int, int]] = []  # ranges (relative to lo) in the grad norm

    def _view_params(self) -> None:
        self.grad_views = []
        for p, offset, n in zip(self.params, self.offsets, self.numels):
            p.data = self.param_buffer[offset : offset + n].view_as(p)
            self.grad_views.append(self.grad_buffer[offset : offset + n].view_as(p))

    def _balanced_writers(self) -> list[int]:
        """Group rank that writes each parameter to a checkpoint: largest first, to the
        rank with the fewest bytes so far (the same answer on every rank)."""
        load = [0] * self.size
        writers = [0] * len(self.params)
        for i in sorted(range(len(self.params)), key=lambda i: (-self.numels[i], i)):
            writer = min(range(self.size), key=lambda r: (load[r], r))
            writers[i] = writer
            load[writer] += self.numels[i]
        return writers

    def global_rank(self, group_rank: int) -> int:
        return (
            dist.get_global_rank(self.group, group_rank) if self.group is not None else group_rank
        )

    def owned(self, flat: Tensor, index: int) -> tuple[Tensor, slice] | None:
        """(the part of parameter ``index`` inside ``flat`` (a range-sized tensor), the
        matching slice of the flattened parameter), or None without overlap."""
        if index not in self.overlap_of:
            return None
        a, b = self.overlap_of[index]
        off = self.offsets[index]
        return flat[a - self.lo : b - self.lo], slice(a - off, b - off)


class DistributedAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` over ``partitions`` (``(model parameters, data-parallel group,
    name)``) with gradients reduce-scattered and fp32 main parameters and moments
    sharded over each group; see the module docstring.

    The engine calls `install_grad_hooks` once, lets backward fill the grad buffers,
    reduces whatever else needs reducing on the whole gradients (`grad_of`), then
    `reduce_scatter_grads`, `grad_squares` (for the norm) and `step`."""

    def __init__(
        self,
        partitions: Sequence[tuple[list[Tensor], Any, str]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        self.partitions = [
            _Partition(list(ps), group, name) for ps, group, name in partitions if ps
        ]
        if not self.partitions:
            raise ValueError("DistributedAdamW got no parameters")
        self._where = {
            id(p): (part, i) for part in self.partitions for i, p in enumerate(part.params)
        }
        self._hooks: list[Any] = []
        super().__init__(
            [part.main for part in self.partitions],
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
        )
        for part in self.partitions:  # the state a first step would create, made now
            self.state[part.main] = {
                "step": torch.tensor(0.0),
                **{k: torch.zeros_like(part.main, memory_format=torch.preserve_format)
                   for k in STATE_KEYS},
            }  # fmt: skip

    # ---- gradients --------------------------------------------------------------------
    def install_grad_hooks(self) -> None:
        """Add every model gradient into the fp32 grad buffer as it is produced (and free
        it), so micro-batches accumulate in fp32."""
        if self._hooks:
            return
        for part in self.partitions:
            for index, p in enumerate(part.params):

                def accumulate(param: Tensor, part: _Partition = part, index: int = index) -> None:
                    part.grad_views[index].add_(param.grad)
                    param.grad = None

                self._hooks.append(p.register_post_accumulate_grad_hook(accumulate))

    def remove_grad_hooks(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []

    def grad_of(self, param: Tensor) -> Tensor:
        """The whole (not yet reduce-scattered) fp32 gradient of model parameter ``param``."""
        part, index = self._where[id(param)]
        return part.grad_views[index]

    def reduce_scatter_grads(self) -> None:
        """Sum the grad buffers over each partition's group; each rank keeps (and steps)
        the reduced gradients of its range, as the main parameters' ``.grad``."""
        for part in self.partitions:
            owned = part.grad_buffer[part.lo : part.hi]
            if part.size > 1:  # in place: the output is this rank's chunk of the input
                _collective(
                    dist.reduce_scatter_tensor,
                    owned,
                    part.grad_buffer,
                    group=part.group,
                    what=f"reduce-scatter of the {part.name} gradients",
                )
            part.main.grad = owned

    def set_norm_params(self, counted: Iterable[Tensor]) -> None:
        """The model parameters whose gradients count in the grad norm on this rank (each
        tensor- or expert-parallel replica once); see `grad_squares`."""
        ids = {id(p) for p in counted}
        for part in self.partitions:
            ranges: list[tuple[int, int]] = []
            for index, a, b in part.overlaps:
                if id(part.params[index]) not in ids:
                    continue
                if ranges and ranges[-1][1] == a - part.lo:
                    ranges[-1] = (ranges[-1][0], b - part.lo)
                else:
                    ranges.append((a - part.lo, b - part.lo))
            part.counted = ranges

    def grad_squares(self, device: torch.device) -> Tensor:
        """This rank's float64 sum of squared reduced gradients over its ranges of the
        counted parameters (after `reduce_scatter_grads`)."""
        total = torch.zeros((), dtype=torch.float64, device=device)
        for part in self.partitions:
            grad = part.main.grad
            for a, b in part.counted:
                total += grad[a:b].double().pow(2).sum()
        return total

    def main_params(self) -> list[Tensor]:
        """The fp32 main parameters of this rank's ranges (their ``.grad``: the reduced
        gradients), what clipping scales and the optimizer steps."""
        return [part.main for part in self.partitions]

    # ---- step -------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("DistributedAdamW.step does not take a closure")
        for part in self.partitions:
            if part.main.grad is None:
                raise RuntimeError(
                    "DistributedAdamW.step before reduce_scatter_grads: the main parameters "
                    "have no reduced gradients"
                )
        super().step()
        self.publish()
        return None

    @torch.no_grad()
    def publish(self) -> None:
        """Cast this rank's main range into the parameter buffer and all-gather every
        rank's range (in the model dtype), so each rank holds the whole model."""
        for part in self.partitions:
            owned = part.param_buffer[part.lo : part.hi]
            if not part.main_is_view:
                owned.copy_(part.main)
            if part.size > 1:  # in place: the input is this rank's chunk of the output
                _collective(
                    dist.all_gather_into_tensor,
                    part.param_buffer,
                    owned,
                    group=part.group,
                    what=f"all-gather of the updated {part.name} parameters",
                )

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the grad buffers (they stay allocated) and drop the main gradients."""
        for part in self.partitions:
            part.main.grad = None
            part.grad_buffer.zero_()
            for p in part.params:
                p.grad = None

    # ---- weights: load, export, checkpoint --------------------------------------------
    def holds(self, param: Tensor) -> bool:
        return id(param) in self._where

    @torch.no_grad()
    def write(self, param: Tensor, value: Tensor) -> None:
        """Set model parameter ``param`` to ``value`` (e.g. a Hugging Face weight): the
        model gets it rounded to its dtype, the main range the exact values."""
        part, index = self._where[id(param)]
        param.copy_(value)
        if part.main_is_view:
            return
        owned = part.owned(part.main, index)
        if owned is not None:
            target, positions = owned
            target.copy_(value.reshape(-1)[positions])

    @torch.no_grad()
    def full_flat(self, param: Tensor, key: str, dst: int | None = None) -> Tensor | None:
        """The whole flat fp32 ``key`` ("param": the main value; or an AdamW moment) of
        model parameter ``param``, assembled from every rank's range: a collective over
        its partition's group. ``dst`` (a group rank): only that rank gets it (the others
        None); None: every rank."""
        part, index = self._where[id(param)]
        if key == "param" and part.main_is_view:
            return param.detach().reshape(-1)
        source = part.main if key == "param" else self.state[part.main][key]
        off, n = part.offsets[index], part.numels[index]
        if part.size == 1:
            return source[off : off + n]
        full = torch.zeros(n, dtype=torch.float32, device=part.param_buffer.device)
        if index in part.overlap_of:
            a, b = part.overlap_of[index]
            full[a - off : b - off].copy_(source[a - part.lo : b - part.lo])
        what = f"gather of {key} of a {part.name} parameter"
        if dst is None:
            _collective(dist.all_reduce, full, group=part.group, what=what)
            return full
        _collective(dist.reduce, full, dst=part.global_rank(dst), group=part.group, what=what)
        return full if part.rank == dst else None

    def writer_of(self, param: Tensor) -> tuple[bool, int]:
        """(whether this rank writes ``param`` to a checkpoint, the writer's group rank)."""
        part, index = self._where[id(param)]
        return part.writers[index] == part.rank, part.writers[index]

    def group_rank_of(self, param: Tensor) -> int:
        return self._where[id(param)][0].rank

    def needs(self, param: Tensor) -> bool:
        """Whether this rank's range overlaps ``param`` (it needs its full values on load)."""
        part, index = self._where[id(param)]
        return index in part.overlap_of

    @torch.no_grad()
    def load_full(self, param: Tensor, key: str, value: Tensor) -> None:
        """Take this rank's range of the full ``value`` of ``key`` ("param" or a moment)
        of model parameter ``param`` (`publish` then fills the model)."""
        part, index = self._where[id(param)]
        source = part.main if key == "param" else self.state[part.main][key]
        owned = part.owned(source, index)
        if owned is not None:
            target, positions = owned
            target.copy_(value.reshape(-1)[positions])

    def set_step(self, step: float) -> None:
        for part in self.partitions:
            self.state[part.main]["step"] = torch.tensor(float(step))

    def step_count(self) -> float:
        return float(self.state[self.partitions[0].main]["step"])

    # ---- memory -----------------------------------------------------------------------
    def relocate(self, device: torch.device | str) -> None:
        """Move buffers, main parameters and state to ``device`` (offload/onload); the
        model parameters keep viewing the parameter buffer."""
        for part in self.partitions:
            part.param_buffer = part.param_buffer.to(device)
            part.grad_buffer = part.grad_buffer.to(device)
            part._view_params()
            owned = part.param_buffer[part.lo : part.hi]
            part.main.data = owned if part.main_is_view else part.main.data.to(device)
            state = self.state[part.main]
            for key in STATE_KEYS:
                state[key] = state[key].to(device)

    def close(self) -> None:
        self.remove_grad_hooks()
