"""vgen's modules import only downward, with no cycles, and at module level.

Every module under vgen/ is parsed with ``ast`` (nothing is imported) and its vgen-internal imports are collected,
module-level and inside functions, relative ones resolved. The layers, top to bottom, are :data:`LAYERS`: a module
may import its own subpackage (in any direction, as long as no cycle forms) and any lower layer, never a higher
one. Imports inside functions hide an edge until run time, so there are none but the :data:`LAZY` exceptions, each
with its reason; modules loaded by name (``importlib.import_module``) are imports the graph cannot see, so there
are none of those either.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "vgen"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("vgen", "vgen.__main__"),
    ("vgen.apps",),
    ("vgen.training",),
    ("vgen.eval",),
    ("vgen.pipelines",),
    ("vgen.hub",),
    ("vgen.samplers",),
    ("vgen.models", "vgen.tokenizers"),
    ("vgen.kernels", "vgen.data"),
    ("vgen.images", "vgen.video_io", "vgen.visualize", "vgen.interrupts", "vgen.threads"),
)
"""Top to bottom; each entry is a module or a subpackage with every module under it."""

TRITON = "the Triton kernel module imports triton, an optional dependency: it loads on the first launch on a GPU"
INTERPRETER = "load_interpreted() imports the Triton kernel modules (and triton) once TRITON_INTERPRET=1 is set"
LAZY: dict[tuple[str, str], str] = {
    ("vgen.apps.cli", "vgen.apps.gradio_app"): "the web demo needs gradio, an optional dependency; `vgen app` "
                                               "imports it when it runs, so the other commands work without it",
    ("vgen.samplers.logits", "vgen.kernels.probs"): TRITON,
    ("vgen.samplers.speculative.rules", "vgen.kernels.accept"): TRITON,
    ("vgen.samplers.speculative.rules", "vgen.kernels.residual"): TRITON,
    ("vgen.kernels.dispatch", "vgen.kernels.accept"): INTERPRETER,
    ("vgen.kernels.dispatch", "vgen.kernels.probs"): INTERPRETER,
    ("vgen.kernels.dispatch", "vgen.kernels.residual"): INTERPRETER,
}
"""(module, imported module) pairs that may import inside a function, with the reason."""


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the vgen module imported
    line: int
    in_function: bool

    def __str__(self) -> str:
        where = "inside a function" if self.in_function else "at module level"
        return f"{self.source} imports {self.target} ({module_path(self.source)}:{self.line}, {where})"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def module_path(name: str) -> str:
    return str(MODULES[name].relative_to(ROOT.parent))


def resolve(source: str, node: ast.ImportFrom) -> str:
    """The absolute module name ``from ... import`` reads from, relative imports resolved against ``source``."""
    if not node.level:
        return node.module or ""
    package = source.split(".") if MODULES[source].name == "__init__.py" else source.split(".")[:-1]
    base = package[: len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def known_module(name: str) -> str | None:
    """``name`` if it is a vgen module, else the longest vgen module it lies in (``vgen.hub.save_pretrained`` ->
    ``vgen.hub``); None outside vgen."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(source: str) -> list[Import]:
    """Every vgen module ``source`` imports, with the line and whether the import sits inside a function."""
    tree = ast.parse(MODULES[source].read_text(), filename=str(MODULES[source]))
    found: list[Import] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            targets: list[str] = []
            if isinstance(child, ast.Import):
                targets = [alias.name for alias in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = resolve(source, child)
                # ``from vgen.x import y`` imports the module vgen.x.y when there is one, else a name of vgen.x
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                           for alias in child.names]
            for target in targets:
                module = known_module(target)
                if module is not None and module != source:
                    found.append(Import(source, module, child.lineno, inner))
            visit(child, inner)

    visit(tree, False)
    return found


IMPORTS: list[Import] = list(dict.fromkeys(imp for name in MODULES for imp in imports_of(name)))


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of the entry that holds ``module`` (its longest match)."""
    matches = [(len(entry), i) for i, names in enumerate(LAYERS) for entry in names
               if module == entry or (entry != "vgen" and module.startswith(entry + "."))]
    if not matches:
        raise LookupError(module)
    return max(matches)[1]


def unit_of(module: str) -> str:
    """The subpackage or top-level module ``module`` belongs to (``vgen.samplers.speculative.rules`` ->
    ``vgen.samplers``); inside one unit imports may go either way."""
    parts = module.split(".")
    return ".".join(parts[:2])


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of the directed graph with more than one node (Tarjan's algorithm):
    the groups of modules that import each other, directly or through others; empty when there is no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_parser_sees_the_package_and_its_imports() -> None:
    assert {"vgen", "vgen.hub", "vgen.pipelines", "vgen.pipelines.image", "vgen.eval.classifier"} <= set(MODULES)
    edges = {(imp.source, imp.target) for imp in IMPORTS}
    assert ("vgen", "vgen.pipelines") in edges  # a package's __init__ imports its subpackage
    assert ("vgen.pipelines.video", "vgen.pipelines.image") in edges
    assert ("vgen.eval.classifier", "vgen.hub") in edges


def test_the_helpers_resolve_relative_imports_and_find_cycles() -> None:
    node = ast.parse("from ..hub import save_pretrained").body[0]
    assert resolve("vgen.pipelines.image", node) == "vgen.hub"
    assert resolve("vgen.pipelines", ast.parse("from .image import ImagePipeline").body[0]) == "vgen.pipelines.image"
    assert known_module("vgen.hub.save_pretrained") == "vgen.hub" and known_module("torch.nn") is None
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a", "e"}, "e": {"d"}}) == [["a", "b", "c"], ["d", "e"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
    assert layer_of("vgen.samplers.speculative.rules") == layer_of("vgen.samplers") > layer_of("vgen.pipelines")
    assert unit_of("vgen.samplers.speculative.rules") == "vgen.samplers"


def test_every_module_has_a_layer() -> None:
    unplaced = []
    for module in MODULES:
        try:
            layer_of(module)
        except LookupError:
            unplaced.append(f"{module} ({module_path(module)})")
    assert not unplaced, "modules in no layer of LAYERS (add them where they belong):\n" + "\n".join(unplaced)


def test_no_import_cycles() -> None:
    edges: dict[str, set[str]] = {}
    for imp in IMPORTS:
        edges.setdefault(imp.source, set()).add(imp.target)
    found = cycles(edges)
    report = [f"{', '.join(group)}:\n" + "\n".join(f"  {imp}" for imp in IMPORTS
                                                   if imp.source in group and imp.target in group)
              for group in found]
    assert not found, "modules that import each other (a cycle):\n" + "\n".join(report)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [f"{imp}: layer {layer_of(imp.source)} imports layer {layer_of(imp.target)}" for imp in IMPORTS
              if unit_of(imp.source) != unit_of(imp.target) and layer_of(imp.target) < layer_of(imp.source)]
    assert not upward, ("imports of a higher layer (layers, top to bottom: "
                        + " -> ".join("/".join(names) for names in LAYERS) + "):\n" + "\n".join(upward))


def test_no_vgen_import_inside_a_function() -> None:
    lazy = [str(imp) for imp in IMPORTS if imp.in_function and (imp.source, imp.target) not in LAZY]
    assert not lazy, ("vgen imports inside functions (move them to module level, or list the pair in LAZY with the "
                      "reason):\n" + "\n".join(lazy))


@pytest.mark.parametrize("pair", sorted(LAZY))
def test_each_lazy_exception_is_still_needed(pair: tuple[str, str]) -> None:
    assert any(imp.in_function and (imp.source, imp.target) == pair for imp in IMPORTS), \
        f"LAZY lists {pair[0]} -> {pair[1]}, but no function imports it: remove the entry"


def test_no_module_is_loaded_by_name() -> None:
    by_name = []
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                if name in ("import_module", "__import__"):
                    by_name.append(f"{module} ({module_path(module)}:{node.lineno}) calls {name}")
    assert not by_name, "modules loaded by name hide their imports from this check:\n" + "\n".join(by_name)
