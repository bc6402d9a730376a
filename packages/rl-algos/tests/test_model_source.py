"""Model references: tiny random models, HF directories, GGUF files and packages."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rl_algos.trainer import model_source
from rl_algos.trainer.model_source import cache_dir, resolve_model_path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("RL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


@pytest.fixture
def tiny_qwen2(cache) -> str:
    return resolve_model_path("tiny-random:qwen2")


def test_cache_dir_follows_the_environment(cache):
    assert cache_dir() == cache


@pytest.mark.parametrize("arch", ["qwen2", "llama", "mistral"])
def test_tiny_random_tokenizer_round_trips_text(cache, arch):
    from transformers import AutoTokenizer

    # AutoTokenizer picks a per-architecture class (Qwen2Tokenizer for qwen2): it must
    # still see one token per character, spaces and newlines included
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(f"tiny-random:{arch}"))
    text = "What is 12 + 30? Answer: \\boxed{42}.\nok ~|{}"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert len(ids) == len(text)  # one token per character
    assert tokenizer.decode(ids) == text
    assert len(tokenizer) == 4 + 95 + 1  # ChatML specials, printable ASCII, newline
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    messages = [{"role": "user", "content": "hi"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    encoded = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert encoded[0] == tokenizer.bos_token_id and tokenizer.eos_token_id in encoded
    assert tokenizer.decode(encoded, skip_special_tokens=True) == "user\nhi\nassistant\n"


def test_tiny_random_model_matches_its_tokenizer_and_is_reproducible(tiny_qwen2, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_qwen2)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    cfg = model.config
    assert cfg.model_type == "qwen2" and cfg.vocab_size == len(tokenizer)
    assert (cfg.hidden_size, cfg.num_hidden_layers) == (64, 2)
    assert cfg.eos_token_id == tokenizer.eos_token_id
    ids = torch.tensor([tokenizer("1+1=")["input_ids"]])
    logits = model(input_ids=ids).logits
    assert logits.shape == (1, 4, len(tokenizer)) and torch.isfinite(logits).all()
    # built again in another cache: the same weights (seeded), so CI runs are comparable
    other = tmp_path / "other"
    other.mkdir()
    model_source._build_tiny_random("qwen2", other / "m")
    again = AutoModelForCausalLM.from_pretrained(other / "m")
    for (name, a), (_, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert torch.equal(a, b), name


def test_tiny_random_is_built_once(tiny_qwen2):
    marker = Path(tiny_qwen2) / "config.json"
    before = marker.stat().st_mtime_ns
    assert resolve_model_path("tiny-random:qwen2") == tiny_qwen2
    assert marker.stat().st_mtime_ns == before
    assert not [p for p in Path(tiny_qwen2).parent.iterdir() if p.name.startswith(".")]


def test_tiny_random_unknown_architecture(cache):
    with pytest.raises(ValueError, match=r"tiny-random:gpt5.*expected one of \['llama'"):
        resolve_model_path("tiny-random:gpt5")
    assert not list(cache.glob("*gpt5*"))


def test_hf_directory_is_used_as_is(tiny_qwen2):
    assert resolve_model_path(tiny_qwen2) == tiny_qwen2


def test_missing_directory_names_the_reference_and_the_choices(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(FileNotFoundError, match=r"model.path .*no-such-model.*no config.json"):
        resolve_model_path(str(missing))
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="smollm2-135m-instruct"):
        resolve_model_path(str(tmp_path / "empty"))


def test_missing_gguf_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"GGUF file .*absent.gguf does not exist"):
        resolve_model_path(f"gguf:{tmp_path}/absent.gguf")


def test_gguf_package_that_is_not_installed():
    with pytest.raises(FileNotFoundError, match="no installed Python package 'no_such_pkg_rl'"):
        resolve_model_path("gguf:no_such_pkg_rl")


def test_gguf_package_without_exactly_one_gguf_file(tmp_path, monkeypatch):
    package = tmp_path / "two_ggufs_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("a.gguf", "b.gguf"):
        (package / name).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"exactly one .gguf.*\['a.gguf', 'b.gguf'\]"):
        resolve_model_path("gguf:two_ggufs_pkg")


def test_gguf_without_the_gguf_package_says_what_to_install(cache, tmp_path, monkeypatch):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"GGUF not really")
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if `gguf` were not installed
    with pytest.raises(ImportError, match=r"model.gguf needs the 'gguf' package.*pip install gguf"):
        resolve_model_path(f"gguf:{fake}")
    assert not [p for p in cache.iterdir() if p.name.startswith(("model-", ".model-"))]


# ---- hub ids through the local Hugging Face cache, and model paths on workers


def _place_in_hf_cache(hf_home: Path, repo_id: str, model_dir: str) -> Path:
    """The hub cache layout: models--org--name/{refs/main, snapshots/<commit>/files}."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = hf_home / "hub" / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(model_dir, snapshot)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hub_id_resolves_from_the_local_hf_cache(tiny_qwen2, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM

    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    snapshot = _place_in_hf_cache(tmp_path / "hf", "Qwen/Qwen2.5-0.5B-Instruct", tiny_qwen2)
    resolved = resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    assert Path(resolved) == snapshot
    model = AutoModelForCausalLM.from_pretrained(resolved)
    ref = AutoModelForCausalLM.from_pretrained(tiny_qwen2)
    assert torch.equal(model.lm_head.weight, ref.lm_head.weight)


def test_hub_id_missing_from_the_cache_names_id_and_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(FileNotFoundError) as info:
        resolve_model_path("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(info.value)
    assert "'Qwen/Qwen2.5-0.5B-Instruct'" in message
    assert str(tmp_path / "empty-cache") in message and "nothing is downloaded" in message


def test_worker_writes_shipped_files_when_the_driver_path_is_invisible(tiny_qwen2, cache):
    from transformers import AutoModelForCausalLM

    from rl_algos.trainer.model_source import pack_model_dir, resolve_on_worker

    assert resolve_on_worker(tiny_qwen2) == tiny_qwen2  # visible: used as is
    files = pack_model_dir(tiny_qwen2)
    local = resolve_on_worker("/other-node/only/model", "tiny-random:nope", files)
    assert Path(local).parent == cache and Path(local).name.startswith("shipped-")
    for name, data in files.items():
        assert (Path(local) / name).read_bytes() == data
    a = AutoModelForCausalLM.from_pretrained(local).state_dict()
    b = AutoModelForCausalLM.from_pretrained(tiny_qwen2).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in b)
    assert resolve_on_worker("/other-node/only/model", None, files) == local  # written once
    with pytest.raises(ValueError, match="escapes its directory"):
        resolve_on_worker("/x", None, {"../evil.json": b"{}", "config.json": b"{}"})


def test_worker_resolves_the_reference_itself(tmp_path, monkeypatch, tiny_qwen2):
    from rl_algos.trainer.model_source import resolve_on_worker

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    snapshot = _place_in_hf_cache(tmp_path / "hf", "org/tiny", tiny_qwen2)
    assert Path(resolve_on_worker("/driver/only/path", "org/tiny")) == snapshot
    with pytest.raises(FileNotFoundError, match="not visible on this worker"):
        resolve_on_worker("/driver/only/path")
