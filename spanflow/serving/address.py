"""The address the server will listen on, tried before any model loads: loading and compiling
every model only to find the port taken wastes the start-up and ends in uvicorn's own error."""
from __future__ import annotations

import errno
import socket

from spanflow.errors import ConfigError


def check_address(host: str, port: int) -> None:
    """Bind `host:port` once and let it go, as uvicorn binds it (SO_REUSEADDR: a port whose last
    connections are in TIME_WAIT is free); a ConfigError saying why the server could not listen there."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: a port is a number from 0 to 65535")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not a name or address this machine can listen on ({e.strerror})") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as e:
            raise ConfigError(_why(host, port, e)) from None


def _why(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"--port {port}: {host}:{port} is already in use (another server?); stop it or pick another --port"
    if e.errno == errno.EACCES:
        return f"--port {port}: not allowed to listen there (ports below 1024 need privileges); pick another --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
