"""spaCy DocBin reading/writing and `spanflow convert` (spaCy is in the test extra)."""
import json
import sys

import pytest

from spanflow.cli.main import main
from spanflow.data.examples import NerExample
from spanflow.data.io import read_ner, write_ner
from spanflow.errors import ConfigError, DataError

spacy = pytest.importorskip("spacy")

EXAMPLES = [
    NerExample("Hello  Paris\n is big ", [(7, 12, "loc")]),  # double space, newline, trailing space
    NerExample("北京大学在北京。", [(0, 4, "org"), (5, 7, "loc")]),  # no spaces at all
    NerExample("iPhone's price", [(0, 6, "product")]),  # an entity inside a whitespace token
    NerExample("no entities here", []),
]


def test_docbin_written_by_spanflow_keeps_texts_and_spans_exactly(tmp_path):
    path = str(tmp_path / "x.spacy")
    write_ner(EXAMPLES, path)
    back = read_ner(path)
    assert back == EXAMPLES
    # the Doc's tokens come back as the words (whitespace tokens are not words)
    assert [back[0].text[a:b] for a, b in back[0].words] == ["Hello", "Paris", "is", "big"]


def test_docbin_made_by_spacy_reads_as_char_spans(tmp_path):
    from spacy.tokens import Doc, DocBin, Span
    from spacy.vocab import Vocab

    vocab = Vocab()
    doc = Doc(vocab, words=["Ada", "Lovelace", "visited", "New", "York", "."],
              spaces=[True, True, True, True, False, False])
    doc.ents = [Span(doc, 0, 2, label="PER"), Span(doc, 3, 5, label="LOC")]
    path = tmp_path / "made.spacy"
    DocBin(docs=[doc]).to_disk(path)
    (ex,) = read_ner(path)
    assert ex.text == "Ada Lovelace visited New York."
    assert ex.entities() == [("Ada Lovelace", "PER"), ("New York", "LOC")]


def test_corrupt_or_missing_docbin_is_a_data_error(tmp_path):
    bad = tmp_path / "bad.spacy"
    bad.write_bytes(b"this is not zlib")
    with pytest.raises(DataError, match="bad.spacy: not a readable spaCy DocBin"):
        read_ner(bad)
    with pytest.raises(DataError, match="file not found"):
        read_ner(tmp_path / "missing.spacy")


def test_docbin_without_spacy_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "spacy.tokens", None)  # import fails as if spaCy were absent
    with pytest.raises(ConfigError, match=r"spanflow\[spacy\]"):
        read_ner(tmp_path / "x.spacy")


def test_convert_roundtrip_conll_docbin_jsonl(asset, tmp_path, capsys):
    src = asset("wnut_like.conll")
    original = read_ner(src)
    assert main(["convert", src, str(tmp_path / "a.spacy")]) == 0
    assert main(["convert", str(tmp_path / "a.spacy"), str(tmp_path / "b.jsonl")]) == 0
    assert main(["convert", str(tmp_path / "b.jsonl"), str(tmp_path / "c.conll")]) == 0
    assert f"wrote {len(original)} texts" in capsys.readouterr().out
    for name in ("a.spacy", "b.jsonl", "c.conll"):
        assert read_ner(tmp_path / name) == original, name
    first = json.loads((tmp_path / "b.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert first["text"] == original[0].text


def test_convert_bmes_to_conll_writes_bio(asset, tmp_path):
    out = tmp_path / "r.conll"
    assert main(["convert", asset("resume_like.bmes"), str(out)]) == 0
    tags = [line.split("\t")[1] for line in out.read_text(encoding="utf-8").splitlines() if line]
    assert "B-NAME" in tags and "I-NAME" in tags and not any(t[:2] in ("M-", "E-", "S-") for t in tags)
    assert read_ner(out) == read_ner(asset("resume_like.bmes"))


def test_convert_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a"}\n{"text": 5}\n', encoding="utf-8")
    assert main(["convert", str(bad), str(tmp_path / "out.spacy")]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    assert not list(tmp_path.glob("out.spacy*"))


def test_convert_to_a_directory_is_one_error_line_and_write_ner_a_typed_error(tmp_path, capsys):
    src = tmp_path / "a.conll"
    src.write_text("Ann\tB-PER\n", encoding="utf-8")
    (tmp_path / "out").mkdir()
    assert main(["convert", str(src), str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {tmp_path / 'out'}: is a directory; give the name of a file to write"]
    with pytest.raises(DataError, match="is a directory"):
        write_ner([NerExample("Ann", [(0, 3, "PER")])], tmp_path / "out", fmt="jsonl")
    assert list((tmp_path / "out").iterdir()) == []  # nothing written into it


def test_docbin_annotation_spanflow_cannot_read_is_said_by_file_and_document(tmp_path, caplog, capsys):
    from spacy.tokens import Doc, DocBin, Span
    from spacy.vocab import Vocab

    vocab = Vocab()

    def doc(ents=None, group=None, missing=False):
        d = Doc(vocab, words=["Ada", "met", "Bob", "."], spaces=[True, True, False, False])
        if ents is not None:
            d.set_ents([Span(d, s, e, label=lab) for s, e, lab in ents], missing=[d[3:4]] if missing else [],
                       default="outside")
        if group:
            d.spans["sc"] = [Span(d, 0, 1, label="PER")]
        return d

    path = tmp_path / "d.spacy"
    # entities in span groups only, as a span categorizer's data: named, not read as no entities
    DocBin(docs=[doc(group=True), doc([])], store_user_data=True).to_disk(path)
    with pytest.raises(DataError, match=r"no document has entities in doc.ents; its spans are in span groups "
                                        r"\(doc.spans: 'sc' \(1\)\)"):
        read_ner(path)
    # a span labelled O: the file and the document
    DocBin(docs=[doc([(0, 1, "PER")]), doc([(2, 3, "O")])]).to_disk(path)
    with pytest.raises(DataError, match=r'd\.spacy: document 2: a span labelled "O" marks no entity'):  # from 1
        read_ner(path)
    # tokens left unannotated (spaCy's missing) are read as outside any entity, and said
    DocBin(docs=[doc([(0, 1, "PER")]), doc([(2, 3, "PER")], missing=True)]).to_disk(path)
    with caplog.at_level("WARNING", logger="spanflow"):
        back = read_ner(path)
    assert [e.spans for e in back] == [[(0, 3, "PER")], [(8, 11, "PER")]]
    assert "1 of 2 documents have tokens with no entity annotation (spaCy's missing value; first: document 2)" \
        in caplog.text
    # training data without one entity is named by its file
    DocBin(docs=[doc([])]).to_disk(path)
    capsys.readouterr()
    assert main(["train", "ner", "--train", str(path), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err == (f"error: {path}: holds no entities to train on (1 text, every token outside "
                                       "any entity)\n")


def test_an_entity_no_spacy_token_can_hold_is_named_with_its_text(tmp_path):
    from spanflow.data.examples import NerExample
    from spanflow.data.io import write_ner

    ex = [NerExample("Ann went", [(0, 3, "PER")]), NerExample("visit Paris now", [(5, 11, "LOC")])]  # the API's
    with pytest.raises(DataError, match=r"text 2: entity \[5, 11, 'LOC'\] \(' Paris'\) does not start and end on a "
                                        r"spaCy token: white space at an edge has no token of its own"):
        write_ner(ex, tmp_path / "o.spacy")
    assert not (tmp_path / "o.spacy").exists()
