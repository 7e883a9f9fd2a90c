"""A throwaway ``redis-server`` for tests and benchmarks: on a free port in a folder you give.

    server = RedisServer(tmp_path)
    server.start()
    try:
        bus = EventBus.from_url(server.url)
        ...
    finally:
        server.stop()

It needs Debian's ``redis-server`` (or any on ``PATH``); openstarry's own tests
and benchmarks use it, so that no fake stands in for Redis. By default the
server runs with AOF on (``appendfsync always``), so that :meth:`RedisServer.restart`
keeps every acknowledged write; ``aof=False`` keeps everything in memory.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

__all__ = ["RedisServer", "redis_server_path"]


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One redis-server process; :meth:`restart` keeps its data (AOF) and port."""

    def __init__(self, folder: Path, *, aof: bool = True) -> None:
        self.folder = folder
        self.aof = aof
        self.port = _free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        path = redis_server_path()
        assert path is not None, "redis-server is missing: `make test` installs it"
        self.process = subprocess.Popen(
            [
                path,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.folder),
                "--appendonly",
                "yes" if self.aof else "no",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--protected-mode",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            time.sleep(0.02)
        raise RuntimeError("redis-server did not answer within 10 s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)  # a clean shutdown writes the AOF out
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()
