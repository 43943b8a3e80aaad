"""The address the server will listen on, bound before any model loads and held until the server
listens on it: loading and compiling every model only to find the port taken (or taken meanwhile)
wastes the start-up and ends in uvicorn's own error."""
from __future__ import annotations

import errno
import socket

from spanflow.errors import ConfigError


def bind_address(host: str, port: int) -> socket.socket:
    """A socket listening on `host:port`, bound as uvicorn binds one (SO_REUSEADDR: a port whose
    last connections are in TIME_WAIT is free); listening, it is the server's alone (a socket only
    bound would let another bind the port too, and lose it at its own listen). Connections made
    before the server accepts wait in its backlog. A ConfigError says why it could not listen."""
    if not 0 <= port <= 65535:
        raise ConfigError(f"--port {port}: a port is a number from 0 to 65535")
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not a name or address this machine can listen on ({e.strerror})") from None
    s = socket.socket(family, kind, proto)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(addr)
        s.listen(2048)  # uvicorn's default backlog
    except OSError as e:
        s.close()
        raise ConfigError(_why(host, port, e)) from None
    return s


def serve_on(sock: socket.socket, app, **config) -> None:
    """Run `app` under uvicorn on the bound `sock` (uvicorn.Config's other settings in `config`)
    until it is stopped."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, **config)).run(sockets=[sock])


def _why(host: str, port: int, e: OSError) -> str:
    if e.errno == errno.EADDRINUSE:
        return f"--port {port}: {host}:{port} is already in use (another server?); stop it or pick another --port"
    if e.errno == errno.EACCES:
        return f"--port {port}: not allowed to listen there (ports below 1024 need privileges); pick another --port"
    if e.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine"
    return f"cannot listen on {host}:{port}: {e.strerror or e}"
