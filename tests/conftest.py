import os

import pytest

ASSETS = os.path.join(os.path.dirname(__file__), "assets")


@pytest.fixture
def asset():
    return lambda name: os.path.join(ASSETS, name)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    """A WordPiece tokenizer trained in the test on the fixture and synthetic texts."""
    from spanflow.data.io import read_ner
    from spanflow.data.synthetic import synthetic_ner
    from spanflow.models.encoder import train_wordpiece

    texts = [e.text for e in synthetic_ner(200, seed=3)]
    for name in ("wnut_like.conll", "resume_like.bmes"):
        texts += [e.text for e in read_ner(os.path.join(ASSETS, name))]
    return train_wordpiece(texts, vocab_size=600)


@pytest.fixture(autouse=True, scope="session")
def _private_cache(tmp_path_factory):
    """Tune profiles and precision verdicts go to a directory of the test session, not ~/.cache."""
    old = os.environ.get("SPANFLOW_CACHE")
    os.environ["SPANFLOW_CACHE"] = str(tmp_path_factory.mktemp("spanflow-cache"))
    yield
    if old is None:
        os.environ.pop("SPANFLOW_CACHE", None)
    else:
        os.environ["SPANFLOW_CACHE"] = old


@pytest.fixture(autouse=True)
def _unfreeze():
    """A CLI job run in the test process freezes the heap (inference.heap.settle): give it back."""
    import gc

    yield
    gc.unfreeze()
