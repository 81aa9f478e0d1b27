"""redis-server on the local plane: its ACL file (the default user off, ``admin`` with everything, one user per hoss
component with only the commands and keys it needs: `deploy.lockdown.REDIS_ACL`), its command line (no
persistence: a restarted redis-server comes back empty, as after a crash), and a PING as an ACL user."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from deploy import lockdown, pki
from dev.local.errors import PlaneError


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found is None:
        raise PlaneError("redis-server not found on PATH; install Debian's redis-server (`make deps` does)")
    return found


def redis_version(redis_server: str) -> tuple[int, ...]:
    """``redis-server --version``'s version, e.g. (7, 0, 15); (0,) when it cannot be read."""
    try:
        output = subprocess.run([redis_server, "--version"], capture_output=True, text=True, check=False).stdout
    except OSError:
        return (0,)
    found = re.search(r"v=(\d+)\.(\d+)\.(\d+)", output)
    return tuple(int(part) for part in found.groups()) if found else (0,)


def write_acl(path: Path, passwords: Mapping[str, str], *, redis_server: str) -> Path:
    """The ACL file (mode 0600) for ``passwords`` (user -> password)."""
    text = lockdown.redis_acl(passwords, admin=True, client_setinfo=redis_version(redis_server) >= (7, 2))
    pki.write_private(path, text.encode())
    return path


def redis_argv(redis_server: str, *, port: int, directory: Path, acl: Path) -> list[str]:
    return [
        redis_server,
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
        "--protected-mode", "yes",
        "--aclfile", str(acl),
    ]


def redis_ping(port: int, user: str, password: str) -> bool:
    """AUTH as ``user`` and PING on 127.0.0.1:``port``; True when both are answered OK."""
    command = [b"AUTH", user.encode(), password.encode()]
    auth = b"*3\r\n" + b"".join(b"$%d\r\n%s\r\n" % (len(part), part) for part in command)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as conn:
            conn.sendall(auth + b"PING\r\n")
            reply = b""
            while reply.count(b"\r\n") < 2:
                chunk = conn.recv(64)
                if not chunk:
                    break
                reply += chunk
            return reply == b"+OK\r\n+PONG\r\n"
    except OSError:
        return False
