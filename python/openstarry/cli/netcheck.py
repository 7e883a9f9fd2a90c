"""What a command cannot reach before it starts, and network errors told in one line.

``openstarry`` checks each Redis a command will use (its ``--bus``, its
manifest's ``bus.url`` and ``sessions.store``) with a ``PING`` before it
starts, and ends any command that meets a network error with one line and
exit status 1, never a traceback.
"""

from __future__ import annotations

import argparse
import socket
import sys

import anyio

from openstarry._redisurl import check_redis_url, is_redis_url
from openstarry.errors import ManifestError

__all__ = ["REDIS_CHECK_TIMEOUT", "network_failure", "one_line", "unreachable"]


#: Seconds each Redis a command will use has to answer a PING before the command starts.
REDIS_CHECK_TIMEOUT = 5.0


def _redis_urls(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The Redis servers a command will use, ``(what, URL)``: its ``--bus``, its manifest's."""
    found: list[tuple[str, str]] = []
    bus = getattr(args, "bus", None)
    if bus:
        found.append(("--bus", bus))
    if getattr(args, "manifest", None):
        from openstarry.manifest import load_manifest

        try:
            manifest = load_manifest(args.manifest)
        except ManifestError:
            pass  # the command itself reports it
        else:
            if not bus and manifest.bus.url:
                found.append(("the manifest's bus.url", manifest.bus.url))
            if manifest.sessions.store:
                found.append(("the manifest's sessions.store", manifest.sessions.store))
    # A URL that cannot name a server is the command's own to refuse (exit 2), not to ping.
    return [(what, url) for what, url in found if is_redis_url(url) and _names_a_server(url)]


def _names_a_server(url: str) -> bool:
    try:
        check_redis_url(url)
    except ValueError:
        return False
    return True


def unreachable(args: argparse.Namespace) -> tuple[int, str] | None:
    """What a command cannot reach before it starts: exit status and one line, or ``None``.

    Without this check, a worker, a producer or an agent on a Redis bus would
    retry its first connection forever (the bus backs off and retries a lost
    connection, which is right once it has run, not when nothing ever answered).
    """
    urls = _redis_urls(args)
    if not urls:
        return None
    try:
        from openstarry.bus.redis.reader import ping
        from openstarry.cli.busargs import redacted
    except ImportError:
        return None  # no [redis] extra: the command says so itself
    for what, url in urls:
        try:
            anyio.run(ping, url, REDIS_CHECK_TIMEOUT)
        except ValueError as exc:  # redis-py's parsing of the URL
            return 2, f"{what}: not a Redis URL: {redacted(url)}: {one_line(exc)}"
        except Exception as exc:
            if network_failure(exc) is None:
                if _refused(exc):  # it answered: no such database, a wrong password
                    return 2, f"{what}: {redacted(url)}: {one_line(exc)}"
                raise
            return 1, f"cannot reach Redis at {redacted(url)} ({what}): {one_line(exc)}"
    return None


def _refused(exc: BaseException) -> bool:
    """Whether Redis answered and refused (``DB index is out of range``, a wrong password)."""
    redis_errors = sys.modules.get("redis.exceptions")
    return redis_errors is not None and isinstance(exc, redis_errors.ResponseError)


def network_failure(exc: BaseException) -> BaseException | None:
    """The network error ``exc`` is (for a group: holds, and nothing else), else ``None``."""
    inner = getattr(exc, "exceptions", None)
    if type(exc).__name__.endswith("ExceptionGroup") and isinstance(inner, tuple) and inner:
        failures = [network_failure(e) for e in inner]
        return failures[0] if all(failures) else None
    kinds: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError, socket.gaierror)
    redis_errors = sys.modules.get("redis.exceptions")
    if redis_errors is not None:  # if redis never loaded, no error came from it
        kinds += (redis_errors.ConnectionError, redis_errors.TimeoutError)
    return exc if isinstance(exc, kinds) else None


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text or type(exc).__name__
