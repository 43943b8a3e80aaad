"""The address the server will listen on, bound before any model loads and held until the server
listens on it: loading and compiling every model only to find the port taken (or taken meanwhile)
wastes the start-up and ends in uvicorn's own error."""
from __future__ import annotations

import errno
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from spanflow.errors import ConfigError


@contextmanager
def listening(host: str, port: int) -> Iterator[list[socket.socket]]:
    """Sockets listening on every address `host` resolves to (as uvicorn would listen: IPv6 ones
    IPv6 only, SO_REUSEADDR so that a port whose last connections are in TIME_WAIT is free), on
    `port` (0: the one the system gives the first, taken on the others too); closed on leaving.
    Listening, the port is the server's alone (a socket only bound would let another server bind
    it too); connections made before the server accepts wait in the backlog. A ConfigError says
    why it could not listen."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: a port is a number from 0 to 65535")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not a name or address this machine can listen on ({e.strerror})") from None
    socks: list[socket.socket] = []
    try:
        for family, kind, proto, _, addr in dict.fromkeys((i[0], i[1], i[2], None, i[4]) for i in infos):
            s = socket.socket(family, kind, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            if port == 0 and len(socks) > 1:
                addr = (addr[0], socks[0].getsockname()[1], *addr[2:])
            s.bind(addr)
            s.listen(2048)  # uvicorn's default backlog
    except OSError as e:
        for s in socks:
            s.close()
        raise ConfigError(_why(host, port, e)) from None
    try:
        yield socks
    finally:
        for s in socks:
            s.close()


def serve_on(socks: list[socket.socket], app, **config) -> None:
    """Run `app` under uvicorn on the listening `socks` (uvicorn.Config's other settings in
    `config`) until it is stopped."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, **config)).run(sockets=socks)


def _why(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"--port {port}: {host}:{port} is already in use (another server?); stop it or pick another --port"
    if e.errno == errno.EACCES:
        return f"--port {port}: not allowed to listen there (ports below 1024 need privileges); pick another --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
