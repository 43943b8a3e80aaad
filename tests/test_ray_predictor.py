"""spanflow.ray.Predictor on its own (no Ray): a batch in, the batch with the task's results and
`error` out; what it cannot run is a ConfigError naming it. tests/test_ray.py runs it in Ray Data."""
import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
from helpers import tiny_bert

from spanflow.data.synthetic import synthetic_ner
from spanflow.errors import ConfigError, ModelDirError
from spanflow.ray import Predictor

TEXTS = [e.text for e in synthetic_ner(12, seed=5)]


@pytest.fixture(scope="module")
def ner_dir(tmp_path_factory):
    from spanflow.tasks.ner import NerModel

    path = tmp_path_factory.mktemp("ner")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=1, heads=2, seed=1)
    NerModel(encoder=enc, tokenizer=tok, labels=["LOC", "PER"], limit=64).save(str(path))
    return str(path)


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("enc")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=1, heads=2, seed=0)
    enc.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def ner(ner_dir, **kw):
    return Predictor(ner_dir, device="cpu", precision="fp32", **kw)


def test_a_batch_gets_the_models_entities_and_keeps_its_columns(ner_dir):
    from spanflow.tasks.ner import NerModel

    texts = [None if k == 3 else t for k, t in enumerate(TEXTS)]
    out = ner(ner_dir, column="body")(pa.table({"body": texts, "n": list(range(len(texts)))}))
    assert out.column_names == ["body", "n", "entities", "error"]
    want = NerModel.load(ner_dir, device="cpu", precision="fp32").predict([t or "" for t in texts])
    rows = out.to_pylist()
    assert [r["n"] for r in rows] == list(range(len(texts)))
    for k, (r, spans) in enumerate(zip(rows, want)):
        if k == 3:
            assert r["entities"] is None and r["error"] == "column 'body' holds null, expected a string"
        else:
            assert r["error"] is None
            assert [(e["start"], e["end"], e["label"]) for e in r["entities"]] == [tuple(s) for s in spans]
    assert any(want), "the untrained model found nothing: the comparison above would be empty"


def test_an_arrow_batch_in_pieces_comes_back_as_one_record_batch(ner_dir):
    """Ray Data's Parquet writer hands a table's record batches to pyarrow's write_dataset on
    threads, which may write them in any order: a batch leaves the stage in one."""
    half = len(TEXTS) // 2
    batch = pa.concat_tables([pa.table({"text": TEXTS[:half], "n": list(range(half))}),
                              pa.table({"text": TEXTS[half:], "n": list(range(half, len(TEXTS)))})])
    out = ner(ner_dir)(batch)
    assert [len(b) for b in out.to_batches()] == [len(TEXTS)]
    assert out.column("n").to_pylist() == list(range(len(TEXTS)))


def test_pandas_and_numpy_batches_come_back_as_themselves_with_the_same_rows(ner_dir):
    """Ray Data's batch formats: each comes back in its own format, its columns untouched (a
    column of 2-D arrays too), the results as the Arrow batch gets them."""
    pd = pytest.importorskip("pandas")
    p = ner(ner_dir)
    want = p(pa.table({"text": TEXTS}))["entities"].to_pylist()
    frame = p(pd.DataFrame({"text": TEXTS}, index=range(10, 10 + len(TEXTS))))
    assert list(frame.columns) == ["text", "entities", "error"] and list(frame.index)[0] == 10
    assert frame["entities"].tolist() == want
    grids = np.arange(len(TEXTS) * 4, dtype=np.float32).reshape(len(TEXTS), 2, 2)
    got = p({"text": np.array(TEXTS), "grid": grids})
    assert list(got) == ["text", "grid", "entities", "error"] and got["grid"] is grids
    assert got["entities"].tolist() == want and got["error"].tolist() == [None] * len(TEXTS)
    listed = p({"text": list(TEXTS), "n": list(range(len(TEXTS)))})  # a dict of lists (an AttributeError before)
    assert listed["entities"].tolist() == want and listed["n"] == list(range(len(TEXTS)))
    assert p(pa.RecordBatch.from_pydict({"text": TEXTS}))["entities"].to_pylist() == want
    assert p(pa.table({"text": pa.array([], pa.string())})).column_names == ["text", "entities", "error"]
    cats = p(pa.table({"text": pa.array(TEXTS).dictionary_encode()}))  # a categorical column (was a crash)
    assert cats["entities"].to_pylist() == want
    for kind in (pa.large_string(), getattr(pa, "string_view", pa.string)()):  # other string layouts, as the CLI
        assert p(pa.table({"text": pa.array(TEXTS).cast(kind)}))["entities"].to_pylist() == want  # takes them
    # one value not a string in a column of objects is its row's error, as a null is (it failed the whole job)
    mixed = p(pd.DataFrame({"text": [TEXTS[0], 5, TEXTS[1]]}))
    assert mixed["entities"].tolist() == [want[0], None, want[1]]
    assert [None if pd.isna(x) else x for x in mixed["error"]] == [None, "column 'text' holds int 5, expected a "
                                                                       "string", None]
    gone = p(pd.DataFrame({"text": [float("nan"), float("nan")]}))  # every text missing: float64, error rows
    assert gone["entities"].tolist() == [None, None]


def test_embeddings_as_embed_computes_them_and_their_dtype(enc_dir):
    from spanflow.tasks.embed import Embedder

    want = Embedder.load(enc_dir, precision="fp32", device="cpu").encode(TEXTS)
    p = Predictor(enc_dir, device="cpu", precision="fp32")
    got = p(pa.table({"text": TEXTS}))
    assert np.allclose(np.array(got["embedding"].to_pylist()), want, atol=1e-6)
    as_numpy = p({"text": np.array(TEXTS)})["embedding"]  # one 2-D array, as Ray's numpy format holds vectors
    assert as_numpy.shape == want.shape and np.allclose(as_numpy, want, atol=1e-6)
    holed = p({"text": np.array([TEXTS[0], None], dtype=object)})["embedding"]  # an error row: NaN, one type
    assert holed.shape == (2, want.shape[1]) and np.allclose(holed[0], want[0], atol=1e-6) and np.isnan(holed[1]).all()
    half = Predictor(enc_dir, device="cpu", precision="fp32", dtype="float16")(pa.table({"text": TEXTS}))
    assert half.schema.field("embedding").type.value_type == pa.float16()
    unit = Embedder.load(enc_dir, precision="fp32", device="cpu").encode(TEXTS, normalize=True)
    got = Predictor(enc_dir, device="cpu", precision="fp32", normalize=True)(pa.table({"text": TEXTS}))
    vectors = np.array(got["embedding"].to_pylist())
    assert np.allclose(vectors, unit, atol=1e-6) and np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)


@pytest.mark.parametrize("batch, said", [
    (pa.table({"body": ["a"]}), "the batch has no column 'text' (column= names its texts); it has 'body'"),
    (pa.table({"text": [1]}), "column 'text' holds int64, not strings"),
    ({"text": np.array([1, 2])}, "column 'text' holds int64, not strings"),  # a typed column as Arrow's
    (pa.table({"text": ["a"], "error": ["x"]}), "the batch already has a column 'error'"),
    (pa.table({"text": ["a"], "entities": [1]}), "the batch already has a column 'entities'"),
    (["a text"], "a batch is a pyarrow Table, a pandas DataFrame or a dict of arrays, got list"),
])
def test_a_batch_it_cannot_run_is_a_config_error_naming_why(ner_dir, batch, said):
    with pytest.raises(ConfigError, match="^" + __import__("re").escape(said)):
        ner(ner_dir)(batch)


def test_arguments_it_cannot_run_with_are_refused_when_made(ner_dir, tmp_path):
    with pytest.raises(ConfigError, match="dtype is for embeddings; a model of task 'ner'"):
        ner(ner_dir, dtype="float16")
    with pytest.raises(ConfigError, match="max_tokens must be a whole number >= 1 or None, got 'auto'"):
        ner(ner_dir, max_tokens="auto")
    assert ner(ner_dir, max_tokens=np.int64(256)).max_tokens == 256  # numpy's integers are integers
    with pytest.raises(ConfigError, match="column names the batch's text column"):
        ner(ner_dir, column=0)
    with pytest.raises(ConfigError, match="^max_length must be a whole number >= 8 or None, got 4"):  # not --max-length
        ner(ner_dir, max_length=4)
    with pytest.raises(ConfigError, match="^dtype must be 'float32' or 'float16'"):
        ner(ner_dir, dtype="int8")
    with pytest.raises(ConfigError, match="normalize is for embeddings; a model of task 'ner'"):
        ner(ner_dir, normalize=True)
    with pytest.raises(ConfigError, match="^normalize must be True or False, got 'yes'"):
        ner(ner_dir, normalize="yes")
    with pytest.raises(ModelDirError, match="model directory not found"):
        Predictor(str(tmp_path / "missing"))


def test_a_path_or_thread_count_of_the_wrong_type_and_a_surrogate_are_named(ner_dir):
    with pytest.raises(ConfigError, match="Predictor takes a path, got NoneType None"):
        Predictor(None)
    with pytest.raises(ConfigError, match="threads must be a whole number >= 1 or None, got '2'"):
        Predictor(ner_dir, threads="2")
    p = ner(ner_dir)
    got = p({"text": np.array(["Ann ran", "b\ud800"], dtype=object)})  # one row's fault is that row's error
    assert got["error"].tolist() == [None, "column 'text' holds a string that is not valid Unicode (a lone surrogate "
                                           "at character 1)"] and got["entities"][1] is None
    raw = [b"Ann ran", b"caf\xff au lait"]  # Arrow strings are bytes: a foreign file's may not be UTF-8
    offsets = np.cumsum([0] + [len(v) for v in raw]).astype(np.int32)
    col = pa.Array.from_buffers(pa.string(), 2, [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(raw))])
    got = p(pa.table({"text": col}))
    assert got["error"].to_pylist() == [None, "column 'text' holds invalid UTF-8 at byte 3"]
    assert got["entities"][1].as_py() is None
