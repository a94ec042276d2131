"""A real redis-server for the tests, on loopback, owned by the test process and gone when it is."""

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import redis

START_TIMEOUT = 10.0  # seconds for the server to answer PING; every wait has a timeout so a bug fails, not hangs
_PR_SET_PDEATHSIG = 1


class RedisServerError(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent_hook():
    """A preexec_fn that has the kernel SIGKILL the server when the process that started it dies, even by SIGKILL.

    prctl is looked up here, in the parent, so the child does as little as possible between fork and exec.
    """
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


class RedisServer:
    """A redis-server at a free port of 127.0.0.1 with a random password, nothing persisted, its files in ``directory``.

    Start it from a thread that outlives it (the main thread): the kernel's parent-death signal follows the thread.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.host = "127.0.0.1"
        self.port = _free_port()
        self.password = secrets.token_hex(16)
        self.log_path = self.directory / "redis-server.log"
        self.process: subprocess.Popen | None = None
        self._start()

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@{self.host}:{self.port}/0"

    def client(self, **options) -> redis.Redis:
        """A client of this server; ``options`` override redis.Redis's (``password=None`` for none).

        It does not retry (redis-py's default retries with backoff for seconds), so a test sees a refusal at once.
        """
        options = {"password": self.password, "socket_timeout": START_TIMEOUT, "retry": None, **options}
        return redis.Redis(host=self.host, port=self.port, **options)

    def config_set(self, name: str, value) -> None:
        with self.client() as client:
            client.config_set(name, value)

    def kill(self) -> None:
        """SIGKILL the server (and anything it forked: it leads its own process group), as a crash would."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(START_TIMEOUT)
        self.process = None

    def restart(self) -> None:
        """Start again on the same port with the same password; the data is gone, as nothing is persisted."""
        self.stop()
        self._start()

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.terminate()
        try:
            self.process.wait(START_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def _start(self) -> None:
        command = ["redis-server", "--port", str(self.port), "--bind", self.host, "--requirepass", self.password,
                   "--save", "", "--appendonly", "no", "--daemonize", "no", "--dir", str(self.directory)]
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                            start_new_session=True, preexec_fn=_die_with_parent_hook())
        deadline = time.monotonic() + START_TIMEOUT
        with self.client(socket_timeout=1.0, socket_connect_timeout=1.0) as client:
            while True:
                try:
                    client.ping()
                    return
                except (redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError) as error:
                    exited = self.process.poll()
                    if exited is not None or time.monotonic() > deadline:
                        self.kill()
                        what = f"exited with {exited}" if exited is not None else f"no PING in {START_TIMEOUT:g} s"
                        raise RedisServerError(f"redis-server at {self.host}:{self.port} {what} ({error}); "
                                               f"its log {self.log_path}:\n{self.log_path.read_text()}") from error
                time.sleep(0.02)
