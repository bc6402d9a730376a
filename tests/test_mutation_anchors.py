"""Every seeded device bug of tools/mutations.py still finds its line in the source: a
refactor that moves the code (e.g. offload into EngineBase) fails here, in the fast session,
not only when someone runs the mutations."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_each_mutation_applies_exactly_once():
    spec = importlib.util.spec_from_file_location("mutations", ROOT / "tools" / "mutations.py")
    mutations = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mutations  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mutations)
    finally:
        del sys.modules[spec.name]
    assert len(mutations.MUTATIONS) >= 8
    assert sum(m.name.startswith("collective-") for m in mutations.MUTATIONS) >= 3
    for m in mutations.MUTATIONS:
        source = (ROOT / m.path).read_text()
        assert source.count(m.old) == 1, (m.name, m.path)
        assert (ROOT / m.tests[0]).is_file(), (m.name, m.test)
        assert "::" in m.test and m.error, (m.name, m.test, m.error)
