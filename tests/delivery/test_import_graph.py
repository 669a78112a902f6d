"""Package boundaries: no import cycles among the project's modules (runtime/ and operator/), and the
torch-free packages (operator, router, the shared contract) import neither torch nor the runtime.

Every import counts, wherever it stands in a module: a function-level import, one under `if TYPE_CHECKING:`
and `importlib.import_module("a.literal")` are dependencies too."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "runtime", ROOT / "operator"]


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for base in SOURCES:
        for path in base.rglob("*.py"):
            parts = list(path.relative_to(base).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _imported_names(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join(package + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = _imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py")
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def _all_imports() -> dict[str, set[str]]:
    modules = _modules()
    return {
        name: _imported_names(ast.parse(path.read_text()), name, path.name == "__init__.py")
        for name, path in modules.items()
    }


def test_no_import_cycles() -> None:
    cycles = _cycles(import_graph())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_torch_free_packages_import_neither_torch_nor_the_runtime() -> None:
    torch_free = ("skiff_operator", "skiff_router", "skiff_contract", "skiff_process")
    offending = {
        module: sorted(t for t in targets if t.split(".")[0] in ("skiff", "torch"))
        for module, targets in _all_imports().items()
        if module.split(".")[0] in torch_free
    }
    assert not {m: t for m, t in offending.items() if t}, offending
