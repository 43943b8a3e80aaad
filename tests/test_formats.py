import json
import logging

import pytest

from spanflow.data.formats.conll import join_tokens
from spanflow.data.examples import NerExample
from spanflow.data.io import read_ner
from spanflow.data.records import read_texts
from spanflow.errors import DataError


def write(tmp_path, name, content, mode="w"):
    p = tmp_path / name
    if isinstance(content, bytes):
        p.write_bytes(content)
    else:
        p.write_text(content, encoding="utf-8")
    return str(p)


def test_wnut_traps(asset):
    ex = read_ner(asset("wnut_like.conll"))
    assert len(ex) == 3  # tab-only and whitespace-only lines break sentences; -DOCSTART- skipped
    assert ex[0].entities() == [("Empire State Building", "location")]
    assert ex[1].text == "Go see \ufe0f Dubbz\ufeff now \u200b in Paris"
    assert ex[1].entities() == [("Dubbz\ufeff", "person"), ("Paris", "location")]
    assert ex[2].spans == []


def test_a_document_mark_ends_a_sentence_without_blank_lines(tmp_path):
    """-DOCSTART- between two lines was skipped: the documents' sentences read as one text, and an
    I- tag after it continued the entity before it ("Paris Berlin" as one LOC)."""
    ex = read_ner(write(tmp_path, "d.conll", "Paris\tB-LOC\n-DOCSTART-\tO\nBerlin\tB-LOC\nrocks\tO\n"))
    assert [(e.text, e.entities()) for e in ex] == [("Paris", [("Paris", "LOC")]),
                                                   ("Berlin rocks", [("Berlin", "LOC")])]


def test_bmes_chinese_join_and_orphan_repair(asset, caplog):
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        ex = read_ner(asset("resume_like.bmes"))
    assert ex[0].text == "高勇：男，1966年中国国籍"  # one char per line joins without spaces
    assert ex[0].entities() == [("高勇", "NAME"), ("中国国籍", "CONT")]
    assert ex[1].entities() == [("公司", "ORG"), ("董事", "TITLE")]  # M- after a break opens the entity
    assert ex[2].entities() == [("MBA", "EDU"), ("张", "NAME")]
    assert "resume_like.bmes" in caplog.text and "lines 16" in caplog.text


def test_strict_rejects_orphan_inside_tag(asset):
    with pytest.raises(DataError) as e:
        read_ner(asset("resume_like.bmes"), strict=True)
    assert e.value.line == 16 and "M-ORG" in str(e.value)


def test_an_entity_without_its_closing_tag_is_reported_and_refused_when_strict(tmp_path, caplog):
    # B M then O; B then S inside the run; B then the sentence's end: three entities with no E-
    p = write(tmp_path, "u.bmes", "北 B-ORG\n京 M-ORG\n大 O\n学 B-LOC\n校 S-LOC\n\n上 B-LOC\n海 M-LOC\n\n")
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        ex = read_ner(p)
    assert [e.entities() for e in ex] == [[("北京", "ORG"), ("学", "LOC"), ("校", "LOC")], [("上海", "LOC")]]
    assert ("3 entities have no closing E- (or L-) tag and were read as ending at their last tag (lines 2, 4, 8)"
            in caplog.text)
    with pytest.raises(DataError, match=r"the ORG entity that ends at tag 'M-ORG' has no closing E- \(or L-\) "
                                        r"tag") as e:
        read_ner(p, strict=True)
    assert e.value.line == 2
    assert read_ner(write(tmp_path, "ok.bmes", "北 B-ORG\n京 E-ORG\n大 S-LOC\n\n"), strict=True)[0].entities() == \
        [("北京", "ORG"), ("大", "LOC")]


def test_one_character_of_several_code_points_keeps_a_sentence_character_level(tmp_path):
    p = write(tmp_path, "e.bmes", "生 O\n于 O\n1 O\n9 O\nA B-ORG\n公 M-ORG\n司 E-ORG\n\u2764\ufe0f O\n\n")
    (ex,) = read_ner(p)
    assert ex.text == "生于19A公司\u2764\ufe0f" and ex.entities() == [("A公司", "ORG")]  # a spaced join: 'A 公司'


def test_a_sentence_of_one_emoji_or_without_cjk_reads(tmp_path):
    (ex,) = read_ner(write(tmp_path, "h.conll", "\u2764\ufe0f O\nN B-LOC\nY I-LOC\n\n"))
    assert ex.text == "\u2764\ufe0f N Y" and ex.entities() == [("N Y", "LOC")]  # no CJK: joined with spaces
    (ex,) = read_ner(write(tmp_path, "c.bmes", "\u2764\ufe0f O\n北 S-LOC\n\n"))
    assert ex.text == "\u2764\ufe0f北" and ex.entities() == [("北", "LOC")]


def test_an_ideographic_space_is_a_token_not_a_column_gap(tmp_path):
    for sep in ("\t", " "):
        p = write(tmp_path, "s.bmes", f"北{sep}B-ORG\n京{sep}E-ORG\n\u3000{sep}O\n大{sep}S-LOC\n\n")
        (ex,) = read_ner(p)
        assert ex.text == "北京\u3000大" and ex.entities() == [("北京", "ORG"), ("大", "LOC")], sep
    with pytest.raises(DataError, match=r"other white space, such as U\+3000 or U\+00A0, is part of a token"):
        read_ner(write(tmp_path, "n.conll", "New\u00a0B-LOC\n\n"))


def test_bioes_iob1_and_extra_columns(tmp_path):
    p = write(tmp_path, "x.conll", "John NNP x B-PER\nSmith NNP x E-PER\nin IN x O\nRome NNP x S-LOC\n")
    assert read_ner(p)[0].entities() == [("John Smith", "PER"), ("Rome", "LOC")]
    p = write(tmp_path, "y.conll", "Mary I-PER\nAnn I-PER\nBob B-PER\nsaw O\nUK I-LOC\n")
    assert read_ner(p)[0].entities() == [("Mary Ann", "PER"), ("Bob", "PER"), ("UK", "LOC")]
    p = write(tmp_path, "z.conll", "A B-X\nB L-X\nC U-Y\n")  # BILOU reads as BIOES
    assert read_ner(p)[0].entities() == [("A B", "X"), ("C", "Y")]


def test_iob1_is_told_by_where_its_b_tags_stand(tmp_path, caplog):
    iob1 = "EU\tI-ORG\nrejects\tO\nGerman\tI-MISC\n\nIn\tO\nGermany\tI-LOC\nFrance\tB-LOC\nand\tO\nSpain\tI-LOC\n"
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        ex = read_ner(write(tmp_path, "iob1.conll", iob1), strict=True)  # nothing to repair: IOB1 is read as IOB1
    assert [e.entities() for e in ex] == [[("EU", "ORG"), ("German", "MISC")],
                                          [("Germany", "LOC"), ("France", "LOC"), ("Spain", "LOC")]]
    assert "inside tag" not in caplog.text
    bio = "EU\tB-ORG\nrejects\tO\nGerman\tI-MISC\n"  # a B- after O: BIO, whose stray I- is repaired
    with pytest.raises(DataError, match="follows no B-MISC"):
        read_ner(write(tmp_path, "bio.conll", bio), strict=True)


def test_a_tag_of_another_scheme_names_the_line_the_file_s_scheme_was_told_by(tmp_path, caplog):
    p = write(tmp_path, "mix.conll", "Grace\tB-PER\nHopper\tI-PER\n\nBei\tB-LOC\njing\tM-LOC\nx\tE-LOC\n")
    with pytest.raises(DataError, match=r"not valid in the BMES scheme \(the file reads as BMES from line 5's "
                                        r"'M-LOC'") as e:
        read_ner(p)
    assert e.value.line == 2
    stray = write(tmp_path, "s.conll", "Grace\tB-PER\nHopper\tI-PER\n\nOslo\tS-LOC\n")  # BIO with one S-
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        read_ner(stray)
    assert "reads as BIOES from line 4's 'S-LOC'" in caplog.text
    caplog.clear()
    bioes = write(tmp_path, "e.conll", "Grace\tB-PER\nHopper\tE-PER\n\nAda\tB-PER\nL.\tI-PER\n")  # one unclosed
    with caplog.at_level(logging.WARNING, logger="spanflow"):
        read_ner(bioes)
    assert "no closing E- (or L-) tag" in caplog.text and "reads as" not in caplog.text


def test_mixed_cjk_and_latin_join():
    text, offs = join_tokens(["我", "爱", "Python", "和", "北京"])
    assert text == "我爱 Python 和北京"
    assert [text[s:e] for s, e in offs] == ["我", "爱", "Python", "和", "北京"]


def test_a_conll_file_of_document_marks_alone_is_not_called_empty(tmp_path):
    with pytest.raises(DataError, match=r"d\.conll: holds no sentences, only -DOCSTART- lines$"):
        read_ner(write(tmp_path, "d.conll", "-DOCSTART- O\n\n-DOCSTART- O\n"))
    with pytest.raises(DataError, match=r"e\.conll: file is empty: no sentences found$"):
        read_ner(write(tmp_path, "e.conll", "\n \n"))


def test_a_file_whose_lines_end_in_cr_alone_is_named_not_read_as_one_line(tmp_path):
    said = r"its lines end in CR alone \(old Mac style\), so the whole file reads as one line"
    texts = write(tmp_path, "mac.txt", "Ann went\rBob came\r")
    with pytest.raises(DataError, match=said):
        list(read_texts(texts))
    with pytest.raises(DataError, match=said):
        read_ner(write(tmp_path, "mac.conll", "Ann\tB-PER\rwent\tO\r\r"))
    assert list(read_texts(write(tmp_path, "one.txt", "Ann went\r\n"))) == ["Ann went"]  # CRLF: fine


def test_korean_words_keep_their_spaces_and_syllable_lines_join():
    """Korean spaces its words: word tokens of Hangul join with spaces (they were run together),
    a sentence of single syllables (character-level data) still joins without."""
    assert join_tokens(["김철수", "씨는", "부산", "사람이다"])[0] == "김철수 씨는 부산 사람이다"
    assert join_tokens(["부", "산", "에"])[0] == "부산에"
    assert join_tokens(["서울", "에서", "我", "爱"])[0] == "서울 에서 我爱"


def test_a_flag_in_a_character_level_sentence_keeps_it_unspaced():
    """A flag is two code points (regional indicators): one such token sent a BMES sentence to word
    joining, '王芳 1 9 6 6 年生于 🇨🇳 I B M 公司'."""
    tokens = list("王芳1966年生于") + ["\U0001F1E8\U0001F1F3"] + list("IBM公司")
    assert join_tokens(tokens)[0] == "王芳1966年生于\U0001F1E8\U0001F1F3IBM公司"


def test_spaced_korean_is_written_a_word_a_line_and_reads_back(tmp_path):
    from spanflow.data.formats.tokens import plain_words

    text = "김철수 씨는 부산 사람이다"
    assert [text[s:e] for s, e in plain_words(text)] == ["김철수", "씨는", "부산", "사람이다"]
    src = write(tmp_path, "ko.jsonl", json.dumps({"text": text, "entities": [[0, 3, "PER"], [7, 9, "LOC"]]}) + "\n")
    from spanflow.cli.main import main

    assert main(["convert", src, str(tmp_path / "ko.conll")]) == 0
    assert (tmp_path / "ko.conll").read_text(encoding="utf-8").split("\n\n")[0].splitlines() == [
        "김철수\tB-PER", "씨는\tO", "부산\tB-LOC", "사람이다\tO"]
    back = read_ner(str(tmp_path / "ko.conll"))[0]
    assert back.text == text and back.spans == [(0, 3, "PER"), (7, 9, "LOC")]


@pytest.mark.parametrize("content,line,needle", [
    ("a O\nb\n", 2, "token and a tag"),
    ("a O\nb O extra\n", 2, "expected 2 columns"),
    ("John\tB-PER\nSmith\t\tI-PER\n", 2, "got 3 (column 2 is empty: two tabs in a row?)"),
    ("a O\nb X-PER\n", 2, "unknown tag"),
    ("a O\nb M-PER\nc B-PER\nd I-PER\n", None, "not valid in the BMES"),
    ("a O\nGrace\tB-PER\rHopper\tI-PER\r\rOslo\tB-LOC\r", 2, "lines end in CR alone"),  # read as one line
])
def test_conll_errors_name_the_line(tmp_path, content, line, needle):
    p = write(tmp_path, "bad.conll", content)
    with pytest.raises(DataError) as e:
        read_ner(p)
    assert needle in str(e.value) and "bad.conll" in str(e.value)
    if line:
        assert e.value.line == line


def test_a_tab_or_space_after_the_last_column_ends_it(tmp_path):
    from spanflow.data.formats.sniff import sniff

    p = write(tmp_path, "t.txt", "Grace\tB-PER\t\nHopper\tI-PER \n\nOslo\tB-LOC\t\t\n")
    assert sniff(p).name == "conll"  # told by its content, as the reader reads it
    assert [e.entities() for e in read_ner(p)] == [[("Grace Hopper", "PER")], [("Oslo", "LOC")]]


def test_spaces_around_a_tab_pad_the_columns_and_stay_out_of_tokens(tmp_path):
    p = write(tmp_path, "pad.conll", "Grace \tB-PER\n Hopper\t I-PER\nNew York \t B-LOC\n")
    (ex,) = read_ner(p)
    assert ex.text == "Grace Hopper New York"  # a token's inner space stays
    assert ex.entities() == [("Grace Hopper", "PER"), ("New York", "LOC")]
    (ex,) = read_ner(write(tmp_path, "sp.conll", "Ann\tB-PER\n \tO\nran\tO\n"))  # a token of one space is a token
    assert ex.entities() == [("Ann", "PER")] and ex.text.split(" ")[-1] == "ran" and len(ex.words) == 3


def test_strict_does_not_guess_iob1_from_a_file_without_b_tags(tmp_path, capsys):
    """Entities that all open with I- are IOB1 or BIO that lost its B- tags: --strict passed it as
    IOB1 without a word (and convert never said the scheme it read)."""
    from spanflow.cli.main import main

    p = write(tmp_path, "s.conll", "A\tO\nB\tI-PER\n")
    with pytest.raises(DataError, match=r"s\.conll:2: every entity opens with an I- tag .* give --scheme iob1"):
        read_ner(p, strict=True)
    assert read_ner(p, strict=True, scheme="iob1")[0].spans == [(2, 3, "PER")]  # said: taken
    assert read_ner(write(tmp_path, "c.conll", "A\tI-PER\nB\tB-PER\n"), strict=True)[0].spans == [
        (0, 1, "PER"), (2, 3, "PER")]  # a B- after its type: IOB1 beyond doubt
    assert main(["convert", p, str(tmp_path / "o.jsonl")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == f"read {p}: 1 sentence, 1 entity; tags IOB1 (detected)"


def test_a_conll_file_whose_first_token_is_a_brace_reads_as_conll(tmp_path):
    (ex,) = read_ner(write(tmp_path, "brace.conll", "{\tO\nGrace\tB-PER\n}\tO\n"))
    assert ex.text == "{ Grace }" and ex.entities() == [("Grace", "PER")]


def test_bio_scheme_rejects_bmes_tags(tmp_path):
    p = write(tmp_path, "b.conll", "a B-PER\nb M-PER\n")
    with pytest.raises(DataError, match="not valid in the BIO scheme"):
        read_ner(p, scheme="bio")


def test_unknown_scheme_empty_and_invalid_utf8(tmp_path):
    p = write(tmp_path, "ok.conll", "a O\n")
    with pytest.raises(DataError, match="unknown tag scheme"):
        read_ner(p, scheme="bilou2")
    with pytest.raises(DataError, match="empty"):
        read_ner(write(tmp_path, "empty.conll", "\n  \n"))
    with pytest.raises(DataError) as e:
        read_ner(write(tmp_path, "u.conll", b"a O\nb\xff\xfe O\n"))
    assert e.value.line == 2 and "UTF-8" in str(e.value)
    with pytest.raises(DataError, match="not found"):
        read_ner(str(tmp_path / "missing.conll"))


def test_jsonl_both_entity_shapes(tmp_path):
    recs = [{"text": "Ann in Rome", "entities": [[0, 3, "PER"], {"start": 7, "end": 11, "label": "LOC"}]},
            {"text": "nothing", "entities": []}]
    p = write(tmp_path, "d.jsonl", "\n".join(json.dumps(r) for r in recs) + "\n")
    ex = read_ner(p)
    assert ex[0].entities() == [("Ann", "PER"), ("Rome", "LOC")] and ex[1].spans == []


@pytest.mark.parametrize("rec,needle", [
    ('{"text": "abc", "entities": [[0, 9, "X"]]}', "out of range"),
    ('{"text": "abcdef", "entities": [[0, 4, "X"], [2, 5, "Y"]]}', "overlap"),
    ('{"text": "abcdef", "entities": [[0, 4, "X"], [0, 4, "X"]]}', "span (0, 4, 'X') is listed twice"),
    ('{"text": "abcdef", "entities": [[0, 4, "X"], [0, 4, "Y"]]}', "cover the same text: an entity has one type"),
    ('{"text": "abc", "entities": [[2, 1, "X"]]}', "is reversed: its end must come after its start"),
    ('{"text": "abc", "entities": [[1, 1, "X"]]}', "is empty"),
    ('{"text": "abc", "entities": [{"start": 0}]}', "lacks 'end'"),
    ('{"txt": "abc"}', 'string "text"'),
    ('{"text": "abc", ', "invalid JSON"),
])
def test_jsonl_errors(tmp_path, rec, needle):
    p = write(tmp_path, "bad.jsonl", '{"text": "ok", "entities": []}\n' + rec + "\n")
    with pytest.raises(DataError) as e:
        read_ner(p)
    assert needle in str(e.value) and e.value.line == 2


def test_an_entity_whose_own_text_is_not_what_its_offsets_cut_is_refused(tmp_path):
    ok = {"text": "José at Hooli", "entities": [{"start": 8, "end": 13, "label": "ORG", "text": "Hooli"}]}
    bytes_counted = {"text": "José at Hooli now", "entities": [{"start": 9, "end": 14, "label": "ORG", "text": "Hooli"}]}
    assert read_ner(write(tmp_path, "ok.jsonl", json.dumps(ok) + "\n"))[0].entities() == [("Hooli", "ORG")]
    p = write(tmp_path, "b.jsonl", json.dumps(ok) + "\n" + json.dumps(bytes_counted) + "\n")
    with pytest.raises(DataError, match=r"holds 'ooli ' but its \"text\" says 'Hooli'; 'Hooli' is first at \[8, 13\]") as e:
        read_ner(p)
    assert e.value.line == 2 and "not bytes" in str(e.value)


def test_indented_json_given_as_jsonl_is_told_so_with_a_jq_line_that_keeps_the_input(tmp_path):
    p = write(tmp_path, "pretty.jsonl", '{\n  "text": "Ann",\n  "entities": []\n}\n')
    with pytest.raises(DataError, match=r"pretty\.jsonl:1: JSONL holds one whole JSON object a line.*indented JSON\?\); "
                                        r"write each record on one line: jq -c '\.' .*pretty\.jsonl > .*pretty\.lines\.jsonl$"):
        read_ner(p, fmt="jsonl")
    from spanflow.data.io import read_re

    listed = write(tmp_path, "list.jsonl", '[\n  {"text": "Ann", "relations": []}\n]\n')
    with pytest.raises(DataError, match=r"jq -c '\.\[\]' .*list\.jsonl > .*list\.lines\.jsonl$"):  # never > list.jsonl
        read_re(listed, fmt="jsonl")


def test_read_texts_plain_and_error_records(tmp_path):
    assert list(read_texts(write(tmp_path, "t.txt", "one\n\nthree\n"))) == ["one", "", "three"]
    p = write(tmp_path, "t.jsonl", '{"text": "a"}\nnot json\n{"text": "c"}\n')
    items = list(read_texts(p, errors="record"))
    assert items[0] == "a" and items[2] == "c" and isinstance(items[1], DataError) and items[1].line == 2
    with pytest.raises(DataError):
        list(read_texts(p))


def test_a_jsonl_entity_with_white_space_at_an_edge_is_read_without_it_and_said(tmp_path, caplog):
    """' Paris' (a selection that took the space before the word) could not be written to .spacy, and
    was trimmed silently on the way to CoNLL; no word the model tags has a space at an edge."""
    p = write(tmp_path, "ws.jsonl", '{"text": "visit Paris now", "entities": [[5, 11, "LOC"]]}\n'
                                    '{"text": "see Rome ", "entities": [[4, 9, "LOC"], [0, 3, "X"]]}\n')
    with caplog.at_level("WARNING", logger="spanflow"):
        got = read_ner(p)
    assert [e.spans for e in got] == [[(6, 11, "LOC")], [(0, 3, "X"), (4, 8, "LOC")]]
    assert (f"{p}: 2 entities have white space at an edge, read without it (e.g. line 1: ' Paris'; line 2: 'Rome ')"
            in caplog.text)
    blank = write(tmp_path, "blank.jsonl", '{"text": "a   b", "entities": [[1, 4, "X"]]}\n')
    with pytest.raises(DataError, match=r"blank\.jsonl:1: span \(1, 4, 'X'\) holds white space alone \('   '\)"):
        read_ner(blank)


def test_read_texts_takes_a_named_field_as_a_csv_header_column_as_predict_does(tmp_path):
    """field="text" on a CSV read column 0, the header row as a text, where `predict --field text`
    reads the header's text column."""
    from spanflow.errors import ConfigError

    p = write(tmp_path, "t.csv", "id,text\n1,Ann went\n2,Bo came\n")
    assert list(read_texts(p, field="text")) == ["Ann went", "Bo came"]
    assert list(read_texts(p)) == ["id", "1", "2"]  # no field: column 0, every row a record, as predict reads it
    with pytest.raises(ConfigError, match="^field body: .* has no such column in its header; it has id, text"):
        read_texts(p, field="body")
    assert list(read_texts(write(tmp_path, "t.jsonl", '{"text": "a"}\n'), field="text")) == ["a"]


def test_tokens_written_for_a_text_without_them_do_not_tell_where_entities_are(tmp_path):
    from spanflow.data.io import write_ner

    # a mark after an entity and after any other word is cut off the same way (it was cut only at
    # the entity's end: a model trained on the CoNLL learned the token boundary, not the words)
    ex = [NerExample("Anna Berg. We had fun. (Paris) it's @ann's e-mail", [(0, 9, "PER"), (24, 29, "LOC")])]
    write_ner(ex, tmp_path / "a.conll", fmt="conll")
    lines = [x.split("\t") for x in (tmp_path / "a.conll").read_text().splitlines() if x]
    assert lines == [["Anna", "B-PER"], ["Berg", "I-PER"], [".", "O"], ["We", "O"], ["had", "O"], ["fun", "O"],
                     [".", "O"], ["(", "O"], ["Paris", "B-LOC"], [")", "O"], ["it's", "O"], ["@ann's", "O"],
                     ["e-mail", "O"]]
    # tokens a text came with are kept, entity edges or not: CoNLL -> CoNLL gives the same tokens
    (tmp_path / "b.conll").write_text("U.S.\tB-LOC\nsaid\tO\n\n")
    write_ner(read_ner(tmp_path / "b.conll"), tmp_path / "c.conll", fmt="conll")
    assert (tmp_path / "c.conll").read_text() == "U.S.\tB-LOC\nsaid\tO\n\n"


def test_tags_in_lower_case_are_read_as_their_upper_case_whole(tmp_path):
    """'b-per' was read and 'o' refused as an unknown tag in the same file; the label keeps its case."""
    lower = read_ner(write(tmp_path, "low.conll", "Grace\tb-per\nHopper\ti-per\nwent\to\n\n"))
    assert [(e.text, e.spans) for e in lower] == [("Grace Hopper went", [(0, 12, "per")])]


def test_a_character_of_several_code_points_is_one_conll_token_and_reads_back_as_written(tmp_path):
    """An emoji's variation selector got a line of its own, so the data no longer read as the
    character-level sentences it was, and its model lost its whitespace words."""
    from spanflow.data.examples import NerExample
    from spanflow.data.io import write_ner
    from spanflow.tasks.ner.words import WHITESPACE, words_of

    ex = [NerExample("我爱❤️北京", [(4, 6, "LOC")])] * 3
    write_ner(ex, tmp_path / "c.conll")
    lines = (tmp_path / "c.conll").read_text(encoding="utf-8").split("\n\n")[0].splitlines()
    assert lines == ["我\tO", "爱\tO", "❤️\tO", "北\tB-LOC", "京\tI-LOC"]
    back = read_ner(tmp_path / "c.conll")
    assert [(e.text, e.spans) for e in back] == [(e.text, e.spans) for e in ex] and words_of(back) == WHITESPACE


def test_a_jsonl_span_labelled_o_in_either_case_is_refused(tmp_path):
    with pytest.raises(DataError, match='a span labelled "O" marks no entity'):
        read_ner(write(tmp_path, "o.jsonl", '{"text": "Ann went", "entities": [[0, 3, "o"]]}\n'))


def test_lines_of_chinese_are_texts_not_columns(tmp_path):
    """A file of unspaced Chinese sentences was no text file to the sniffer (no line held three words),
    so `tune --model M --data dev.txt` read it as CoNLL and failed at its first line."""
    from spanflow.data.formats.sniff import sniff
    from spanflow.data.records import unlabelled_sample

    p = write(tmp_path, "zh.txt", "吴重阳，中国国籍，大学本科。\n李娜在北京工作。\n王伟是上海人。\n")
    assert sniff(p).name == "text"
    assert unlabelled_sample(p, 8, infer=True) == ["吴重阳，中国国籍，大学本科。", "李娜在北京工作。", "王伟是上海人。"]
    assert sniff(write(tmp_path, "c.bmes", "吴\tB-NAME\n重\tM-NAME\n阳\tE-NAME\n\n北\tB-LOC\n京\tE-LOC\n")).name == "conll"


def test_prose_lines_with_commas_are_texts_to_tune_on(tmp_path):
    """Prose whose every line holds a comma is no file the sniffer places (CSV pairs, ragged CSV):
    `tune` read it as CoNLL or pairs and failed, where predict reads a .txt as text lines."""
    from spanflow.data.records import unlabelled_sample

    lines = ["Grace Hopper flew to Oslo, then Lima.", "Ada Lovelace flew to Lima, then home.",
             "Linus said hi, and left, at once."]
    p = write(tmp_path, "prose.txt", "\n".join(lines) + "\n")
    assert unlabelled_sample(p, 8, infer=True) == lines
    assert unlabelled_sample(p, 8) is None  # for training a .txt is read as the task's labelled data
    conll = write(tmp_path, "train.txt", "Ann\tB-PER\nran\tO\n\nBob\tB-PER\nsat\tO\n")
    assert unlabelled_sample(conll, 8, infer=True) is None  # CoNLL in a .txt stays labelled data


def test_relation_subjects_and_objects_are_read_without_white_space_at_their_edges(tmp_path, caplog):
    """Gold ' Oslo' (a space taken in) never matched the model's 'Oslo': F1 0 with partial F1 1.
    Read without it, with one warning, as NER's JSONL entities are."""
    from spanflow.data.io import read_re

    text = "Grace Hopper was born in Oslo and works for Initech ."
    casrel = write(tmp_path, "ws.json", json.dumps([{"text": text, "triple_list": [
        ["Grace Hopper", "born_in", " Oslo"], ["Grace Hopper ", "works_for", "Initech"]]}]))
    lines = write(tmp_path, "ws.jsonl", json.dumps({"text": text, "relations": [
        {"head": [0, 12], "type": "born_in", "tail": [24, 29]}, {"head": [0, 13], "type": "works_for",
                                                                 "tail": [44, 51]}]}) + "\n")
    want = [((0, 12), "born_in", (25, 29)), ((0, 12), "works_for", (44, 51))]
    for path, where in ((casrel, "record 1"), (lines, "line 1")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="spanflow"):
            assert read_re(path)[0].triples == want
        assert f"2 of 2 triples have a subject or object with white space at its edge, read without it (e.g. {where}:" \
            in caplog.text
    with pytest.raises(DataError, match=r"ws\.json:1: record 1 \(of the list, from 1\): triple \[' ', 'born_in', "
                                        r"'Oslo'\] has a subject or object of white space alone"):
        read_re(write(tmp_path, "ws.json", json.dumps([{"text": text, "triple_list": [[" ", "born_in", "Oslo"]]}])))
    with pytest.raises(DataError, match=r"ws2\.jsonl:1: span \[29, 30\] holds white space alone"):
        read_re(write(tmp_path, "ws2.jsonl", json.dumps({"text": "Grace Hopper was born in Oslo and", "relations": [
            {"head": [0, 12], "type": "born_in", "tail": [29, 30]}]}) + "\n"))
