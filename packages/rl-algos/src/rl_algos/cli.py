"""The ``rl`` command.

    rl train CONFIG.yaml [key=value ...]     # train; resume with trainer.resume=latest
    rl train CONFIG.yaml --dry-run           # check the config, print it and the placement
    rl eval  CONFIG.yaml [--model M] [key=value ...]  # validation metrics; M: a checkpoint
                                             # (step_N, run dir) or an exported/HF model dir
    rl export CHECKPOINT OUT_DIR [--model HF_DIR] [--dtype D] [--merge-lora]  # HF model dir
    rl data  TASK --out DIR [options]        # write a generated task as parquet/jsonl

User errors exit 2 with one line, others 1 (``--debug``: traceback); SIGINT/SIGTERM exit
128 + signal after a clean shutdown (README "Errors"); what a forced exit leaves, the
embedded Ray's watchdog (`rl_core.single_controller.ray.ensure_ray`) removes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Iterator, Sequence

from rl_algos.errors import ConfigError

__all__ = ["main"]

SHUTDOWN_GRACE_S = 20.0  # after a stop signal: longest clean shutdown before a hard exit
# the stop signals received (a `ray.get` that a signal interrupts raises a KeyboardInterrupt
# of its own, without the StopSignal's number)
_RECEIVED: list[int] = []


class StopSignal(KeyboardInterrupt):
    """SIGINT or SIGTERM, raised in the main thread; a KeyboardInterrupt, so no
    ``except Exception`` swallows it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


@contextlib.contextmanager
def _stop_on_signals(command: str) -> Iterator[None]:
    """SIGINT/SIGTERM raise `StopSignal` (so ``finally`` blocks shut down the workers);
    a second one, or `SHUTDOWN_GRACE_S` without finishing, ends the process at once."""
    stopping: list[int] = []

    def hard_exit(signum: int, why: str) -> None:
        name = signal.Signals(signum).name
        print(f"rl {command}: {why} after {name}; exiting now", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    def handler(signum: int, frame: object) -> None:
        if stopping:
            hard_exit(signum, "second signal")
        stopping.append(signum)
        _RECEIVED.append(signum)
        fuse = threading.Timer(
            SHUTDOWN_GRACE_S, hard_exit, (signum, f"shutdown took over {SHUTDOWN_GRACE_S:.0f} s")
        )
        fuse.daemon = True
        fuse.start()
        raise StopSignal(signum)

    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


def _load(config_path: str, overrides: Sequence[str]):
    from rl_algos.config import check_plugins, load_config

    config = load_config(config_path, list(overrides))
    check_plugins(config)  # engine/rollout names: a config error before Ray or a worker starts
    return config


def _dry_run(config) -> int:
    """The resolved config and every role's pool, processes and devices; starts nothing."""
    from omegaconf import OmegaConf

    from rl_algos.trainer.placement_plan import check_role_configs, plan_placement

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a model name is never a download here
    roles = plan_placement(config)  # a placement that cannot fit fails here
    notes = check_role_configs(config)  # and so do the engines' and backends' options
    print(OmegaConf.to_yaml(config.to_dict()), end="")
    print(f"# placement (trainer.backend: {config.trainer.backend}); nothing was started")
    print("\n".join([f"#   {role}" for role in roles] + [f"# {note}" for note in notes]))
    return 0


def _train(config) -> int:
    from rl_algos.trainer.loop import RLTrainer  # the one trainer: LLM, VLM and VLA runs

    trainer = RLTrainer(config)
    try:
        history = trainer.fit()
    finally:
        trainer.close()
    if not history:  # resumed from a checkpoint at (or past) trainer.total_steps
        print(
            f"rl train: nothing to train: the run is at step {trainer.global_step} and "
            f"trainer.total_steps={config.trainer.total_steps} (raise it to train further)",
            file=sys.stderr,
        )
        return 0
    summary = {k: v for k, v in history[-1].items() if k.startswith(("val/", "critic/score"))}
    for key in ("val/accuracy", "val/success_rate"):
        first_val = next((h[key] for h in history if key in h), None)
        if first_val is not None:
            summary[f"{key}_first"] = first_val
    print(json.dumps({"output_dir": str(trainer.output_dir), **summary}, indent=1))
    return 0


def _eval(config) -> int:
    from rl_algos.trainer.loop import RLTrainer

    trainer = RLTrainer(config)
    try:
        if trainer._resume_from is not None:
            trainer._load_checkpoint(trainer._resume_from)
        metrics = trainer.validate()
    finally:
        trainer.close()
    if not metrics:
        print("no validation data: set data.val_files (or env.val_episodes)", file=sys.stderr)
        return 1
    print(json.dumps({"step": trainer.global_step, **metrics}, indent=1))
    return 0


def _export(args: argparse.Namespace) -> int:
    from rl_algos.export import export_checkpoint

    try:
        out = export_checkpoint(
            args.checkpoint,
            args.out_dir,
            model=args.model,
            dtype=args.dtype,
            overwrite=args.overwrite,
            merge_lora=args.merge_lora,
        )
    except (ValueError, FileNotFoundError, FileExistsError, NotImplementedError) as exc:
        print(f"rl export: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"exported": str(out)}))
    return 0


def _eval_model_override(model: str) -> list[str]:
    """``rl eval --model M``: a trainer checkpoint is resumed from; a model dir is used as is."""
    from rl_algos.export import locate_checkpoint

    path = os.path.abspath(os.path.expanduser(model))
    if os.path.isfile(os.path.join(path, "config.json")):
        return [f"model.path={path}"]
    source = locate_checkpoint(path)  # a step_N, checkpoints/ or run directory
    return [f"trainer.resume={source.engine_dir.parent}"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rl", description=__doc__.split("\n\n")[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument(
        "--debug", action="store_true", help="print tracebacks of errors (and debug logging)"
    )
    commands = parser.add_subparsers(dest="command", required=True)
    for name, func, text in (
        ("train", _train, "train with a YAML config and key=value overrides"),
        ("eval", _eval, "run validation (optionally of a checkpoint: trainer.resume=...)"),
    ):
        sub = commands.add_parser(name, help=text)
        sub.add_argument("config", help="YAML config file")
        sub.add_argument("overrides", nargs="*", help="key=value overrides")
        if name == "train":
            sub.add_argument(
                "--dry-run",
                action="store_true",
                help="check the config, print it resolved and the placement of every role, "
                "and exit without starting Ray or a worker",
            )
        if name == "eval":
            sub.add_argument(
                "--model",
                default=None,
                help="a trainer checkpoint (step_N or a run directory) or a model directory "
                "(e.g. from `rl export`) to evaluate",
            )
        sub.set_defaults(func=func)
    export = commands.add_parser(
        "export", help="write a Hugging Face model directory from a training checkpoint"
    )
    export.add_argument("checkpoint", help="<output_dir>/checkpoints/step_N, or a run directory")
    export.add_argument("out_dir", help="the model directory to write")
    export.add_argument(
        "--model",
        default=None,
        help="HF directory the checkpoint was trained from (bare engine "
        "checkpoints; trainer checkpoints record it)",
    )
    export.add_argument(
        "--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16")
    )
    export.add_argument("--overwrite", action="store_true", help="replace OUT_DIR")
    export.add_argument(
        "--merge-lora",
        action="store_true",
        help="LoRA checkpoints: write the full model with merged adapters (default: a PEFT "
        "adapter directory)",
    )
    export.set_defaults(func=None, run=_export)
    data = commands.add_parser("data", help="write a generated task (arithmetic, countdown)")
    data.add_argument("args", nargs=argparse.REMAINDER, help="see `rl data --help`")
    data.set_defaults(func=None)
    return parser


def _user_error_types() -> tuple[type[BaseException], ...]:
    from rl_algos.errors import USER_ERRORS
    from rl_core.checkpoint import CheckpointCorruptError
    from rl_core.registry import PluginLoadError, UnknownPluginError

    return (
        *USER_ERRORS,
        FileNotFoundError,
        NotADirectoryError,
        PermissionError,
        CheckpointCorruptError,
        UnknownPluginError,
        PluginLoadError,
    )


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if isinstance(exc, ValueError | RuntimeError) else f"{type(exc).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["data"]:
        from rl_algos.data.generate import main as data_main

        return data_main(argv[1:], prog="rl data")
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose or args.debug else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # see rl_algos.trainer
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.command == "export":
        return args.run(args)
    user_errors = _user_error_types()
    try:
        overrides = list(args.overrides)
        if getattr(args, "model", None):
            overrides += _eval_model_override(args.model)
        config = _load(args.config, overrides)
        if getattr(args, "dry_run", False):
            return _dry_run(config)
        with _stop_on_signals(args.command):
            return args.func(config)
    except (*user_errors, KeyError, TypeError, ValueError) as exc:
        if args.debug:
            traceback.print_exc()
        kind = "config error" if isinstance(exc, ConfigError) else "error"
        if not isinstance(exc, user_errors) and not _from_config(exc):
            print(f"rl {args.command}: error: {_one_line(exc)}{_HINT}", file=sys.stderr)
            return 1
        print(f"rl {args.command}: {kind}: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as stop:  # a StopSignal, or Ray's own for a signal in ray.get
        signum = getattr(stop, "signum", _RECEIVED[-1] if _RECEIVED else signal.SIGINT)
        print(
            f"rl {args.command}: stopped by {signal.Signals(signum).name}; the workers and "
            "Ray were shut down",
            file=sys.stderr,
        )
        return 128 + signum
    except Exception as exc:
        if args.debug:
            traceback.print_exc()
        cause = _user_cause(exc, user_errors)
        if cause is not None:  # raised in a worker, re-raised here by Ray
            print(f"rl {args.command}: error: {_one_line(cause)}", file=sys.stderr)
            return 2
        print(f"rl {args.command}: error: {_one_line(exc)}{_HINT}", file=sys.stderr)
        return 1


_HINT = " (run with --debug for the traceback)"


def _from_config(exc: BaseException) -> bool:
    """Whether `exc` came out of loading the config (where every error is the user's)."""
    tb = exc.__traceback__
    while tb is not None:
        if (
            tb.tb_frame.f_code.co_name == "_load"
            and tb.tb_frame.f_globals.get("__name__") == __name__
        ):
            return True
        tb = tb.tb_next
    return False


def _user_cause(exc: BaseException, types: tuple[type[BaseException], ...]) -> BaseException | None:
    """A user-input error inside `exc` (its cause chain, a worker group's `original`
    exception, or Ray's wrapped `cause`)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, types):
            return current
        inner = getattr(current, "original", None) or getattr(current, "cause", None)
        current = inner or current.__cause__
    return None


if __name__ == "__main__":
    sys.exit(main())
