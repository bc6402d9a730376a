"""Enforce the dependency rule between the workspace's packages.

Rules (the README's "Packages" section states them for users):
  * rl_core imports none of ray, transformers, vllm, sglang, megatron at module level;
    ray only inside its Ray backend package, and heavy libraries only lazily (inside a
    function) in rl_core.testing, whose suites drive engines that bring them.
  * a package imports no sibling except rl_core, and never rl_core's private modules
    (a dotted component starting with "_"); rl_multimodal may also use rl_algos' public API.

Usage: python tools/check_imports.py [ROOT]; exit status 1 and one line per violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PACKAGE_DIRS = {
    "rl_core": "packages/rl-core/src/rl_core",
    "rl_engines": "packages/rl-engines/src/rl_engines",
    "rl_rollout": "packages/rl-rollout/src/rl_rollout",
    "rl_algos": "packages/rl-algos/src/rl_algos",
    "rl_multimodal": "packages/rl-multimodal/src/rl_multimodal",
    "rl_nvidia": "integrations/nvidia/src/rl_nvidia",
    "rl_amd": "integrations/amd/src/rl_amd",
    "rl_ascend": "integrations/ascend/src/rl_ascend",
}
CORE_FORBIDDEN = {"ray", "transformers", "vllm", "sglang", "megatron"}
CORE_RAY_BACKEND = "rl_core/single_controller/ray"
CORE_LAZY_ALLOWED = "rl_core/testing"
ALLOWED_SIBLINGS = {"rl_multimodal": {"rl_algos"}}


@dataclass(frozen=True)
class Violation:
    path: Path
    line: int
    module: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: import of '{self.module}': {self.reason}"


def _imports(tree: ast.AST) -> Iterator[tuple[ast.AST, str, bool]]:
    """Yield (node, absolute module name, imported at module level)."""

    def visit(node: ast.AST, top_level: bool) -> Iterator[tuple[ast.AST, str, bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child, alias.name, top_level
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child, child.module, top_level
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from visit(child, top_level and not nested)

    yield from visit(tree, True)


def check_file(path: Path, package: str, relpath: str) -> list[Violation]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node, module, top_level in _imports(tree):
        root = module.split(".")[0]
        line = getattr(node, "lineno", 0)
        if package == "rl_core" and root in CORE_FORBIDDEN:
            if root == "ray" and relpath.startswith(CORE_RAY_BACKEND):
                continue
            if not top_level and relpath.startswith(CORE_LAZY_ALLOWED) and root != "ray":
                continue
            found.append(Violation(path, line, module, "rl_core may not depend on it"))
        elif root.startswith("rl_") and root in PACKAGE_DIRS and root != package:
            if root == "rl_core" or root in ALLOWED_SIBLINGS.get(package, set()):
                if any(part.startswith("_") for part in module.split(".")[1:]):
                    found.append(Violation(path, line, module, f"private module of {root}"))
                continue
            found.append(Violation(path, line, module, f"{package} may not import sibling {root}"))
    return found


def check_tree(root: Path) -> list[Violation]:
    violations = []
    for package, directory in PACKAGE_DIRS.items():
        src = root / directory
        for path in sorted(src.rglob("*.py")):
            relpath = path.relative_to(src.parent).as_posix()
            violations += check_file(path, package, relpath)
    return violations


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = check_tree(root)
    for violation in violations:
        print(violation)
    if violations:
        print(f"{len(violations)} forbidden import(s)")
        return 1
    print("import rule: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
