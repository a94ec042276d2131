"""The package's layers: each module imports only its own layer and those below it, and no imports form a cycle.

Layers, bottom up: ``_config``; ``_runtime``; ``_core``; ``backends``; the public face (``buildops`` itself,
``capture``, ``reporting``, ``startup``, ``testing``). Imports inside functions count too: a lazy import is still
a dependency.
"""

import ast
import pathlib

import buildops

PACKAGE = pathlib.Path(buildops.__file__).parent
LAYERS = ("buildops._config", "buildops._runtime", "buildops.store", "buildops._core", "buildops.backends")


def _layer(module: str) -> int:
    for rank, prefix in enumerate(LAYERS):
        if module == prefix or module.startswith(prefix + "."):
            return rank
    return len(LAYERS)  # the public face


def _modules() -> dict[str, pathlib.Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(name: str, path: pathlib.Path, known: set[str]) -> set[str]:
    """The buildops modules ``name`` imports, resolved to the deepest module that exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in known:
                candidate = candidate.rpartition(".")[0]
            if candidate.startswith("buildops") and candidate != name:
                targets.add(candidate)
                break
    return targets


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, set(modules)) for name, path in modules.items()}


def test_every_module_imports_only_its_layer_and_those_below():
    upward = [f"{name} (layer {_layer(name)}) imports {target} (layer {_layer(target)})"
              for name, targets in _graph().items() for target in sorted(targets)
              if _layer(target) > _layer(name) and target != "buildops"]
    assert upward == []


def test_no_imports_form_a_cycle():
    graph = _graph()
    # a package's __init__ is its parent's business: importing a submodule imports it anyway
    graph = {name: {t for t in targets if not name.startswith(t + ".")} for name, targets in graph.items()}
    cycles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_the_core_names_no_backend_even_by_string():
    """Backends register with the core (``_core.extensions``); the core never imports one by name at run time."""
    below = ("buildops._config", "buildops._runtime", "buildops._core")
    named = [f"{path.relative_to(PACKAGE)}: {node.value!r}"
             for path in (PACKAGE / "_core").rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and node.value.startswith("buildops.") and not node.value.startswith(below)]
    assert named == []


def test_no_module_outside_the_backends_names_a_library_they_serve():
    """Only a library's backend imports it or names it in code (an import, ``find_spec("triton")``, a module path):
    the core and the public face reach every library through the registered backends."""
    from buildops._core import extensions

    libraries = {backend.library for backend in extensions.backends()}
    modules = _modules()
    found = []
    for name, path in modules.items():
        if name == "buildops.backends" or name.startswith("buildops.backends."):
            continue
        found += [f"{name}: imports {target}" for target in sorted(_imports(name, path, set(modules)))
                  if target.startswith("buildops.backends.")]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                named = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                named = [node.module or ""] if not node.level else []
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                named = [node.value.partition(":")[0]]
            else:
                continue
            found += [f"{name}:{node.lineno}: {text}" for text in named
                      if any(text == lib or text.startswith(lib + ".") for lib in libraries)]
    assert found == []


def test_no_module_imports_a_private_name_of_another():
    """A module's ``_names`` are its own: another module that needs one gets a public name instead."""
    found = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("buildops")):
                found += [f"{name}:{node.lineno}: {alias.name}" for alias in node.names
                          if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert found == []
