"""The package's modules form layers: its folders (and root modules) stand in one declared order,
:data:`LAYERS`, and each imports only its own folder and the layers below it; no import cycle;
no private name imported from another module. The graph is computed from the source (every
import statement, at any depth, including those inside functions: an import moved into a
function still ties the two modules together).

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

# The layers, bottom to top. An entry is a folder (every module under it) or a root module. A
# module may import its own entry's modules and those of the layers below; never an entry
# beside it (the same layer) or above it. The package's own ``__init__`` (``fastdata``, the
# public face, which imports its names on first use) stands on top, with ``python -m fastdata``.
LAYERS: list[set[str]] = [
    {"fastdata.errors", "fastdata._version"},
    {"fastdata.extras", "fastdata.importing", "fastdata.urls", "fastdata.machine", "fastdata.manifest",
     "fastdata.images", "fastdata.quantities", "fastdata.files"},
    {"fastdata.fields"},
    {"fastdata.remote"},  # the read side: URLs, the cache, fetching
    {"fastdata.sources", "fastdata.reader"},
    {"fastdata.loading"},
    {"fastdata.formats"},
    {"fastdata.conversion", "fastdata.verification", "fastdata.api"},
    {"fastdata.bench", "fastdata.preview", "fastdata.testing"},  # testing: suites for packages that extend fastdata
    {"fastdata.tuning"},
    {"fastdata.cli"},
    {"fastdata.__main__", "fastdata"},
]
LAYER_OF = {entry: number for number, layer in enumerate(LAYERS) for entry in layer}


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


def entry_of(module: str) -> str | None:
    """The declared entry ``module`` belongs to: the innermost declared folder holding it, or
    itself (a root module, or the package root, which is no folder of the others); None: none."""
    parts = module.split(".")
    for depth in range(len(parts), 1, -1):
        if ".".join(parts[:depth]) in LAYER_OF:
            return ".".join(parts[:depth])
    return module if module in LAYER_OF else None


def layer_violations(imports: list[tuple[str, str, str]]) -> list[str]:
    """Each ``(module, imported module, where)`` that imports an entry beside or above its own."""
    found = []
    for module, target, where in imports:
        source, imported = entry_of(module), entry_of(target)
        if source is None or imported is None or source == imported or LAYER_OF[imported] < LAYER_OF[source]:
            continue
        relation = "beside it" if LAYER_OF[imported] == LAYER_OF[source] else "above it"
        found.append(f"{where}: {module} imports {target} ({imported} stands {relation}, not below {source})")
    return list(dict.fromkeys(found))  # one line per import statement, however many names it takes


def package_imports() -> list[tuple[str, str, str]]:
    modules = module_names()
    return [(module, target, f"{path.relative_to(ROOT)}:{line}")
            for module, path in modules.items()
            for target, _, line in imports_of(module, path, modules) if target in modules and target != module]


def test_the_layer_checker_finds_imports_beside_and_above() -> None:
    imports = [
        ("fastdata.fields.schema", "fastdata.formats.registry", "a.py:1"),  # above
        ("fastdata.sources.folder", "fastdata.reader.options", "b.py:2"),  # beside
        ("fastdata.api", "fastdata.verification", "c.py:3"),  # beside, two root modules
        ("fastdata.images", "fastdata", "d.py:4"),  # the public face stands on top
        ("fastdata.formats.tar.stream", "fastdata.reader.options", "e.py:5"),  # below: fine
        ("fastdata.conversion.driver", "fastdata.conversion.remote.upload", "f.py:6"),  # its own folder: fine
        ("fastdata.cli", "fastdata.errors", "g.py:7"),  # below: fine
    ]
    assert layer_violations(imports) == [
        "a.py:1: fastdata.fields.schema imports fastdata.formats.registry (fastdata.formats stands above it, "
        "not below fastdata.fields)",
        "b.py:2: fastdata.sources.folder imports fastdata.reader.options (fastdata.reader stands beside it, "
        "not below fastdata.sources)",
        "c.py:3: fastdata.api imports fastdata.verification (fastdata.verification stands beside it, "
        "not below fastdata.api)",
        "d.py:4: fastdata.images imports fastdata (fastdata stands above it, not below fastdata.images)",
    ]
    assert entry_of("fastdata.conversion.remote.locks") == "fastdata.conversion"
    assert entry_of("fastdata") == "fastdata"
    assert entry_of("fastdata.not_declared") is None  # a new root module must be given a layer


def test_every_module_stands_on_a_declared_layer() -> None:
    undeclared = [module for module in module_names() if entry_of(module) is None]
    assert undeclared == [], "modules on no layer: add their folder (or the module) to LAYERS"
    declared_but_gone = sorted(entry for entry in LAYER_OF if entry not in module_names())
    assert declared_but_gone == []


def test_each_folder_imports_only_the_layers_below_it() -> None:
    violations = layer_violations(package_imports())
    assert not violations, "imports of a layer beside or above the importer's (see LAYERS):\n" + "\n".join(violations)


def test_the_package_root_holds_at_most_fifteen_modules() -> None:
    root_modules = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(root_modules) <= 15, root_modules
