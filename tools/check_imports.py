"""Enforce the dependency rule between the workspace's packages.

Rules (the README's "Packages" section states them for users):
  * rl_core imports none of ray, transformers, vllm, sglang, megatron at module level;
    ray only inside its Ray backend package, and heavy libraries only lazily (inside a
    function) in rl_core.testing, whose suites drive engines that bring them.
  * a package imports no sibling except rl_core, and never rl_core's private modules
    (a dotted component starting with "_"); rl_multimodal may also use rl_algos' public API.
  * no import cycle among the packages' modules. Every import statement counts: at module
    level, inside a function, under ``if TYPE_CHECKING:``, absolute or relative; so moving an
    import into a function does not break a cycle. ``from a.b import c`` is an edge to the
    module ``a.b.c`` when it is one, else to ``a.b``; the parent packages Python imports on
    the way are not edges. A cycle is printed as ``a -> b -> a``.

Usage: python tools/check_imports.py [ROOT]; exit status 1 and one line per violation.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator, Mapping
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


def _module_names(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages under `root`."""
    names = {}
    for directory in PACKAGE_DIRS.values():
        src = root / directory
        for path in sorted(src.rglob("*.py")):
            parts = path.relative_to(src.parent).with_suffix("").parts
            names[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return names


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(absolute dotted name, line) of everything any import statement in `tree` names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")[: None if is_package else -1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            for alias in node.names:
                yield f"{base}.{alias.name}", node.lineno


def module_graph(root: Path) -> dict[str, dict[str, int]]:
    """Module -> {module it imports: line of the first such import}, our modules only."""
    names = _module_names(root)
    graph: dict[str, dict[str, int]] = {}
    for module, path in names.items():
        edges = graph.setdefault(module, {})
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, line in _imported_names(tree, module, path.name == "__init__.py"):
            while name and name not in names:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.setdefault(name, line)
    return graph


def import_cycles(graph: Mapping[str, Mapping[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected group of modules, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, targets = work[-1]
            target = next((t for t in targets if t not in index or t in stack), None)
            if target is not None and target not in index:
                index[target] = low[target] = len(index)
                stack.append(target)
                work.append((target, iter(sorted(graph.get(target, {})))))
            elif target is not None:
                low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group, member = set(), ""
                    while member != node:
                        member = stack.pop()
                        group.add(member)
                    if len(group) > 1:
                        groups.append(group)
    return sorted(_shortest_cycle(graph, group) for group in groups)


def _shortest_cycle(graph: Mapping[str, Mapping[str, int]], group: set[str]) -> list[str]:
    """The shortest way from the group's first module back to itself, inside the group."""
    first = min(group)
    paths = {first: [first]}
    frontier = [first]
    while frontier:
        following = []
        for node in frontier:
            for target in sorted(graph[node]):
                if target == first:
                    return paths[node] + [first]
                if target in group and target not in paths:
                    paths[target] = paths[node] + [target]
                    following.append(target)
        frontier = following
    raise AssertionError(f"no cycle through {first}")  # a strongly connected group has one


def check_cycles(root: Path) -> list[Violation]:
    """One violation per import cycle, at the import that leaves the cycle's first module."""
    graph = module_graph(root)
    names = _module_names(root)
    found = []
    for cycle in import_cycles(graph):
        line = graph[cycle[0]][cycle[1]]
        found.append(
            Violation(names[cycle[0]], line, cycle[1], "import cycle: " + " -> ".join(cycle))
        )
    return found


def main(argv: list[str]) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parents[1]
    violations = check_tree(root) + check_cycles(root)
    for violation in violations:
        print(violation)
    if violations:
        print(f"{len(violations)} forbidden import(s) or import cycle(s)")
        return 1
    print("import rule: ok, no import cycle")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
