"""The package's modules form layers: no import cycle, and no private name imported from another
module. The graph is computed from the source (every import statement, at any depth, including
those inside functions: an import moved into a function still ties the two modules together).

``from fastdata.a import b`` is an edge to ``fastdata.a.b`` when that is a module, else to
``fastdata.a``; importing a module does not count as importing its parent packages (Python runs
their ``__init__`` first, but that is the package's own business, not a dependency of the
importing module's code).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "fastdata"


def module_names() -> dict[str, Path]:
    names = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    base = base[: len(base) - node.level + (1 if is_package else 0)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """(imported module, name imported from it or None, line) for every fastdata import."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, None, node.lineno) for alias in node.names if alias.name.split(".")[0] == "fastdata"]
        elif isinstance(node, ast.ImportFrom):
            target = resolve(module, node, path.name == "__init__.py")
            if target.split(".")[0] != "fastdata":
                continue
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                found.append((submodule, None, node.lineno) if submodule in modules else (target, alias.name, node.lineno))
    return found


def graph() -> dict[str, set[str]]:
    modules = module_names()
    return {module: {target for target, _, _ in imports_of(module, path, modules) if target in modules and target != module}
            for module, path in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_the_checker_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_package_modules() -> None:
    assert cycles(graph()) == []


def test_no_private_name_is_imported_from_another_module() -> None:
    modules = module_names()
    private = [f"{path.relative_to(ROOT)}:{line}: {name} from {target}"
               for module, path in modules.items()
               for target, name, line in imports_of(module, path, modules)
               if name is not None and name.startswith("_") and not name.startswith("__") and target != module]
    assert private == []
