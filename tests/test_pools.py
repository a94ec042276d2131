"""Worker pools: the processes that Triton and DeepGEMM builds run in."""

import os

from buildops._pools import WorkerPool


def test_a_forked_child_starts_workers_of_its_own():
    """The child forgets the parent's pool and the parent's forkserver, and builds through its own."""
    pool = WorkerPool("test", lambda: 1, preload=("json",))
    try:
        parent_worker = pool.run("a pid", os.getpid)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                child_worker = pool.run("a pid", os.getpid)
                os.write(write, b"own workers" if child_worker != parent_worker else b"the parent's workers")
            except BaseException as error:  # noqa: BLE001 - reported to the parent
                os.write(write, repr(error).encode()[:200])
            finally:
                pool.shutdown()
                os._exit(0)
        os.close(write)
        assert os.read(read, 300) == b"own workers"
        assert os.waitpid(pid, 0)[1] == 0
        assert pool.run("a pid", os.getpid) == parent_worker  # the parent's pool is untouched
    finally:
        pool.shutdown()
