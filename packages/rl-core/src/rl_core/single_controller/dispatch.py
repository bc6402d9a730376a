"""`@register` and the dispatch modes: how one controller call becomes N worker calls.

A dispatch mode has two halves. *Dispatch* turns the controller's arguments into one
``(args, kwargs)`` per rank and *collect* turns the ranks' outputs into the call's result:

=====================  =============================================  ==========================
mode                   each rank receives                             the call returns
=====================  =============================================  ==========================
``ONE_TO_ALL``         the same arguments                             list of every output
``RANK_ZERO``          (rank 0 only) the arguments                    rank 0's output
``ALL_TO_ALL``         element ``rank`` of every argument (lists of   list of every output
                       length world_size)
``DP_COMPUTE``         same as ALL_TO_ALL: data-parallel work on      list of every output
                       data already split into one item per rank
``DP_COMPUTE_PROTO``   one chunk of every DataProto argument (padded  the chunks' outputs
                       to a multiple of world_size, see ``pad``)      concatenated, unpadded
``Dispatch.mesh(n)``   the chunk of its DP group in mesh ``n``        collect ranks' outputs,
                       (workers declare it: ``set_dispatch_mesh``)    in DP order, unpadded
=====================  =============================================  ==========================

Your own pair is registered by name with `register_dispatch_mode`. Bad arguments raise
`DispatchError` on the driver before anything is sent.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rl_core.protocol import DataProto
from rl_core.protocol_checks import describe, merge_meta_info
from rl_core.single_controller.errors import DispatchError
from rl_core.single_controller.futures import GroupFuture

__all__ = [
    "Collector",
    "Dispatch",
    "DispatchContext",
    "Execute",
    "FromFuture",
    "MeshDispatch",
    "MeshLayout",
    "MethodSpec",
    "register",
    "register_dispatch_mode",
]

SPEC_ATTR = "__rl_method_spec__"


class Dispatch(StrEnum):
    """Built-in dispatch modes (see the module docstring); ``Dispatch.mesh(name)`` for meshes."""

    ONE_TO_ALL = "one_to_all"
    ALL_TO_ALL = "all_to_all"
    RANK_ZERO = "rank_zero"
    DP_COMPUTE = "dp_compute"
    DP_COMPUTE_PROTO = "dp_compute_proto"

    @staticmethod
    def mesh(name: str) -> MeshDispatch:
        """DataProto dispatch by the DP layout workers declared for mesh `name`."""
        return MeshDispatch(name)


class Execute(StrEnum):
    """Which ranks run the method: all of them or rank 0 only."""

    ALL = "all"
    RANK_ZERO = "rank_zero"


@dataclass(frozen=True)
class MeshDispatch:
    """Dispatch mode of ``Dispatch.mesh(mesh_name)``."""

    mesh_name: str

    def __post_init__(self) -> None:
        if not isinstance(self.mesh_name, str) or not self.mesh_name:
            raise ValueError(f"Dispatch.mesh needs a non-empty mesh name, got {self.mesh_name!r}")


DispatchMode = Dispatch | MeshDispatch | str


@dataclass(frozen=True)
class MethodSpec:
    """What `@register` records on a worker method."""

    dispatch_mode: DispatchMode
    execute_mode: Execute
    blocking: bool
    pad: bool


def register(
    dispatch_mode: DispatchMode = Dispatch.ONE_TO_ALL,
    execute_mode: Execute = Execute.ALL,
    blocking: bool = True,
    pad: bool = True,
) -> Callable[[Callable], Callable]:
    """Make a worker method callable from its worker group.

    dispatch_mode: a `Dispatch` member, ``Dispatch.mesh(name)`` or the name of a mode
        registered with `register_dispatch_mode`.
    execute_mode: ``Execute.RANK_ZERO`` runs the method on rank 0 only (with ONE_TO_ALL
        or RANK_ZERO dispatch). ``Dispatch.RANK_ZERO`` implies it.
    blocking: False makes the group method return a `GroupFuture` at once; pass it to
        the next call as an argument (the data then moves worker to worker) or call
        ``.result()``.
    pad: for DataProto modes, pad the batch to a multiple of the DP size by repeating rows
        from the start and drop the padding from the output (so the method must return one
        row per input row). With ``pad=False`` the chunks may differ in size by one row,
        and a batch with fewer rows than DP ranks is an error.
    """
    if isinstance(dispatch_mode, str) and not isinstance(dispatch_mode, Dispatch):
        dispatch_mode = _builtin_by_value(dispatch_mode) or dispatch_mode
    if not isinstance(dispatch_mode, Dispatch | MeshDispatch | str):
        raise TypeError(
            f"register: dispatch_mode must be a Dispatch member, Dispatch.mesh(name) or the "
            f"name of a registered mode, got {dispatch_mode!r}"
        )
    execute_mode = Execute(execute_mode)
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO
    if (
        execute_mode is Execute.RANK_ZERO
        and dispatch_mode is not Dispatch.ONE_TO_ALL
        and (dispatch_mode is not Dispatch.RANK_ZERO)
    ):
        raise ValueError(
            f"register: execute_mode=RANK_ZERO works with ONE_TO_ALL or RANK_ZERO dispatch, "
            f"not {dispatch_mode!r}"
        )
    spec = MethodSpec(dispatch_mode, execute_mode, bool(blocking), bool(pad))

    def decorate(method: Callable) -> Callable:
        if not callable(method):
            raise TypeError(f"@register decorates methods, got {method!r}")
        setattr(method, SPEC_ATTR, spec)
        return method

    return decorate


def method_spec(method: Any) -> MethodSpec | None:
    return getattr(method, SPEC_ATTR, None)


def _builtin_by_value(value: str) -> Dispatch | None:
    try:
        return Dispatch(value)
    except ValueError:
        return None


# ---------------------------------------------------------------------------- context


@dataclass(frozen=True)
class MeshLayout:
    """The DP layout of one role's workers in one mesh, validated."""

    name: str
    dp_size: int
    dp_ranks: tuple[int, ...]
    """DP rank of every worker rank."""
    collect_ranks: tuple[int, ...]
    """The collect rank of every DP rank, in DP order."""

    @classmethod
    def from_declarations(cls, role: str, name: str, declared: Sequence[Any]) -> MeshLayout:
        """Build from each rank's `MeshRank` (or None); raise DispatchError when inconsistent."""
        missing = [rank for rank, d in enumerate(declared) if d is None]
        if missing:
            raise DispatchError(
                f"{role!r} rank(s) {missing} did not declare dispatch mesh {name!r}: call "
                f"self.set_dispatch_mesh({name!r}, dp_rank=..., dp_size=..., is_collect=...) "
                "on every worker before the first call of a Dispatch.mesh method"
            )
        sizes = sorted({d.dp_size for d in declared})
        if len(sizes) != 1:
            raise DispatchError(f"{role!r} mesh {name!r}: ranks disagree on dp_size: {sizes}")
        dp_size = sizes[0]
        collect: dict[int, list[int]] = {dp: [] for dp in range(dp_size)}
        members: dict[int, list[int]] = {dp: [] for dp in range(dp_size)}
        for rank, d in enumerate(declared):
            members[d.dp_rank].append(rank)
            if d.is_collect:
                collect[d.dp_rank].append(rank)
        empty = [dp for dp, ranks in members.items() if not ranks]
        if empty:
            raise DispatchError(f"{role!r} mesh {name!r}: no worker has dp_rank {empty}")
        for dp, ranks in collect.items():
            if len(ranks) != 1:
                raise DispatchError(
                    f"{role!r} mesh {name!r}: dp_rank {dp} has {len(ranks)} collect ranks "
                    f"{ranks} (workers {members[dp]}); exactly one must set is_collect=True"
                )
        return cls(
            name=name,
            dp_size=dp_size,
            dp_ranks=tuple(d.dp_rank for d in declared),
            collect_ranks=tuple(collect[dp][0] for dp in range(dp_size)),
        )


@dataclass
class DispatchContext:
    """What a dispatch/collect function knows about the call."""

    role: str
    method: str
    world_size: int
    pad: bool
    mesh: MeshLayout | None = None
    state: dict[str, Any] = field(default_factory=dict)
    """Scratch space a dispatch function may fill for its collect function."""


# ---------------------------------------------------------------------------- collect


@dataclass(frozen=True)
class Collector:
    """How the outputs of `ranks` (in that order) become the call's result. Picklable.

    kind: ``list`` (the outputs), ``first`` (the only output), ``proto`` (DataProtos
    concatenated, then the dispatch padding removed), ``custom`` (a registered collect
    function).
    """

    kind: str
    ranks: tuple[int, ...]
    role: str
    method: str
    fn: Callable[[DispatchContext, list], Any] | None = None
    ctx: DispatchContext | None = None

    def combine(self, outputs: list[Any], metas: list[dict[str, Any]]) -> Any:
        if self.kind == "list":
            return list(outputs)
        if self.kind == "first":
            return outputs[0]
        if self.kind == "proto":
            for rank, out in zip(self.ranks, outputs):
                if not isinstance(out, DataProto):
                    raise DispatchError(
                        f"{self.role!r} {self.method}() is collected as DataProto chunks but "
                        f"rank {rank} returned {describe(out)}"
                    )
            pad = int(metas[0].get("pad") or 0) if metas else 0
            merged = DataProto.concat(outputs) if len(outputs) > 1 else outputs[0]
            if merged.is_readonly and not merged.zero_copy_receive:
                merged.materialize()  # received mapped (`receive_mapped`) but not copied
            return merged.unpad(pad) if pad else merged
        if self.kind == "custom":
            assert self.fn is not None and self.ctx is not None
            return self.fn(self.ctx, list(outputs))
        raise ValueError(f"unknown collector kind {self.kind!r}")


def output_meta(output: Any, pad: int | None) -> dict[str, Any]:
    """The small description of one rank's output that travels beside it."""
    if isinstance(output, DataProto):
        return {"len": len(output), "pad": pad, "meta_info": output.meta_info}
    return {"len": None, "pad": pad, "meta_info": None}


def merged_meta_info(metas: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return merge_meta_info((m["meta_info"] or {} for m in metas), "DataProto.concat")


# ---------------------------------------------------------------------------- futures as args


@dataclass(frozen=True)
class FromFuture:
    """Placeholder for a `GroupFuture` argument, resolved where the worker runs.

    kind ``dp_slice``: this rank's DP chunk of the future's DataProto (``dp_rank`` of
    ``dp_size``, padded when ``pad``); ``whole``: the future's full result; ``element``:
    output ``index`` of a list-collected future (passed through without a copy).
    """

    future: GroupFuture
    kind: str
    dp_rank: int = 0
    dp_size: int = 1
    pad: bool = True
    index: int = 0


def dp_rows(total: int, dp_rank: int, dp_size: int, pad: bool) -> tuple[list[tuple[int, int]], int]:
    """Logical row ranges of DP chunk `dp_rank` and the pad size, as dispatch computes them.

    Same result as ``data.pad_to_divisor(dp_size)`` (pad rows repeat rows from the start,
    wrapping) followed by ``chunk(dp_size)``, for a batch of `total` rows.
    """
    if total <= 0:
        raise DispatchError("a DataProto future argument has no rows")
    if pad:
        pad_size = -total % dp_size
    else:
        pad_size = 0
        if total < dp_size:
            raise DispatchError(
                f"a DataProto future argument has {total} rows, fewer than the {dp_size} "
                "data-parallel ranks, and padding is disabled (register(..., pad=False))"
            )
    base, extra = divmod(total + pad_size, dp_size)
    start = dp_rank * base + min(dp_rank, extra)
    stop = start + base + (1 if dp_rank < extra else 0)
    ranges, i = [], start
    while i < stop:
        if i < total:
            end = min(stop, total)
            ranges.append((i, end))
        else:
            src = (i - total) % total
            end = min(stop, i + total - src)
            ranges.append((src, src + end - i))
        i = end
    return ranges, pad_size


# ---------------------------------------------------------------------------- built-in modes

PerRank = list[tuple[tuple, dict]]


def _named_args(args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    return [(f"argument {i}", a) for i, a in enumerate(args)] + [
        (f"argument {k!r}", v) for k, v in kwargs.items()
    ]


def _rebuild(args: tuple, kwargs: dict, values: list[Any]) -> tuple[tuple, dict]:
    n = len(args)
    return tuple(values[:n]), dict(zip(kwargs, values[n:]))


def _one_to_all(ctx: DispatchContext, args: tuple, kwargs: dict) -> PerRank:
    values = [
        FromFuture(v, "whole") if isinstance(v, GroupFuture) else v
        for _, v in _named_args(args, kwargs)
    ]
    one = _rebuild(args, kwargs, values)
    return [one] * ctx.world_size


def _all_to_all(ctx: DispatchContext, args: tuple, kwargs: dict) -> PerRank:
    mode = ctx.state.get("mode_name", "ALL_TO_ALL")
    columns = []
    for name, value in _named_args(args, kwargs):
        if isinstance(value, GroupFuture):
            collector = value.collector
            if collector.kind != "list" or len(collector.ranks) != ctx.world_size:
                raise DispatchError(
                    f"{ctx.role!r} {ctx.method}() ({mode}): {name} is a future of "
                    f"{value.describe()}; {mode} needs a list with one element per rank "
                    f"({ctx.world_size})"
                )
            columns.append([FromFuture(value, "element", index=i) for i in range(ctx.world_size)])
        elif isinstance(value, list | tuple) and len(value) == ctx.world_size:
            columns.append(list(value))
        else:
            got = (
                f"a {type(value).__name__} of length {len(value)}"
                if isinstance(value, list | tuple)
                else describe(value)
            )
            raise DispatchError(
                f"{ctx.role!r} {ctx.method}() ({mode}): {name} must be a list with one "
                f"element per rank (world_size={ctx.world_size}), got {got}"
            )
    return [
        _rebuild(args, kwargs, [column[rank] for column in columns])
        for rank in range(ctx.world_size)
    ]


def _dp_compute(ctx: DispatchContext, args: tuple, kwargs: dict) -> PerRank:
    ctx.state["mode_name"] = "DP_COMPUTE"
    return _all_to_all(ctx, args, kwargs)


def _dp_proto(ctx: DispatchContext, args: tuple, kwargs: dict) -> PerRank:
    """Chunk every DataProto argument by DP rank (the mesh's when there is one)."""
    mesh = ctx.mesh
    dp_size = mesh.dp_size if mesh is not None else ctx.world_size
    dp_of_rank = mesh.dp_ranks if mesh is not None else tuple(range(ctx.world_size))
    mode = f"Dispatch.mesh({mesh.name!r})" if mesh is not None else "DP_COMPUTE_PROTO"
    named = _named_args(args, kwargs)
    if not named:
        raise DispatchError(f"{ctx.role!r} {ctx.method}() ({mode}) needs a DataProto argument")
    lengths = {}
    for name, value in named:
        if isinstance(value, GroupFuture):
            if value.collector.kind != "proto":
                raise DispatchError(
                    f"{ctx.role!r} {ctx.method}() ({mode}): {name} is a future of "
                    f"{value.describe()}, not of a DataProto"
                )
        elif isinstance(value, DataProto):
            lengths[name] = len(value)
        else:
            raise DispatchError(
                f"{ctx.role!r} {ctx.method}() ({mode}) splits every argument by DP rank, but "
                f"{name} is {describe(value)}; pass DataProtos (put scalars in meta_info) "
                "or use a ONE_TO_ALL method"
            )
    if len(set(lengths.values())) > 1:
        raise DispatchError(
            f"{ctx.role!r} {ctx.method}() ({mode}): DataProto arguments differ in length: "
            + ", ".join(f"{k} has {n} rows" for k, n in lengths.items())
        )
    ctx.state["rows"] = next(iter(lengths.values()), None)
    columns, pad_size = [], None
    for name, value in named:
        if isinstance(value, GroupFuture):
            columns.append(
                [FromFuture(value, "dp_slice", dp, dp_size, ctx.pad) for dp in range(dp_size)]
            )
            continue
        if len(value) == 0:
            raise DispatchError(f"{ctx.role!r} {ctx.method}() ({mode}): {name} has no rows")
        if ctx.pad:
            value, pad_size = value.pad_to_divisor(dp_size)
        else:
            pad_size = 0
            if len(value) < dp_size:
                raise DispatchError(
                    f"{ctx.role!r} {ctx.method}() ({mode}): {name} has {len(value)} rows, "
                    f"fewer than the {dp_size} data-parallel ranks, and padding is disabled "
                    "(register(..., pad=False)); send at least one row per DP rank"
                )
        columns.append(value.chunk(dp_size))
    ctx.state["pad"] = pad_size  # None when only futures: the workers compute it
    return [
        _rebuild(args, kwargs, [column[dp_of_rank[rank]] for column in columns])
        for rank in range(ctx.world_size)
    ]


@dataclass(frozen=True)
class ModeImpl:
    name: str
    dispatch: Callable[..., PerRank]
    collect: Callable[[DispatchContext, list], Any] | None = None
    builtin: bool = True
    mesh_name: str | None = None

    def collector(
        self, ctx: DispatchContext, executed: Sequence[int], rank_zero_only: bool
    ) -> Collector:
        if not self.builtin:
            return Collector("custom", tuple(executed), ctx.role, ctx.method, self.collect, ctx)
        if self.name in ("dp_compute_proto", "mesh"):
            ranks = ctx.mesh.collect_ranks if ctx.mesh is not None else tuple(executed)
            return Collector("proto", tuple(ranks), ctx.role, ctx.method)
        if rank_zero_only:
            return Collector("first", tuple(executed), ctx.role, ctx.method)
        return Collector("list", tuple(executed), ctx.role, ctx.method)


_BUILTIN = {
    Dispatch.ONE_TO_ALL: ModeImpl("one_to_all", _one_to_all),
    Dispatch.RANK_ZERO: ModeImpl("rank_zero", _one_to_all),
    Dispatch.ALL_TO_ALL: ModeImpl("all_to_all", _all_to_all),
    Dispatch.DP_COMPUTE: ModeImpl("dp_compute", _dp_compute),
    Dispatch.DP_COMPUTE_PROTO: ModeImpl("dp_compute_proto", _dp_proto),
}
_CUSTOM: dict[str, ModeImpl] = {}
_CUSTOM_LOCK = threading.Lock()


def register_dispatch_mode(
    name: str,
    dispatch_fn: Callable[..., PerRank],
    collect_fn: Callable[[DispatchContext, list], Any],
    *,
    overwrite: bool = False,
) -> None:
    """Add a dispatch mode usable as ``@register(dispatch_mode=name)``.

    ``dispatch_fn(ctx, *args, **kwargs)`` returns one ``(args, kwargs)`` per rank (a list of
    length ``ctx.world_size``); ``collect_fn(ctx, outputs)`` gets the outputs in rank order.
    Both run on the driver; `GroupFuture` arguments are materialised there first. Register
    the mode in every process that defines workers using it (e.g. at import of your module).
    """
    if not isinstance(name, str) or not name or _builtin_by_value(name) is not None:
        raise ValueError(f"dispatch mode name must be a new non-empty str, got {name!r}")
    if not callable(dispatch_fn) or not callable(collect_fn):
        raise TypeError("register_dispatch_mode needs callable dispatch_fn and collect_fn")
    with _CUSTOM_LOCK:
        if name in _CUSTOM and not overwrite:
            raise ValueError(f"dispatch mode {name!r} is already registered; pass overwrite=True")
        _CUSTOM[name] = ModeImpl(
            name,
            lambda ctx, args, kwargs: dispatch_fn(ctx, *args, **kwargs),
            collect_fn,
            builtin=False,
        )


def resolve_mode(mode: DispatchMode) -> ModeImpl:
    """The implementation of a dispatch mode; DispatchError naming the known ones if unknown."""
    if isinstance(mode, Dispatch):
        return _BUILTIN[mode]
    if isinstance(mode, MeshDispatch):
        return ModeImpl("mesh", _dp_proto, mesh_name=mode.mesh_name)
    with _CUSTOM_LOCK:
        if mode in _CUSTOM:
            return _CUSTOM[mode]
        known = sorted([m.value for m in Dispatch] + list(_CUSTOM))
    raise DispatchError(
        f"unknown dispatch mode {mode!r}; known: {', '.join(known)} or Dispatch.mesh(name). "
        "Register your own with register_dispatch_mode(name, dispatch_fn, collect_fn)"
    )


def check_per_rank(ctx: DispatchContext, mode: ModeImpl, per_rank: Any) -> PerRank:
    """Validate what a (custom) dispatch function returned."""
    if not isinstance(per_rank, list) or len(per_rank) != ctx.world_size:
        raise DispatchError(
            f"dispatch mode {mode.name!r} returned {describe(per_rank)}; expected a list of "
            f"{ctx.world_size} (args, kwargs) pairs, one per rank"
        )
    for rank, item in enumerate(per_rank):
        ok = isinstance(item, tuple) and len(item) == 2
        if not ok or not isinstance(item[0], tuple | list) or not isinstance(item[1], dict):
            raise DispatchError(
                f"dispatch mode {mode.name!r}: entry for rank {rank} is {describe(item)}; "
                "expected a (tuple_of_args, dict_of_kwargs) pair"
            )
    return [(tuple(a), dict(k)) for a, k in per_rank]
