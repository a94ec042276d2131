"""The test helper RedisServer, against a real redis-server: the store's tests rely on each of these."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import WAIT, until

redis = pytest.importorskip("redis", reason="the store extra (redis) is not installed here")

# the shared server's fixture also skips the module without redis-server (fails it in CI)
pytestmark = pytest.mark.usefixtures("redis_server")


def _refuses_connections(port):
    with socket.socket() as sock:
        sock.settimeout(WAIT)
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _gone(pid):
    """No such process, or a zombie that only waits to be reaped (a container's init may be slow to reap)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_answers_with_the_password_and_refuses_without_it(redis_url, redis_server):
    with redis.Redis.from_url(redis_url) as client:
        assert client.ping()
        client.set("key", b"value")
        assert client.get("key") == b"value"
    for password in (None, "wrong"):
        with redis_server.client(password=password) as client:
            with pytest.raises(redis.AuthenticationError):
                client.get("key")


@pytest.mark.parametrize("run", ["first", "second"])
def test_redis_url_starts_each_test_with_an_empty_database(redis_url, run):
    with redis.Redis.from_url(redis_url) as client:
        assert client.dbsize() == 0  # whichever run comes second finds the other's key flushed
        client.set(f"key-{run}", b"value")


def test_kill_makes_the_port_refuse_and_restart_serves_again(fresh_redis_server):
    server = fresh_redis_server
    port, password = server.port, server.password
    with server.client() as client:
        client.set("key", b"value")
    server.kill()
    assert _refuses_connections(port)
    with server.client() as client:
        with pytest.raises(redis.ConnectionError):
            client.ping()

    server.restart()
    assert (server.port, server.password) == (port, password)
    with server.client() as client:
        assert client.ping()
        assert client.get("key") is None  # nothing is persisted


def test_maxmemory_with_noeviction_makes_a_large_set_fail(fresh_redis_server):
    fresh_redis_server.config_set("maxmemory-policy", "noeviction")
    fresh_redis_server.config_set("maxmemory", 2 * 1024 * 1024)
    with fresh_redis_server.client() as client:
        client.set("small", b"x")
        with pytest.raises(redis.exceptions.OutOfMemoryError, match="maxmemory"):  # the server's -OOM reply
            client.set("large", b"x" * (4 * 1024 * 1024))
        assert client.get("large") is None


def test_the_shared_and_a_fresh_server_get_different_ports(redis_server, fresh_redis_server):
    assert redis_server.port != fresh_redis_server.port
    assert redis_server.password != fresh_redis_server.password


def test_stop_leaves_no_process(fresh_redis_server):
    server = fresh_redis_server
    pid, port = server.process.pid, server.port
    server.stop()
    assert server.process is None
    assert _gone(pid)
    with pytest.raises(ProcessLookupError):
        os.killpg(pid, 0)  # nothing left in its process group either
    assert _refuses_connections(port)


def test_the_server_dies_with_the_process_that_started_it(tmp_path):
    """A test run killed outright (no fixture teardown) must not leave its server running."""
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from redis_server import RedisServer
        server = RedisServer({str(tmp_path / "orphan")!r})
        print(server.process.pid, server.port, flush=True)
        time.sleep({WAIT})
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        pid, _port = map(int, parent.stdout.readline().split())
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait(WAIT)
        parent.stdout.close()
    assert until(lambda: _gone(pid)), f"redis-server {pid} outlived the process that started it"
    # Not whether its port refuses: while the orphan dies unobserved, another test's server may take that free port.
