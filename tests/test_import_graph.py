"""The package's import graph has no circles: data flows one way (STYLE.md), every import counted,
at module level or inside a function."""
from __future__ import annotations

import ast
from pathlib import Path

import servesim

PKG = Path(servesim.__file__).resolve().parent


def _file_of(dotted: str) -> Path | None:
    p = PKG.parent.joinpath(*dotted.split("."))
    if (p / "__init__.py").is_file():
        return p / "__init__.py"
    return p.with_suffix(".py") if p.with_suffix(".py").is_file() else None


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[Path, set[Path]]:
    """file -> the servesim files it imports (`from a import b`: b's file when b is a module, else a's)."""
    graph = {}
    for path in sorted(PKG.rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for a in node.names:
                    sub = _file_of(f"{mod}.{a.name}")
                    targets.append(sub if sub is not None else _file_of(mod))
            elif isinstance(node, ast.Import):
                targets = [_file_of(a.name) for a in node.names]
            edges |= {t for t in targets if t is not None and t != path}
        graph[path] = edges
    return graph


def circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The strongly connected components of more than one file (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_a_circle_is_found():
    a, b, c = Path("a.py"), Path("b.py"), Path("c.py")
    assert circles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert circles({a: {b}, b: {c}, c: set()}) == []


def test_the_package_has_no_import_circle():
    found = [[str(p.relative_to(PKG.parent)) for p in comp] for comp in circles(import_graph())]
    assert found == [], f"import circles: {found}"
