"""The environment-library adapters' tests (nox -s tests-envs; the `envs` dependency group).

This directory goes on ``sys.path`` and ``PYTHONPATH``: the verifiers tasksets here are
imported by name (their taskset ids), also in environment worker processes."""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, _HERE)
os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (_HERE, os.environ.get("PYTHONPATH")) if p)
