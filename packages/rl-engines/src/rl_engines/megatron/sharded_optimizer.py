"""AdamW with its state partitioned over data-parallel ranks (ZeRO-1), on any backend.

megatron-core's distributed optimizer needs CUDA; this one runs on gloo as well. The
parameters of each partition (dense parameters over the data-parallel group, expert
parameters over the expert-data-parallel group) are re-homed into one flat buffer, padded
to a multiple of the group size and cut into equal contiguous ranges, one per rank. A rank
keeps AdamW state (``exp_avg``, ``exp_avg_sq``) only for its range: the *main* parameters
of that range, float32 (a view of the buffer when the parameters are float32 themselves,
else a float32 copy that the buffer receives after each step). A step takes the already
reduced gradients of the range, runs `torch.optim.AdamW`'s own update on it (the same
per-element arithmetic as an AdamW over the whole parameters), then all-gathers the ranges
so every rank holds all updated parameters.

State dicts hold this rank's range only; they load back at the same layout.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["ShardedAdamW"]


class _Partition:
    """Parameters that share one data-parallel group, flattened into one buffer."""

    def __init__(self, params: list[Tensor], group: Any) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"one partition holds parameters of dtypes {sorted(map(str, dtypes))}")
        self.params, self.group = params, group
        self.size, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.numels = [p.numel() for p in params]
        self.total = sum(self.numels)
        self.chunk = -(-self.total // self.size)
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.buffer = torch.zeros(
            self.chunk * self.size, dtype=params[0].dtype, device=params[0].device
        )
        with torch.no_grad():
            for p, offset, n in zip(params, self.offsets, self.numels):
                self.buffer[offset : offset + n].copy_(p.detach().reshape(-1))
                p.data = self.buffer[offset : offset + n].view_as(p)
        self.lo = self.rank * self.chunk
        owned = self.buffer[self.lo : self.lo + self.chunk]
        self.main_is_view = owned.dtype == torch.float32
        self.main = nn.Parameter(owned if self.main_is_view else owned.float())

    def owned_grad(self) -> Tensor:
        """The reduced gradients of this rank's range, flat, float32 (zeros for padding
        and for parameters without a gradient)."""
        lo, hi = self.lo, self.lo + self.chunk
        grad = torch.zeros(self.chunk, dtype=torch.float32, device=self.buffer.device)
        for p, offset, n in zip(self.params, self.offsets, self.numels):
            a, b = max(lo, offset), min(hi, offset + n)
            if a < b and p.grad is not None:
                grad[a - lo : b - lo].copy_(p.grad.reshape(-1)[a - offset : b - offset])
        return grad

    def publish(self, timeout_what: str) -> None:
        """Write the updated range into the buffer and all-gather every rank's range."""
        owned = self.buffer[self.lo : self.lo + self.chunk]
        with torch.no_grad():
            if not self.main_is_view:
                owned.copy_(self.main)
            if self.size == 1:
                return
            ranges = list(self.buffer.chunk(self.size))
            try:
                dist.all_gather(ranges, owned.clone(), group=self.group)
            except Exception as exc:
                raise RuntimeError(
                    f"rank {dist.get_rank()}: all-gather of {timeout_what} failed: {exc}"
                ) from exc

    def reload_main(self) -> None:
        """Re-read the main parameters from the buffer (after the model was loaded)."""
        if not self.main_is_view:
            with torch.no_grad():
                self.main.copy_(self.buffer[self.lo : self.lo + self.chunk])

    def relocate(self, device: torch.device | str) -> None:
        """Move the buffer (and the parameters viewing it) to ``device``."""
        self.buffer = self.buffer.to(device)
        for p, offset, n in zip(self.params, self.offsets, self.numels):
            p.data = self.buffer[offset : offset + n].view_as(p)
        owned = self.buffer[self.lo : self.lo + self.chunk]
        self.main.data = owned if self.main_is_view else self.main.data.to(device)


class ShardedAdamW(torch.optim.AdamW):
    """`torch.optim.AdamW` over ``partitions`` (``(parameters, data-parallel group)``),
    each rank holding the state of a 1/group-size range of every partition.

    Gradients must be reduced (summed) over each group before `step`, as for a plain
    AdamW on replicated parameters; the result of `step` equals such an AdamW's.
    """

    def __init__(
        self,
        partitions: Sequence[tuple[list[Tensor], Any]],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
    ) -> None:
        self.partitions = [
            _Partition(list(params), group) for params, group in partitions if params
        ]
        if not self.partitions:
            raise ValueError("ShardedAdamW got no parameters")
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
                "exp_avg": torch.zeros_like(part.main, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(part.main, memory_format=torch.preserve_format),
            }

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("ShardedAdamW.step does not take a closure")
        for part in self.partitions:
            part.main.grad = part.owned_grad()
        super().step()
        for index, part in enumerate(self.partitions):
            part.main.grad = None
            part.publish(f"updated parameters (partition {index})")
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for part in self.partitions:
            for p in part.params:
                if set_to_none:
                    p.grad = None
                elif p.grad is not None:
                    p.grad.zero_()

    def owned_bytes(self) -> int:
        """Bytes of every tensor this optimizer owns on this rank: state, and main
        parameters where they are a copy."""
        total = sum(
            t.numel() * t.element_size()
            for state in self.state.values()
            for t in state.values()
            if isinstance(t, Tensor)
        )
        copies = [part.main for part in self.partitions if not part.main_is_view]
        return total + sum(t.numel() * t.element_size() for t in copies)

    def layout(self) -> list[tuple[int, int, int]]:
        """(group size, group rank, elements) per partition: what a state dict fits."""
        return [(part.size, part.rank, part.total) for part in self.partitions]

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state["layout"] = self.layout()
        state["main"] = [
            None if p.main_is_view else p.main.detach().clone() for p in self.partitions
        ]
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = dict(state_dict)
        layout = [tuple(entry) for entry in state.pop("layout")]
        mains = state.pop("main")
        if layout != self.layout():
            raise ValueError(
                f"rank {dist.get_rank()}: optimizer state of layout {layout} (group size, rank, "
                f"elements per partition) does not fit this engine's {self.layout()}"
            )
        super().load_state_dict(state)
        with torch.no_grad():
            for part, main in zip(self.partitions, mains):
                if main is not None:
                    part.main.copy_(main)
                else:
                    part.reload_main()

    def reload_main_params(self) -> None:
        """Re-read the main parameters from the model (after loading its weights)."""
        for part in self.partitions:
            part.reload_main()

    def relocate(self, device: torch.device | str) -> None:
        """Move parameters, main parameters and state to ``device`` (offload/onload)."""
        for part in self.partitions:
            part.relocate(device)
        for state in self.state.values():
            for key, value in state.items():
                if isinstance(value, Tensor) and key != "step":
                    state[key] = value.to(device)
