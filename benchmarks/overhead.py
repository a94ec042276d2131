"""What a decorated op costs per call outside a build pass once nothing is pending, against the same function
undecorated. Goal: under 1 us added per call.

    python benchmarks/overhead.py [--calls 200000] [--repeats 7] [--pass-elsewhere]

With ``--pass-elsewhere`` another thread is inside a pass all along: the calls here still run (they are in no pass),
but through the op's wrapper, which must look at the call's own context.

Each figure is the best of ``--repeats`` timings of ``--calls`` calls, in ns per call; compare the ratios within
one run (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import threading
import timeit
from collections.abc import Iterator

import torch
from torch import nn

import buildops
from buildops import BuildConfig, DynamicSpec, lists_kernels

CONFIG = BuildConfig(DynamicSpec("x", dim=0))


def plain(x, weight, eps=1e-6):
    return x


decorated = lists_kernels(CONFIG, output="x")(plain)


class Plain(nn.Module):
    def forward(self, x):
        return x


class Decorated(nn.Module):
    @lists_kernels(CONFIG, output="x")
    def forward(self, x):
        return x


def best_ns(stmt, calls: int, repeats: int) -> float:
    return min(timeit.repeat(stmt, number=calls, repeat=repeats)) / calls * 1e9


@contextlib.contextmanager
def pass_in_another_thread() -> Iterator[None]:
    entered, leave = threading.Event(), threading.Event()

    def hold_a_pass() -> None:
        with buildops.rehearsal("elsewhere"):
            entered.set()
            leave.wait()

    thread = threading.Thread(target=hold_a_pass, daemon=True)
    thread.start()
    entered.wait()
    try:
        yield
    finally:
        leave.set()
        thread.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--pass-elsewhere", action="store_true",
                        help="time the calls while another thread is inside a pass")
    args = parser.parse_args()

    x, w = torch.zeros(4, 8), torch.zeros(8)
    # Leave a builder behind with builds done, as after a real pass: the fast path must stay fast then too.
    with buildops.build_pass("warmup"):
        decorated.lister(lambda x, weight, eps: [buildops.Build("plain", ("k", x.shape), lambda: None)])
        decorated(x, w)
    plain_module, decorated_module = Plain(), Decorated()

    cases = [
        ("function", lambda: plain(x, w), lambda: decorated(x, w)),
        ("method", lambda: plain_module.forward(x), lambda: decorated_module.forward(x)),
        ("nn.Module call", lambda: plain_module(x), lambda: decorated_module(x)),
    ]
    print(f"# {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, {args.calls} calls, best of {args.repeats}"
          f"{', another thread in a pass' if args.pass_elsewhere else ''}")
    print(f"{'call':<16}{'plain ns':>10}{'decorated ns':>14}{'added ns':>10}{'ratio':>8}")
    with pass_in_another_thread() if args.pass_elsewhere else contextlib.nullcontext():
        for name, undecorated_call, decorated_call in cases:
            base = best_ns(undecorated_call, args.calls, args.repeats)
            wrapped = best_ns(decorated_call, args.calls, args.repeats)
            print(f"{name:<16}{base:>10.0f}{wrapped:>14.0f}{wrapped - base:>10.0f}{wrapped / base:>8.2f}")
    buildops.shutdown()


if __name__ == "__main__":
    main()
