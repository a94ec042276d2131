"""Tasks for worker-pool tests, in a module of their own: spawned workers import it, and it imports nothing heavy."""

import os
import time


def slow(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def crash(after: float) -> None:
    time.sleep(after)
    os._exit(3)  # as a segfault in a compiler would end the worker
