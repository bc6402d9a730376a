"""rl_core.compat: sibling packages refuse an rl-core outside their declared range."""

from __future__ import annotations

import pytest

from rl_core.compat import (
    IncompatibleCoreError,
    InvalidCoreRangeError,
    check_core_range,
    require_core,
)

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


# Every PEP 440 operator and version form, against packaging's reference answers
# worked out by hand from PEP 440 (these forms were skipped by the regex checker).
@pytest.mark.parametrize(
    ("requirement", "core", "ok"),
    [
        ("rl-core==0.1.*", "0.1.9", True),
        ("rl-core==0.1.*", "0.2.0", False),
        ("rl-core!=0.1.*", "0.1.3", False),
        ("rl-core!=0.1.*", "0.2.0", True),
        ("rl-core===0.1.0", "0.1.0", True),
        ("rl-core===0.1.0", "0.1.0.post1", False),
        ("rl-core>=0.1,<0.2", "0.1.1.dev0", True),  # a dev build inside the range
        ("rl-core<0.2", "0.2.0rc1", False),  # a prerelease of the excluded upper bound
        ("rl-core>=0.2.0rc1", "0.2.0rc2", True),
        ("rl-core>=0.2.0rc1", "0.2.0b1", False),
        ("rl-core>0.1.0", "0.1.0.post1", False),  # PEP 440: ">V" excludes post-releases of V
        ("rl-core>=1!0.1", "0.9", False),  # epoch 1 sorts after every epoch-0 version
        ("rl-core>=1!0.1", "1!0.2", True),
        ("rl-core==0.1.0", "0.1.0+cuda12", True),  # a local version matches its public one
        ("rl-core~=0.1", "0.9.3", True),  # ~=0.1 means >=0.1,==0.*
        ("rl-core~=0.1", "1.0", False),
        ("rl-core (>=0.1,<0.2)", "0.1.4", True),  # the parenthesised legacy metadata form
        ("RL_Core>=0.3", "0.2", False),  # names compare normalised
        ("rl-core>=9; python_version < '3'", "0.1.0", True),  # marker false here: not ours
        ("rl-core>=9; python_version >= '3'", "0.1.0", False),
    ],
)
def test_every_pep440_form_is_enforced(requirement, core, ok):
    if ok:
        check_core_range("x", "1", [requirement], core)
    else:
        with pytest.raises(IncompatibleCoreError) as info:
            check_core_range("x", "1", [requirement], core)
        assert not isinstance(info.value, InvalidCoreRangeError)


def test_other_packages_are_not_read_as_rl_core():
    check_core_range("x", "1", ["rl-core-extras>=9", "rl_corex>=9", "pyarrow>=99"], "0.1.0")


@pytest.mark.parametrize("requirement", ["rl-core>=0.1,<<0.2", "rl-core>=banana", "rl-core=>0.1"])
def test_unparseable_range_is_an_error_not_skipped(requirement):
    with pytest.raises(InvalidCoreRangeError) as info:
        check_core_range("rl-algos", "0.1.0", [requirement], "0.1.0")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"rl-algos 0.1.0 declares an rl-core requirement {requirement!r}")


def test_unparseable_core_version_is_an_error():
    with pytest.raises(InvalidCoreRangeError, match="'not-a-version', which is not valid PEP 440"):
        check_core_range("rl-algos", "0.1.0", ["rl-core>=0.1"], "not-a-version")
