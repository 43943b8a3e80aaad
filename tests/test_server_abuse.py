"""The abuse cases of tests/abuse.py against a live server on loopback, through the same protocol
class `spanflow serve` runs."""
import logging
import socket
import threading
import time

import pytest

pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

import abuse  # noqa: E402  (tests/ is on sys.path under pytest's rootdir conftest)
from spanflow.data.synthetic import synthetic_ner  # noqa: E402
from spanflow.serving.app import ServeOptions, create_app  # noqa: E402
from spanflow.serving.guard import deadline_protocol  # noqa: E402
from spanflow.serving.services import load_service  # noqa: E402
from spanflow.training.options import TrainOptions  # noqa: E402

KEY = "s3cret"
READ_TIMEOUT = 1.0


class Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from spanflow.tasks.ner import train_ner

    d = tmp_path_factory.mktemp("abuse")
    train_ner(synthetic_ner(30, seed=2), None, out_dir=str(d / "ner"), log_fn=lambda s: None,
              options=TrainOptions(epochs=1, max_tokens=512, log_every=0))
    services = [load_service(f"ner={d / 'ner' / 'model'}", device="cpu")]
    app = create_app(services, ServeOptions(api_key=KEY, read_timeout=READ_TIMEOUT))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                         http=deadline_protocol(READ_TIMEOUT))
    srv = uvicorn.Server(cfg)
    errors = Errors()
    logging.getLogger().addHandler(errors)
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 60
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    while abuse.request("127.0.0.1", port, "GET", "/ready", headers={"Authorization": f"Bearer {KEY}"})[0] != 200:
        time.sleep(0.1)
    yield {"port": port, "app": app, "services": services, "errors": errors}
    srv.should_exit = True
    t.join(30)
    logging.getLogger().removeHandler(errors)


def test_every_abuse_case_gets_a_4xx_and_the_server_stays_healthy(server):
    failed = abuse.run(f"http://127.0.0.1:{server['port']}", KEY, READ_TIMEOUT)
    assert failed == []
    status, raw = abuse.request("127.0.0.1", server["port"], "GET", "/metrics",
                                headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200 and b'status="5' not in raw
    assert b'spanflow_requests_total{route="/v1/ner",status="400"}' in raw
    # 20 clients that vanished mid-body and the others: not one ERROR line, let alone a traceback
    assert [r.getMessage() for r in server["errors"].records] == []


def test_an_internal_error_is_one_json_500_counted_in_metrics(server, monkeypatch):
    svc = server["services"][0]

    def broken(*a, **k):
        raise RuntimeError("boom")

    monkeypatch.setattr(svc, "respond", broken)
    auth = {"Authorization": f"Bearer {KEY}"}
    status, raw = abuse.request("127.0.0.1", server["port"], "POST", "/v1/ner", b'{"texts": ["a b"]}', auth)
    assert status == 500 and b'"internal server error"' in raw and b"boom" not in raw
    _, m = abuse.request("127.0.0.1", server["port"], "GET", "/metrics", headers=auth)
    assert b'spanflow_requests_total{route="/v1/ner",status="500"} 1.0' in m
    logged = server["errors"].records
    assert len(logged) == 1 and logged[0].exc_info is not None
    logged.clear()


def _count(metrics: bytes, route: str, status: int) -> float:
    import re

    m = re.search(rb'spanflow_requests_total\{route="' + re.escape(route.encode()) + rb'",status="'
                  + str(status).encode() + rb'"\} ([0-9.]+)', metrics)
    return float(m.group(1)) if m else 0.0


def test_unknown_paths_share_one_metrics_label(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    before = abuse.request("127.0.0.1", server["port"], "GET", "/metrics", headers=auth)[1]  # other tests' too
    for i in range(5):
        assert abuse.request("127.0.0.1", server["port"], "GET", f"/nope{i}", headers=auth)[0] == 404
    for name in ("ner", "nothere", ""):  # a route with a parameter is counted under its template
        abuse.request("127.0.0.1", server["port"], "GET", f"/v1/models/{name}", headers=auth)
    _, m = abuse.request("127.0.0.1", server["port"], "GET", "/metrics", headers=auth)
    assert _count(m, "other", 404) - _count(before, "other", 404) == 5 and b"/nope" not in m
    models = "/v1/models/{name}"  # as users read it: no router converter in the label
    assert _count(m, models, 404) - _count(before, models, 404) == 2 and b"nothere" not in m
    assert _count(m, models, 200) - _count(before, models, 200) == 1
