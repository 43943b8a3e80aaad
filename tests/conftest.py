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
