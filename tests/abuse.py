"""Abuse a running `spanflow serve` the way a careless or hostile client would.

    python tests/abuse.py --url http://127.0.0.1:8080 [--api-key KEY] [--read-timeout 10]

Each case goes over a raw socket, so nothing in a client library tidies the bytes up. After
every case the server must have answered no 5xx and `/health` must answer 200. The server
should serve an NER model (the cases post to /v1/ner). Exits 1 naming the failed cases.
"""
from __future__ import annotations

import argparse
import socket
import sys
import time
from urllib.parse import urlparse


def _connect(host: str, port: int) -> socket.socket:
    s = socket.create_connection((host, port), timeout=30)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _status(raw: bytes) -> int | None:
    try:
        return int(raw.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def _read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    return out


def request(host: str, port: int, method: str, path: str, body: bytes = b"", headers: dict | None = None,
            *, timeout: float = 30) -> tuple[int | None, bytes]:
    """One request on a fresh connection ("Connection: close"); (status, raw response)."""
    hdrs = {"Host": host, "Connection": "close", "Content-Type": "application/json",
            "Content-Length": str(len(body)), **(headers or {})}
    head = f"{method} {path} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in hdrs.items()) + "\r\n"
    with _connect(host, port) as s:
        s.sendall(head.encode("latin-1") + body)
        raw = _read_all(s, timeout)
    return _status(raw), raw


def cases(host: str, port: int, key: str | None, read_timeout: float):
    """(name, check) pairs; a check returns None when the server behaved, else what went wrong."""
    auth = {"Authorization": f"Bearer {key}"} if key else {}

    def post(body: bytes, **kw):
        return request(host, port, "POST", "/v1/ner", body, auth, **kw)

    def client_error(body: bytes):
        def check():
            status, raw = post(body)
            return None if status is not None and 400 <= status < 500 else f"status {status}: {raw[-200:]!r}"
        return check

    def disconnect_mid_body():
        for _ in range(20):
            with _connect(host, port) as s:
                head = f"POST /v1/ner HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1000\r\n"
                head += "".join(f"{k}: {v}\r\n" for k, v in auth.items())
                s.sendall(head.encode() + b"\r\n" + b'{"texts": ["a')
        return None

    def short_body():
        t0 = time.monotonic()
        with _connect(host, port) as s:
            head = f"POST /v1/ner HTTP/1.1\r\nHost: {host}\r\nContent-Length: 100\r\n"
            head += "".join(f"{k}: {v}\r\n" for k, v in auth.items())
            s.sendall(head.encode() + b"\r\n" + b'{"texts": ')
            raw = _read_all(s, read_timeout * 3 + 5)
        took = time.monotonic() - t0
        if _status(raw) != 408 or took > read_timeout * 2 + 5:
            return f"status {_status(raw)} after {took:.1f}s (want 408 within ~{read_timeout:g}s)"
        return None

    def idle_connection():
        t0 = time.monotonic()
        with _connect(host, port) as s:
            s.sendall(b"POST /v1/ner HTTP/1.1\r\nHo")  # headers that never finish
            _read_all(s, read_timeout * 3 + 5)
        took = time.monotonic() - t0
        return None if took <= read_timeout * 2 + 5 else f"held open {took:.1f}s"

    def answered(status_wanted: int, path: str, body: bytes, headers: dict, said: bytes):
        def check():
            status, raw = request(host, port, "POST", path, body, {**auth, **headers})
            ok = status == status_wanted and said in raw
            return None if ok else f"status {status}: {raw[-200:]!r} (want {status_wanted} saying {said!r})"
        return check

    def docs_need_the_key():
        if not key:
            return None
        bad = [p for p in ("/docs", "/redoc", "/openapi.json", "/metrics")
               if request(host, port, "GET", p)[0] != 401]
        status, raw = request(host, port, "GET", "/ready")  # open to a probe, naming no model
        bad += ["/ready"] if status == 200 and b"models" in raw else []
        status, _ = request(host, port, "POST", "/v1/ner", b'{"texts": ["a"]}', {"Authorization": f"bEaReR {key}"})
        return (f"answered without a key: {bad}" if bad else None) or (
            None if status == 200 else f"lower-case bearer scheme got {status}")

    return [
        ("nested JSON", client_error(b"[" * 100_000)),
        ("nested JSON in an object", client_error(b'{"texts": ' + b"[" * 100_000)),
        ("lone surrogate", client_error(b'{"texts": ["\\ud800"]}')),
        ("lone surrogate as a key", answered(422, "/v1/ner", b'{"texts": ["a"], "\\ud800": 1}', {},
                                             b"unknown field")),
        ("5000-digit integer", client_error(b'{"texts": ["a"], "n": ' + b"7" * 5000 + b"}")),
        ("invalid UTF-8", client_error(b'{"texts": ["\xff\xfe"]}')),
        ("texts of the wrong type", client_error(b'{"texts": [{"a": 1}]}')),
        ("client disconnects mid-body", disconnect_mid_body),
        ("Content-Length over the body", short_body),
        ("connection that never finishes its headers", idle_connection),
        ("docs and schema need the key", docs_need_the_key),
        ("a compressed body", answered(415, "/v1/ner", b"\x1f\x8b\x08\x00", {"Content-Encoding": "gzip"},
                                       b"unsupported Content-Encoding 'gzip'")),
        ("a trailing slash", answered(404, "/v1/ner/", b'{"texts": ["a"]}', {}, b"POST /v1/ner")),
    ]


def run(url: str, key: str | None = None, read_timeout: float = 10.0) -> list[str]:
    """Run every case; the failures, each as 'case: what happened'."""
    u = urlparse(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    failed = []
    for name, check in cases(host, port, key, read_timeout):
        problem = check()
        health, _ = request(host, port, "GET", "/health")
        if health != 200:
            problem = (problem or "") + f" /health answered {health}"
        print(f"{'FAIL' if problem else 'ok  '} {name}" + (f": {problem}" if problem else ""))
        if problem:
            failed.append(f"{name}: {problem}")
    return failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:8080")
    p.add_argument("--api-key", default=None)
    p.add_argument("--read-timeout", type=float, default=10.0, help="the server's --read-timeout")
    a = p.parse_args()
    return 1 if run(a.url, a.api_key, a.read_timeout) else 0


if __name__ == "__main__":
    sys.exit(main())
