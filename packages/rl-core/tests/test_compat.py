"""rl_core.compat: sibling packages refuse an rl-core outside their declared range."""

from __future__ import annotations

import pytest

from rl_core.compat import IncompatibleCoreError, check_core_range, require_core

REQ = ["rl-core[ray]<0.2,>=0.1", "pyarrow>=15", "rl-core>=9; extra == 'future'"]


@pytest.mark.parametrize(
    ("core", "ok"),
    [("0.1.0", True), ("0.1.7", True), ("0.2.0", False), ("0.0.9", False), ("1.0.0", False)],
)
def test_range_is_enforced(core, ok):
    if ok:
        check_core_range("rl-algos", "0.1.0", REQ, core)
        return
    with pytest.raises(IncompatibleCoreError) as info:
        check_core_range("rl-algos", "0.1.0", REQ, core)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"rl-algos 0.1.0 requires rl-core<0.2,>=0.1 but rl-core {core} ")


def test_compatible_release_and_exclusions():
    check_core_range("x", "1", ["rl-core~=0.1.2"], "0.1.5")
    with pytest.raises(IncompatibleCoreError):
        check_core_range("x", "1", ["rl-core~=0.1.2"], "0.2.0")
    with pytest.raises(IncompatibleCoreError):
        check_core_range("x", "1", ["rl-core!=0.1.3"], "0.1.3")


def test_installed_packages_are_compatible():
    require_core("rl-core")  # no rl-core requirement of its own: nothing to check
    require_core("no-such-distribution")  # no metadata: a no-op
