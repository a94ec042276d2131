"""Triton kernels sent to worker processes as source (buildops.backends.triton.shipping): rebuilt there with the
parent's cache key, without importing the user's modules; refused, with the reason, where that cannot be."""

import dataclasses
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import shipping_kernels as S
import triton
import triton.language as tl

from buildops.backends.triton.driver import inner_jit
from buildops.backends.triton.shipping import KeyMismatch, ShippedKernel, describe, rebuild

import triton_kernels as K

ROOT = Path(__file__).resolve().parents[1]

# A fresh interpreter rebuilds each kernel it is sent and prints its cache key, and which of the kernels' own
# modules (and torch) it imported: none, if shipping works.
REBUILD = """\
import json, pickle, sys
from buildops.backends.triton.shipping import rebuild
kernels = pickle.load(sys.stdin.buffer)
keys = [rebuild(kernel).cache_key for kernel in kernels]
imported = sorted(m for m in sys.modules if m.split(".")[0] in {"torch", "shipping_kernels", "shipping_helpers",
                                                               "triton_kernels", "fla"})
print(json.dumps([keys, imported]))
"""


def rebuilt_elsewhere(kernels: list[ShippedKernel]) -> tuple[list[str], list[str]]:
    done = subprocess.run([sys.executable, "-c", REBUILD], input=pickle.dumps(kernels), capture_output=True,
                          cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr.decode()[-3000:]
    keys, imported = json.loads(done.stdout.decode())
    return keys, imported


def shipped(kernel) -> ShippedKernel:
    description = describe(inner_jit(kernel))
    assert isinstance(description, ShippedKernel), description
    return description


def test_kernels_rebuild_elsewhere_with_the_parents_keys_and_none_of_their_modules():
    closure = S.make_closure_kernel(5)
    kernels = [K.add_kernel, K.rows_kernel, K.scale_kernel, S.through_a_module, closure]
    descriptions = [shipped(k) for k in kernels]
    keys, imported = rebuilt_elsewhere(descriptions)
    assert keys == [inner_jit(k).cache_key for k in kernels]
    assert imported == []


def test_what_travels_and_how():
    description = shipped(S.through_a_module)
    reads = description.functions[description.root].reads
    assert reads["tl"] == ("module", "triton.language") and reads["libdevice"][0] == "module"
    assert reads["OFFSET"][0] == "value"
    kind, module, attributes = reads["helpers"]  # a user's module: a stand-in with what the kernel reads of it
    assert (kind, module, sorted(attributes)) == ("namespace", "shipping_helpers", ["SCALE", "twice"])
    assert attributes["twice"] == ("function", "shipping_helpers:twice")
    assert "shipping_helpers:twice" in description.functions


def test_a_closure_over_another_value_rebuilds_with_another_key():
    three, five = shipped(S.make_closure_kernel(3)), shipped(S.make_closure_kernel(5))
    assert three.cache_key != five.cache_key
    keys, _ = rebuilt_elsewhere([three, five])
    assert keys == [three.cache_key, five.cache_key]


def test_a_rebuild_that_does_not_hash_as_the_parents_compiles_nothing():
    description = shipped(S.through_a_module)
    root = description.functions[description.root]
    tampered_reads = dict(root.reads, OFFSET=("value", tl.constexpr(7)))  # not what the parent compiles
    tampered = dataclasses.replace(description, functions={
        **description.functions, description.root: dataclasses.replace(root, reads=tampered_reads)})
    with pytest.raises(KeyMismatch, match="through_a_module"):
        rebuild(tampered)


class Mode:
    """A class of the test's own: a worker could unpickle it only by importing this module."""

    def __eq__(self, other):
        return isinstance(other, Mode)

    def __hash__(self):
        return 1


MODE = tl.constexpr(Mode())


@triton.jit
def reads_a_user_object(x, BLOCK: tl.constexpr):
    if MODE == MODE:
        tl.store(x + tl.arange(0, BLOCK), 0)


@triton.jit
def reads_a_user_module_whole(x, BLOCK: tl.constexpr):
    tl.store(x + tl.arange(0, BLOCK), len(S))


def test_a_kernel_that_cannot_travel_says_why():
    reason = describe(reads_a_user_object)
    assert isinstance(reason, str) and "reads MODE" in reason and "test_shipping.Mode" not in reason
    assert "constexpr" in reason and "travels only by import" in reason
    reason = describe(reads_a_user_module_whole)
    assert isinstance(reason, str) and "the module shipping_kernels itself" in reason


def test_a_kernel_imported_by_name_with_other_source_than_listed_compiles_nothing(tmp_path, monkeypatch):
    """A worker that imports a kernel whose file changed since the parent (or a manifest's machine) read it finds
    another source hash, and refuses before compiling: the artifact would be filed under the listed kernel's key."""
    import torch

    from buildops.backends.triton import target, worker

    target()
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # what a worker sets: restored after the test
    x = torch.zeros(64)
    with pytest.raises(KeyMismatch, match="its file changed since") as raised:
        worker.compile_variant("triton_kernels", "add_kernel", (x, x, x, 64), {"BLOCK": 64}, str(tmp_path),
                               ("cuda", 90, 32), expected_key="0" * 64)
    assert K.add_kernel.cache_key[:16] in str(raised.value) and "0" * 16 in str(raised.value)
    assert not any(tmp_path.iterdir())  # nothing compiled into the cache
    assert worker.compile_variant("triton_kernels", "add_kernel", (x, x, x, 64), {"BLOCK": 64}, str(tmp_path),
                                  ("cuda", 90, 32), expected_key=K.add_kernel.cache_key) is True


def test_a_value_read_from_a_module_that_changed_since_the_description_is_read_again(monkeypatch):
    """Triton's cache key does not hold a constexpr read from a module's attribute; a description kept per cache
    key alone shipped the old value to worker processes after the attribute changed (threads compiled the new)."""
    import shipping_helpers

    first = describe(S.through_a_module)
    assert describe(S.through_a_module) is first  # kept while nothing it read changed
    monkeypatch.setattr(shipping_helpers, "SCALE", tl.constexpr(7))
    monkeypatch.setattr(S, "OFFSET", tl.constexpr(5))
    again = describe(S.through_a_module)
    reads = again.functions[again.root].reads
    assert reads["helpers"][2]["SCALE"] == ("value", tl.constexpr(7)) and reads["OFFSET"] == ("value", tl.constexpr(5))
