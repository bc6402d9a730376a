"""`rl_core.testing.standin.install` refuses a torch older than the oldest one its device
checks ran on (2.11, `nox -s tests-torch-floor`) in one line naming the installed version
and the one needed, before it changes anything in the process."""

from __future__ import annotations

import pytest
import torch
from torch.utils import backend_registration

from rl_core.platform import PLATFORMS
from rl_core.testing import standin


class _ReachedTorchHooks(Exception):
    """Raised instead of installing: the version check let this torch through."""


def _stop(**kwargs):
    raise _ReachedTorchHooks


@pytest.fixture
def fresh_process(monkeypatch):
    assert standin._DEVICE is None, "the suite's own process must not hold the stand-in"
    monkeypatch.setattr(backend_registration, "_setup_privateuseone_for_python_backend", _stop)


@pytest.mark.parametrize("version", ["2.10.1+cu128", "2.6.0", "2.9.0a0+git1234", "1.13.1"])
def test_install_refuses_a_torch_older_than_2_11(fresh_process, monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(RuntimeError) as refused:
        standin.install()
    assert str(refused.value) == (
        f"rl_core.testing.standin needs torch>=2.11; installed: torch {version}"
    )
    assert standin._DEVICE is None
    assert "standin" not in PLATFORMS.names()


@pytest.mark.parametrize("version", ["2.11.0", "2.11.0a0+gitabc", "2.15.0+cu132", "3.0.0"])
def test_install_accepts_torch_2_11_and_newer(fresh_process, monkeypatch, version):
    monkeypatch.setattr(torch, "__version__", version)
    with pytest.raises(_ReachedTorchHooks):
        standin.install()
    assert standin._DEVICE is None
