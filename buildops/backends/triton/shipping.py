"""Shipping a Triton kernel to a worker process as source, so that the worker imports none of the user's packages.

A worker that imports a kernel's module by name pays that package's import (a kernel library that pulls in
``transformers`` or ``torch._dynamo`` takes seconds) once per worker, before its first build. Instead, the parent
describes the kernel: for it and each ``@triton.jit`` function it calls, the source Triton parses, where it sits in
its file, its jit options, and the globals it reads. The worker rebuilds the functions from that alone and compiles.

What a kernel reads travels as one of:
  * a plain value (ints, floats, strings, ``tl.constexpr``, Triton dtypes): pickled;
  * an object of Triton's own or of the standard library (``tl``, ``tl.exp``, ``libdevice``, ``math``): by its
    import path, checked to name that very object;
  * another ``@triton.jit`` function: described the same way;
  * a module of the user's (``from fla.ops.utils import op`` then ``op.exp``): a stand-in module holding only the
    attributes the kernel reads.
Anything else (a closure over an object that does not travel, a user class) makes the kernel unshippable, with the
reason: it is then built by importing its module, or in a thread.

Correctness does not rest on this description being complete: the worker computes the rebuilt kernel's
``cache_key`` (Triton's hash of the source, its line, the functions it calls and the constexpr globals it reads) and
compiles only if it equals the parent's. The artifact then lands under the key the parent looks up, and the parent's
own load is a cache hit. What the key does not hash (builtins, library stubs) travels by identity.

Torch-free: the worker imports it.
"""

from __future__ import annotations
import __future__

import ast
import builtins
import importlib
import inspect
import linecache
import pickle
import re
import sys
import textwrap
import types
from dataclasses import dataclass, field
from typing import Any

from .state import triton_state

__all__ = ["ShippedKernel", "Unshippable", "describe", "rebuild"]

# Packages a worker has, or imports cheaply, whatever the user's program: Triton's and the standard library's.
_IMPORTABLE_ROOTS = frozenset({"triton", *sys.stdlib_module_names})
_DEF_LINE = re.compile(r"^\s*def\s+\w+\s*\(")
_FUTURE_FLAGS = __future__.annotations.compiler_flag  # the one future import that changes what a def makes


class Unshippable(Exception):
    """A kernel that cannot travel as source; the message says why."""


class KeyMismatch(Exception):
    """The rebuilt kernel's cache key is not the parent's: compiling it could put a wrong artifact under no key the
    parent looks up, so the worker compiles nothing."""


@dataclass(frozen=True)
class ShippedFunction:
    """One ``@triton.jit`` (or ``@triton.constexpr_function``) function, as a worker rebuilds it."""

    kind: str  # "jit" or "constexpr_function"
    module: str
    qualname: str
    name: str
    filename: str
    first_line: int  # where the decorated definition starts (Triton's starting_line_number)
    raw_lines: tuple[str, ...]  # the definition's lines as in the file, decorators included
    future_flags: int
    options: dict[str, Any]
    reads: dict[str, tuple]  # global name -> how its value travels (see _ship_value)


@dataclass(frozen=True)
class ShippedKernel:
    """A kernel and every function it reaches, keyed ``module:qualname``, with the parent's ``cache_key``."""

    root: str
    cache_key: str
    functions: dict[str, ShippedFunction] = field(default_factory=dict)


# -- the parent: describing ---------------------------------------------------------------------------------------

# What a description read, as (namespace, name, the object it held): a global of a kernel's module, an attribute of
# a module it reads through. Triton's cache key does not hold them all (a constexpr read from a module attribute).
# Kept per kernel in ``triton_state.described``, with its cache key and what it gave.
Watches = list[tuple[dict[str, Any], str, Any]]
_MISSING = object()


def describe(jit: Any) -> ShippedKernel | str:
    """The kernel ``jit`` (a ``JITFunction``) as it travels to a worker, or the reason it cannot. Kept per kernel
    while its ``cache_key`` holds and every global and module attribute it read still holds the same object (one
    changed between two passes is read again: a worker must compile what this process would)."""
    key = jit.cache_key
    known = triton_state.described.get(jit)
    if known is not None and known[0] == key and all(namespace.get(name, _MISSING) is value
                                                     for namespace, name, value in known[2]):
        return known[1]
    functions: dict[str, ShippedFunction] = {}
    watches: Watches = []
    try:
        root = _describe_function(jit, functions, watches)
        shipped: ShippedKernel | str = ShippedKernel(root, key, functions)
        pickle.dumps(shipped)
    except Unshippable as exc:
        shipped = str(exc)
    except Exception as exc:  # noqa: BLE001 - whatever stops a description is a reason to build otherwise
        shipped = f"{type(exc).__name__}: {exc}"
    try:
        triton_state.described[jit] = (key, shipped, watches)
    except TypeError:  # not weakly referenceable: describe again next time
        pass
    return shipped


def _describe_function(fn_obj: Any, functions: dict[str, ShippedFunction], watches: Watches) -> str:
    fn = fn_obj.fn
    name = f"{fn.__module__}:{fn.__qualname__}"
    if name in functions:
        return name
    kind = _kind(fn_obj)
    if kind is None:
        raise Unshippable(f"{name}: a {type(fn_obj).__name__}, which travels only by import")
    if fn.__code__.co_flags & (inspect.CO_COROUTINE | inspect.CO_GENERATOR):  # not a kernel body
        raise Unshippable(f"{name}: not a plain function")
    raw_src = getattr(fn_obj, "raw_src", None)
    raw_lines = tuple(raw_src if raw_src is not None else inspect.getsourcelines(fn)[0])
    options = {}
    if kind == "jit":
        options = {"version": fn_obj.version, "do_not_specialize": list(fn_obj.do_not_specialize),
                   "do_not_specialize_on_alignment": list(fn_obj.do_not_specialize_on_alignment),
                   "debug": fn_obj.debug, "noinline": fn_obj.noinline}
    placeholder = ShippedFunction(kind, fn.__module__, fn.__qualname__, fn.__name__, fn.__code__.co_filename,
                                  fn_obj.starting_line_number, raw_lines,
                                  fn.__code__.co_flags & _FUTURE_FLAGS, options, {})
    functions[name] = placeholder  # first: a function that reaches itself again finds it
    scope = dict(fn.__globals__)
    if fn.__closure__:
        scope.update(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__)))
    reads: dict[str, tuple] = {}
    for global_name, paths in _names_read(fn_obj.src).items():
        if global_name not in scope:
            continue  # a builtin, or a name only ever local
        if global_name in fn.__globals__ and fn.__globals__[global_name] is scope[global_name]:
            watches.append((fn.__globals__, global_name, scope[global_name]))
        reads[global_name] = _ship_value(scope[global_name], paths, f"{name} reads {global_name}", functions,
                                         watches)
    placeholder.reads.update(reads)
    return name


def _kind(fn_obj: Any) -> str | None:
    from triton.runtime import jit as triton_jit

    from . import versions

    if type(fn_obj) is triton_jit.JITFunction:
        return "jit"
    constexpr_function = versions.constexpr_function_type()
    if constexpr_function is not None and type(fn_obj) is constexpr_function:
        return "constexpr_function"
    return None


def _names_read(src: str) -> dict[str, set[tuple[str, ...]]]:
    """The global names a function's source reads, each with the attribute paths read through it (``op.exp`` gives
    ``{"op": {("exp",)}}``). Its parameters are left out; other locals may be in: a superset is harmless."""
    tree = ast.parse(textwrap.dedent(src))
    parameters = {a.arg for node in ast.walk(tree) if isinstance(node, ast.arguments)
                  for a in (*node.posonlyargs, *node.args, *node.kwonlyargs, node.vararg, node.kwarg) if a}
    reads: dict[str, set[tuple[str, ...]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in parameters:
            reads.setdefault(node.id, set())
        elif isinstance(node, ast.Attribute):
            path: list[str] = []
            value: ast.expr = node
            while isinstance(value, ast.Attribute):
                path.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id not in parameters:
                reads.setdefault(value.id, set()).add(tuple(reversed(path)))
    return reads


def _ship_value(value: Any, paths: set[tuple[str, ...]], what: str, functions: dict[str, ShippedFunction],
                watches: Watches) -> tuple:
    reference = _reference(value)
    if reference is not None:
        return reference
    if isinstance(value, types.ModuleType):
        return _ship_namespace(value, paths, what, functions, watches)
    if _kind(value) is not None:
        return ("function", _describe_function(value, functions, watches))
    if _plain(value):
        return ("value", value)
    raise Unshippable(f"{what}, a {type(value).__module__}.{type(value).__qualname__} that travels only by import")


def _reference(value: Any) -> tuple | None:
    """``("module", name)`` or ``("object", module, qualname)`` where the value is Triton's or the standard
    library's and importing that path gives this very object; else None."""
    if isinstance(value, types.ModuleType):
        name = value.__name__
        if _importable(name) and sys.modules.get(name) is value:
            return ("module", name)
        return None
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or not _importable(module):
        return None
    try:
        if _resolve(module, qualname) is value:
            return ("object", module, qualname)
    except Exception:  # noqa: BLE001 - not reachable by its path: maybe a plain value still
        pass
    return None


def _importable(module: str) -> bool:
    root = module.partition(".")[0]
    return root in _IMPORTABLE_ROOTS


def _plain(value: Any) -> bool:
    """A value that pickles without importing anything of the user's, and comes back equal."""
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return type(value).__module__ == "builtins"
    if isinstance(value, (tuple, list)) and type(value) in (tuple, list):
        return all(_plain(v) for v in value)
    if not _importable(type(value).__module__):
        return False
    inner = getattr(value, "value", None)  # a tl.constexpr wraps its value
    if type(value).__name__ == "constexpr" and not _plain(inner):
        return False
    try:
        return pickle.loads(pickle.dumps(value)) == value
    except Exception:  # noqa: BLE001 - does not travel
        return False


def _ship_namespace(module: types.ModuleType, paths: set[tuple[str, ...]], what: str,
                    functions: dict[str, ShippedFunction], watches: Watches) -> tuple:
    if not paths:
        raise Unshippable(f"{what}, the module {module.__name__} itself, not one of its attributes")
    by_first: dict[str, set[tuple[str, ...]]] = {}
    for path in paths:
        by_first.setdefault(path[0], set()).add(path[1:])
    attributes = {}
    for attr, rest in by_first.items():
        if not hasattr(module, attr):
            raise Unshippable(f"{what}.{attr}, which {module.__name__} lacks")
        rest = {p for p in rest if p}
        value = getattr(module, attr)
        if vars(module).get(attr, _MISSING) is value:
            watches.append((vars(module), attr, value))
        if isinstance(value, types.ModuleType) and _reference(value) is None and not rest:
            rest = set()  # the submodule itself: refused below with the reason
        attributes[attr] = _ship_value(value, rest, f"{what}.{attr}", functions, watches)
    return ("namespace", module.__name__, attributes)


def _resolve(module: str, qualname: str) -> Any:
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


# -- the worker: rebuilding ---------------------------------------------------------------------------------------

def rebuild(shipped: ShippedKernel) -> Any:
    """The kernel ``shipped`` describes, as a ``JITFunction`` whose ``cache_key`` is the parent's.

    Raises:
        KeyMismatch: the rebuilt kernel hashes otherwise (something it reads did not travel faithfully).
    """
    known = triton_state.rebuilt.get((shipped.root, shipped.cache_key))
    if known is not None:
        return known
    made: dict[str, Any] = {}
    kernel = _rebuild_function(shipped.root, shipped.functions, made)
    if kernel.cache_key != shipped.cache_key:
        raise KeyMismatch(f"{shipped.root}: rebuilt with cache key {kernel.cache_key[:12]}..., the parent's is "
                          f"{shipped.cache_key[:12]}...")
    triton_state.rebuilt[(shipped.root, shipped.cache_key)] = kernel
    return kernel


def _rebuild_function(name: str, functions: dict[str, ShippedFunction], made: dict[str, Any]) -> Any:
    if name in made:
        return made[name]
    shipped = functions[name]
    scope: dict[str, Any] = {"__name__": shipped.module, "__builtins__": builtins}
    made[name] = None  # a function that reaches itself: filled in below, before anything hashes it
    for global_name, value in shipped.reads.items():
        scope[global_name] = _value(value, functions, made)
    fn = _define(shipped, scope)
    from triton.runtime import jit as triton_jit

    from . import versions

    with _source_visible(shipped):  # Triton reads a function's source and line through inspect
        if shipped.kind == "jit":
            rebuilt = triton_jit.JITFunction(fn, **shipped.options)
        else:
            rebuilt = versions.constexpr_function_type()(fn)  # pyright: ignore[reportOptionalCall]
    made[name] = rebuilt
    for global_name, value in shipped.reads.items():  # a function that named itself gets itself, decorated
        if value == ("function", name):
            scope[global_name] = rebuilt
    return rebuilt


def _value(value: tuple, functions: dict[str, ShippedFunction], made: dict[str, Any]) -> Any:
    how = value[0]
    if how == "value":
        return value[1]
    if how == "module":
        return importlib.import_module(value[1])
    if how == "object":
        return _resolve(value[1], value[2])
    if how == "function":
        return _rebuild_function(value[1], functions, made)
    if how == "namespace":
        stand_in = types.ModuleType(value[1])
        for attr, inner in value[2].items():
            setattr(stand_in, attr, _value(inner, functions, made))
        return stand_in
    raise ValueError(f"unknown shipped value {how!r}")


def _define(shipped: ShippedFunction, scope: dict[str, Any]) -> types.FunctionType:
    """The plain function, defined from its source in ``scope`` (decorators left out: the caller applies the jit),
    with the file name and first line it has in the parent, which Triton reads."""
    lines = list(shipped.raw_lines)
    first_def = next((i for i, line in enumerate(lines) if _DEF_LINE.match(line)), None)
    if first_def is None:
        raise ValueError(f"{shipped.module}:{shipped.qualname}: no def line in its source")
    lines[:first_def] = ["\n"] * first_def
    text = "\n" * (shipped.first_line - 1) + textwrap.dedent("".join(lines))
    code = compile(text, shipped.filename, "exec", flags=shipped.future_flags, dont_inherit=True)
    exec(code, scope)
    fn = scope[shipped.name]
    fn.__qualname__ = shipped.qualname
    fn.__code__ = fn.__code__.replace(co_firstlineno=shipped.first_line)
    return fn


class _source_visible:
    """Within the block, ``inspect`` finds the function's source in its file at its line (the worker may not have
    the file, or have another version of it); the file's previous ``linecache`` entry comes back after."""

    def __init__(self, shipped: ShippedFunction) -> None:
        self.filename = shipped.filename
        self.lines = ["\n"] * (shipped.first_line - 1) + list(shipped.raw_lines)

    def __enter__(self) -> None:
        self.previous = linecache.cache.get(self.filename)
        linecache.cache[self.filename] = (sum(map(len, self.lines)), None, self.lines, self.filename)

    def __exit__(self, *exc: object) -> None:
        if self.previous is None:
            linecache.cache.pop(self.filename, None)
        else:
            linecache.cache[self.filename] = self.previous
