"""The official `openai` client against a live `spanflow serve` on loopback."""
import json
import socket
import threading
import time

import numpy as np
import pytest

openai = pytest.importorskip("openai")
uvicorn = pytest.importorskip("uvicorn")

from spanflow.tasks.embed import Embedder  # noqa: E402
from spanflow.models.encoder import build_tiny  # noqa: E402
from spanflow.serving.app import create_app  # noqa: E402
from spanflow.serving.guard import deadline_protocol  # noqa: E402
from spanflow.serving.options import ServeOptions  # noqa: E402
from spanflow.serving.services import load_service  # noqa: E402

TEXTS = ["the cat sat on the mat", "a storm is coming", "stocks fell sharply today"]


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    d = tmp_path_factory.mktemp("oai")
    enc, tok = build_tiny(TEXTS * 3, hidden=16, embedding=16, bigram_buckets=101)
    enc.save_pretrained(d / "emb")
    tok.save_pretrained(d / "emb")
    app = create_app([load_service(f"emb={d / 'emb'}", device="cpu")], ServeOptions(api_key="k"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        http=deadline_protocol(10)))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    while not srv.started:
        time.sleep(0.05)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k", max_retries=0)
    yield client, Embedder.load(str(d / "emb"), device="cpu").encode(TEXTS)
    srv.should_exit = True
    t.join(30)


def vectors(resp):
    return np.array([d.embedding for d in resp.data], dtype=np.float32)


def test_client_defaults_float_and_base64_give_the_same_vectors(live):
    client, want = live
    default = client.embeddings.create(model="emb", input=TEXTS)  # the client asks for base64 by default
    assert default.model == "emb" and [d.index for d in default.data] == [0, 1, 2]
    np.testing.assert_allclose(vectors(default), want, atol=1e-5)
    floats = client.embeddings.create(model="emb", input=TEXTS, encoding_format="float", user="someone")
    np.testing.assert_allclose(vectors(floats), want, atol=1e-5)
    raw = client.embeddings.with_raw_response.create(model="emb", input=TEXTS, encoding_format="base64")
    assert isinstance(raw.http_response.json()["data"][0]["embedding"], str)  # base64 on the wire, not floats
    floats_raw = client.embeddings.with_raw_response.create(model="emb", input=TEXTS, encoding_format="float")
    b64 = sum(len(d["embedding"]) for d in raw.http_response.json()["data"])
    text = sum(len(json.dumps(d["embedding"])) for d in floats_raw.http_response.json()["data"])
    assert b64 < 0.6 * text  # 4 bytes a float, base64'd, against about 11 characters a float


def test_dimensions_truncate_and_renormalise(live):
    client, want = live
    r = client.embeddings.create(model="emb", input=TEXTS, dimensions=8, encoding_format="float")
    v = vectors(r)
    cut = want[:, :8] / np.linalg.norm(want[:, :8], axis=1, keepdims=True)
    assert v.shape == (3, 8)
    np.testing.assert_allclose(v, cut, atol=1e-5)
    with pytest.raises(openai.UnprocessableEntityError, match="dimensions"):
        client.embeddings.create(model="emb", input=TEXTS, dimensions=want.shape[1] + 1)
    # the full width is the model's own rows, as without `dimensions`: not normalised where the model is not
    assert not np.allclose(np.linalg.norm(want, axis=1), 1.0, atol=1e-3)
    full = client.embeddings.create(model="emb", input=TEXTS, dimensions=want.shape[1], encoding_format="float")
    np.testing.assert_allclose(vectors(full), want, atol=1e-5)


def test_token_ids_are_refused_and_any_model_name_reaches_the_one_model(live):
    client, want = live
    with pytest.raises(openai.UnprocessableEntityError, match="token ids") as e:
        client.embeddings.create(model="emb", input=[[101, 2023, 102]])
    assert e.value.type == "invalid_request_error" and e.value.param == "input"
    r = client.embeddings.create(model="text-embedding-3-small", input=TEXTS[:1], encoding_format="float")
    assert r.model == "emb"  # the model that answered
    np.testing.assert_allclose(vectors(r), want[:1], atol=1e-5)


def test_models_list(live):
    client, _ = live
    models = client.models.list()
    assert [m.id for m in models.data] == ["emb"] and models.data[0].owned_by == "spanflow"
    assert client.models.retrieve("emb").id == "emb"
    with pytest.raises(openai.NotFoundError, match="no model named 'other'"):
        client.models.retrieve("other")


def test_an_empty_input_is_refused_as_openai_refuses_it(live):
    client, _ = live
    # a 200 without data would be the client's own ValueError ("No embedding data received")
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="emb", input=[])
    assert e.value.body["param"] == "input" and "empty list" in e.value.body["message"]
