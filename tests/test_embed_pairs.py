"""Pair files for embedding models (pairs, scored pairs, triplets) and their metrics."""
import json

import numpy as np
import pytest

from spanflow.errors import ConfigError, DataError
from spanflow.tasks.embed.metrics import (
    pearson,
    positive_ranks,
    rank_average,
    retrieval_metrics,
    similarity_metrics,
    spearman,
)
from spanflow.tasks.embed.pairs import Pair, read_pairs

SCORED = [("a cat sits", "a cat is sitting", 5.0), ("a dog runs", "the sky is blue", 0.0),
          ("men play", "people play", 2.5)]
PAIRS = [("what is rust", "rust is a language"), ("capital of france", "paris is the capital")]
TRIPLETS = [("q one", "pos one", "neg one"), ("q two", "pos two", "neg two")]
HEADERS = {"scored": "sentence1,sentence2,score", "pairs": "anchor,positive", "triplets": "anchor,positive,negative"}
ROWS = {"scored": SCORED, "pairs": PAIRS, "triplets": TRIPLETS}


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_bytes(text.encode("utf-8") if isinstance(text, str) else text)
    return str(p)


def table(kind, sep, header):
    lines = [HEADERS[kind].replace(",", sep)] if header else []
    lines += [sep.join(str(f) for f in row) for row in ROWS[kind]]
    return "\n".join(lines) + "\n"


def expected(kind):
    if kind == "scored":
        return [Pair("a cat sits", "a cat is sitting", score=1.0), Pair("a dog runs", "the sky is blue", score=0.0),
                Pair("men play", "people play", score=0.5)]
    if kind == "pairs":
        return [Pair(a, b) for a, b in PAIRS]
    return [Pair(a, b, negative=n) for a, b, n in TRIPLETS]


@pytest.mark.parametrize("kind", ["scored", "pairs", "triplets"])
@pytest.mark.parametrize("ext,sep", [(".csv", ","), (".tsv", "\t"), (".txt", "\t")])
@pytest.mark.parametrize("header", [False, True])
def test_table_kinds(tmp_path, kind, ext, sep, header):
    path = write(tmp_path, "p" + ext, table(kind, sep, header))
    assert read_pairs(path) == expected(kind)


@pytest.mark.parametrize("kind", ["scored", "pairs", "triplets"])
def test_jsonl_kinds(tmp_path, kind):
    keys = {"scored": ("sentence1", "sentence2", "score"), "pairs": ("anchor", "positive"),
            "triplets": ("query", "positive", "negative")}[kind]
    text = "".join(json.dumps(dict(zip(keys, row))) + "\n" for row in ROWS[kind])
    assert read_pairs(write(tmp_path, "p.jsonl", "\n" + text)) == expected(kind)


def test_jsonl_alternative_keys(tmp_path):
    text = '{"s1": "x one", "s2": "y one", "label": 1}\n{"s1": "x two", "s2": "y two", "label": 3}\n'
    assert read_pairs(write(tmp_path, "p.json", text)) == [Pair("x one", "y one", 0.0), Pair("x two", "y two", 1.0)]
    text = '{"text1": "a", "text2": "b"}\n'
    assert read_pairs(write(tmp_path, "q.jsonl", text)) == [Pair("a", "b")]


def test_unnamed_header_detected_by_numbers(tmp_path):
    path = write(tmp_path, "p.csv", "left,right,sim\nx,y,4\nu,v,2\n")
    assert read_pairs(path) == [Pair("x", "y", 1.0), Pair("u", "v", 0.0)]


@pytest.mark.parametrize("text, line, said", [
    ("a\tb\t3,8\nc\td\t5,0\ne\tf\t1,2\n", 1, "score is not a number: '3,8' (a decimal comma"),
    ("a,b,high\nc,d,low\ne,f,3.5\ng,h,1\ni,j,0\nk,l,2\nm,n,4\no,p,5\n", 1,
     "score is not a number: 'high'; 6 of the file's 8"),
])
def test_a_score_column_with_values_that_are_no_number_is_not_read_as_triplets(tmp_path, text, line, said):
    """The first value decided the kind: a decimal comma or a word there made every score a negative text."""
    path = write(tmp_path, "p.tsv" if "\t" in text else "p.csv", text)
    with pytest.raises(DataError, match=f"p\\.(tsv|csv):{line}: " + __import__("re").escape(said)):
        read_pairs(path)
    # triplets whose negatives are texts, some of them numbers (years), stay triplets
    ok = write(tmp_path, "t.csv", "q one,pos one,neg one\nq two,pos two,neg two\nq3,p3,1999\nq4,p4,2001\n")
    assert [p.negative for p in read_pairs(ok)] == ["neg one", "neg two", "1999", "2001"]


def test_csv_quotes_and_commas(tmp_path):
    text = 's1,s2,score\n"Hello, world","She said ""hi"", then left",3.2\nit\'s 5" tall,a "quoted" word,1\n'
    assert read_pairs(write(tmp_path, "p.csv", text)) == [
        Pair("Hello, world", 'She said "hi", then left', 1.0), Pair('it\'s 5" tall', 'a "quoted" word', 0.0)]


def test_tsv_stray_quotes_are_text(tmp_path):
    text = '"A man is playing\tA man plays "guitar\t4.0\nThe "cat\tThe dog\t0.0\n'
    assert read_pairs(write(tmp_path, "p.tsv", text)) == [
        Pair('"A man is playing', 'A man plays "guitar', 1.0), Pair('The "cat', "The dog", 0.0)]


def test_scores_normalised_and_constant(tmp_path):
    pairs = read_pairs(write(tmp_path, "p.tsv", "a\tb\t0\nc\td\t5\ne\tf\t3.75\ng\th\t1\n"))
    assert [p.score for p in pairs] == [0.0, 1.0, 0.75, 0.2]
    pairs = read_pairs(write(tmp_path, "q.tsv", "a\tb\t2\nc\td\t2\n"))
    assert [p.score for p in pairs] == [1.0, 1.0]


def test_columns_by_index_and_name(tmp_path):
    text = "genre,s1,s2,score\nnews,x,y,0\nnews,u,v,10\n"
    path = write(tmp_path, "p.csv", text)
    want = [Pair("x", "y", 0.0), Pair("u", "v", 1.0)]
    assert read_pairs(path, columns="s1,s2,score") == want
    assert read_pairs(path, columns="1,2,3") == want
    assert read_pairs(path, columns="1,2") == [Pair("x", "y"), Pair("u", "v")]
    assert read_pairs(path, columns="s2,genre") == [Pair("y", "news"), Pair("v", "news")]
    assert read_pairs(path, columns="s1,s2,genre") == [Pair("x", "y", negative="news"), Pair("u", "v", negative="news")]
    jl = write(tmp_path, "p.jsonl", '{"q": "x", "d": "y", "w": 2}\n{"q": "u", "d": "v", "w": 4}\n')
    assert read_pairs(jl, columns="q,d,w") == want
    with pytest.raises(ConfigError, match="2 or 3"):
        read_pairs(path, columns="1")
    with pytest.raises(ConfigError, match="not both"):
        read_pairs(path, columns="1,s2")
    with pytest.raises(ConfigError, match="columns: 1 named twice in '1,01,3'"):
        read_pairs(path, columns="1,01,3")
    with pytest.raises(ConfigError, match="columns: s1 named twice"):
        read_pairs(jl, columns="s1,s2,s1")
    with pytest.raises(DataError, match=r"missing column '²'"):  # a superscript is a name, not an index
        read_pairs(path, columns="²,s1")
    with pytest.raises(DataError, match=r"p\.csv:1: missing column 'nope'"):
        read_pairs(path, columns="s1,nope")


@pytest.mark.parametrize("name,text,message", [
    ("m.csv", "a,b,1\nc,d,2\ne,f\n", r"m\.csv:3: record has 2 columns"),
    ("m.tsv", "a\tb\nc\td\te\n", r"m\.tsv:2: record has 3 columns"),
    ("s.csv", "a,b,1\nc,d,high\n", r"s\.csv:2: score is not a number: 'high'"),
    ("s.csv", "sentence1,sentence2,score\na,b,1\nc,d,\n", r"s\.csv:3: score is missing$"),  # an empty cell
    ("e.csv", "a,b,1\n  ,d,2\n", r"e\.csv:2: empty first text"),
    ("e.tsv", "a\tb\tc\nd\te\t \n", r"e\.tsv:2: empty negative"),
    ("e.jsonl", '{"anchor": "a", "positive": ""}\n', r"e\.jsonl:1: empty second text"),
    ("z.csv", "", r"z\.csv: no pairs"),
    ("z.csv", "anchor,positive\n\n", r"z\.csv: no pairs"),
    ("z.jsonl", "\n\n", r"z\.jsonl: no pairs"),
    ("j.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "a",\n', r"j\.jsonl:2: invalid JSON"),
    ("k.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "a"}\n', r"k\.jsonl:2: record has no 'positive' key"),
    ("k.jsonl", '{"title": "a"}\n', r"k\.jsonl:1: expected keys"),
    ("k.jsonl", '{"s1": "a", "s2": "b", "score": 1}\n{"s1": "a", "s2": "b", "score": "x"}\n',
     r"k\.jsonl:2: score is not a number"),
    ("t.txt", "no tabs here\n", r"t\.txt: a \.txt pairs file must be tab-separated"),
    ("w.csv", "a,b,c,d\n", r"w\.csv:1: expected 2 or 3 columns, the first record has 4; pick 2 or 3 of them with "
                           r"--columns \(0,1,2 or header names\)"),
    ("qa.jsonl", '{"id": 3, "question": "why", "answer": "because"}\n',
     r"got \['answer', 'id', 'question'\]; or name yours with --columns \(e\.g\. question,answer\)"),
    # a quote never closed takes the lines after it into one field: named as that, where it starts
    ("q.csv", 'a,b,1\n"c,d,2\ne,f,3\ng,h,4\n', r"q\.csv:2: record has 1 column, the file's first has 3 \(a quoted "
     r"field starts here and runs over 3 lines: a quote never closed\?"),
    ("q.csv", '"a,b,1\nc,d,2\n', r"q\.csv:1: expected 2 or 3 columns, the first record has 1 \(a quoted field "
     r"starts here and runs over 2 lines"),
    # another separator than the name's
    ("t.csv", "a\tb\t1\nc\td\t2\n", r"t\.csv:1: expected 2 or 3 columns, the first record has 1; its fields look "
     r"separated by tabs, and a file named so is read as comma-separated \(\.csv\): name it \.tsv$"),
    ("s.csv", "a;b;1\nc;d;2\n", r"s\.csv:1: .* separated by semicolons, .*: write it comma- or tab-separated$"),
    ("s.tsv", "a;b;1\nc;d;2\n", r"s\.tsv:1: .* separated by semicolons, and a file named so is read as "
     r"tab-separated"),
    ("c.tsv", "a b,c d,3\ne f,g h,2\n", r"c\.tsv:1: .* separated by commas, and a file named so is read as "
     r"tab-separated \(\.tsv or \.txt\): name it \.csv$"),
    # semicolons with a decimal comma: not "name it .csv", which would read 'a b;c d;3' and '5' as a pair
    ("e.tsv", "a b;c d;3,5\ne f;g h;2,0\n", r"e\.tsv:1: .* separated by semicolons, .*: write it comma- or "
     r"tab-separated$"),
    ("n.tsv", "Well, then, here we are, again\n", r"n\.tsv:1: expected 2 or 3 columns, the first record has 1$"),
    # a score with a decimal comma, unquoted: one column more
    ("d.csv", "a b,c d,3.5\ne f,g h,3,8\n", r"d\.csv:2: record has 4 columns, the file's first has 3 \(its last two, 3 "
     r"and 8, look like a score with a decimal comma: write 3\.8\)$"),
    # the same on the first record: told as that, not "pick 2 or 3 of them with --columns"
    ("f.csv", "a b,c d,3,8\ne f,g h,2,0\n", r"f\.csv:1: expected 2 or 3 columns, the first record has 4 \(its last "
     r"two, 3 and 8, look like a score with a decimal comma: write 3\.8\)$"),
])
def test_errors_name_file_and_line(tmp_path, name, text, message):
    with pytest.raises(DataError, match=message):
        read_pairs(write(tmp_path, name, text))


def test_a_missing_or_empty_path_is_named_as_missing(tmp_path):
    with pytest.raises(DataError, match=r"^'' \(an empty path\): file not found$"):
        read_pairs("")
    with pytest.raises(DataError, match=r"gone\.xls: file not found$"):
        read_pairs(str(tmp_path / "gone.xls"))


def test_invalid_utf8_names_line(tmp_path):
    with pytest.raises(DataError, match=r"u\.csv:2: invalid UTF-8 .*; is the file in another encoding"):
        read_pairs(write(tmp_path, "u.csv", b"a,b\nc\xff,d\n"))
    with pytest.raises(DataError, match=r"u\.jsonl:2: invalid UTF-8"):
        read_pairs(write(tmp_path, "u.jsonl", b'{"s1": "a", "s2": "b"}\n{"s1": "\xff"}\n'))


def test_rank_average_and_spearman_with_ties():
    assert rank_average([10, 20, 20, 30]).tolist() == [1.0, 2.5, 2.5, 4.0]
    # ranks x [1, 2.5, 2.5, 4], y [1, 2, 3, 4]: sum dx*dy 4.5, sum dx^2 4.5, sum dy^2 5 -> 4.5/sqrt(22.5)
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(3 / np.sqrt(10), abs=1e-12)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3, 4], [1, 4, 9, 16]) == pytest.approx(1.0)
    assert pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_spearman_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 5, 50), rng.integers(0, 7, 50)
    assert spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)


def test_similarity_metrics():
    a = np.array([[1.0, 0.0], [1.0, 0.0], [1.0, 0.0]])
    b = np.array([[2.0, 0.0], [1.0, 1.0], [0.0, 3.0]])  # cosines 1, 0.707, 0
    m = similarity_metrics(a, b, [5.0, 1 + 4 / np.sqrt(2), 1.0])
    assert m["spearman"] == pytest.approx(1.0) and m["pearson"] == pytest.approx(1.0) and m["n"] == 3
    assert similarity_metrics(a, b, [5.0, 1.5, 1.0])["pearson"] < 0.99
    assert similarity_metrics(a, b, [0.1, 0.5, 0.9])["spearman"] == pytest.approx(-1.0)


def test_a_nan_cosine_leaves_the_correlation_undefined_not_ranked_last():
    assert np.isnan(spearman([0.1, 0.2, np.nan, 0.4], [1, 2, 3, 4]))  # a sort ranked NaN largest: 1.0
    assert np.isnan(similarity_metrics(np.array([[1.0, 0.0], [np.nan, 0.0], [0.0, 1.0]]), np.eye(2)[[0, 0, 0]],
                                       [1.0, 2.0, 3.0])["spearman"])
    # retrieval: NaN compares false with everything, so every rank came out 1 (a perfect score)
    assert np.isnan(retrieval_metrics(np.full((2, 3), np.nan), np.eye(3), [0, 1])["mrr@10"])
    with pytest.raises(ValueError, match="3 queries but 2 positives"):
        retrieval_metrics(np.eye(3), np.eye(3), [0, 1])


def test_retrieval_metrics_perfect_and_known_rank():
    corpus = np.eye(4)
    perfect = retrieval_metrics(corpus.copy(), corpus, [0, 1, 2, 3])
    assert perfect == {"mrr@10": 1.0, "ndcg@10": 1.0, "recall@1": 1.0, "recall@10": 1.0, "n": 4}
    # query 0 is nearest row 0, then row 1, then row 2: its positive row 2 ranks third
    queries = np.array([[0.9, 0.4, 0.1, 0.0], [0.0, 1.0, 0.0, 0.0]])
    assert positive_ranks(queries, corpus, [2, 1]).tolist() == [3, 1]
    m = retrieval_metrics(queries, corpus, [2, 1])
    assert m["mrr@10"] == pytest.approx((1 / 3 + 1) / 2)
    assert m["ndcg@10"] == pytest.approx((1 / np.log2(4) + 1) / 2)
    assert m["recall@1"] == 0.5 and m["recall@10"] == 1.0 and m["n"] == 2


def test_an_anchor_with_several_answers_is_one_query_that_misses_none_of_them():
    """The same question twice with two right answers, beside another: the textbook figures
    (one query per distinct anchor, all its answers relevant) are perfect here; scored as two
    queries with one answer each, the other right answer counted as a miss (MRR 0.833)."""
    from spanflow.tasks.embed.model import Embedder, anchors_answers

    queries, corpus = np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.9, 0.1], [1.0, 0.0], [0.0, 1.0]])
    m = retrieval_metrics(queries, corpus, [[0, 1], [2]])
    assert m == {"mrr@10": 1.0, "ndcg@10": 1.0, "recall@1": pytest.approx(0.75), "recall@10": 1.0, "n": 2}
    assert anchors_answers(["q", "q", "r", "q"], [0, 1, 2, 1]) == ([0, 2], [[0, 1], [2]])

    class Fixed(Embedder):  # the vectors above, by text
        def __init__(self):
            pass

        def encode(self, texts, **_):
            return np.array([{"q": [1.0, 0.0], "r": [0.0, 1.0], "x": [0.9, 0.1], "y": [1.0, 0.0], "z": [0.0, 1.0]}[t]
                             for t in texts])

    from spanflow.tasks.embed.pairs import Pair

    got = Fixed().evaluate([Pair("q", "x"), Pair("q", "y"), Pair("r", "z")] * 4)
    assert got["mrr@10"] == 1.0 and got["n"] == 2 and got["pairs"] == 12
    assert "on 12 pairs: 2 distinct anchors" in Embedder.format_metrics(got)


def test_triplets_are_also_scored_by_whether_each_anchor_is_closer_to_its_positive():
    from spanflow.tasks.embed.model import Embedder

    vectors = {"q": [1.0, 0.0], "r": [0.0, 1.0], "x": [0.9, 0.1], "z": [0.0, 1.0], "n1": [0.0, 1.0],
               "far": [-1.0, 0.0]}

    class Fixed(Embedder):
        def __init__(self):
            pass

        def encode(self, texts, **_):
            return np.array([vectors[t] for t in texts])

    # (q, x, n1): x is closer; (r, z, far): z is; (q, x, q): the negative is the anchor itself, closer than x
    got = Fixed().evaluate([Pair("q", "x", negative="n1"), Pair("r", "z", negative="far"),
                            Pair("q", "x", negative="q")])
    assert got["triplet_accuracy"] == pytest.approx(2 / 3) and got["mrr@10"] == 1.0
    lines = Embedder.format_metrics(got).splitlines()
    assert lines[-2] == "triplet_accuracy  0.6667" and lines[-1] == "on 3 triplets: 2 distinct anchors, each with all " \
        "of its answers"
    assert len({line.index("1.0000") for line in lines[:-2]} | {lines[-2].index("0.6667")}) == 1  # one column
    assert "triplet_accuracy" not in Fixed().evaluate([Pair("q", "x"), Pair("r", "z")])
    scored = Fixed().evaluate([Pair("q", "x", 1.0), Pair("r", "z", 0.5), Pair("q", "far", 0.0)])
    assert scored["pairs"] == scored["n"] == 3  # the key every kind's --json has


def test_a_query_is_not_ranked_against_its_own_text_among_the_answers():
    from spanflow.tasks.embed.model import Embedder

    vectors = {"q": [1.0, 0.0], "x": [0.9, 0.3], "r": [0.0, 1.0], "z": [0.2, 0.9]}

    class Fixed(Embedder):
        def __init__(self):
            pass

        def encode(self, texts, **_):
            return np.array([vectors[t] for t in texts])

    # the pairs listed both ways: q's own text is an answer (of x), and the closest row to it
    both = [Pair("q", "x"), Pair("x", "q"), Pair("r", "z"), Pair("z", "r")]
    got = Fixed().evaluate(both)
    assert got["recall@1"] == 1.0 and got["mrr@10"] == 1.0
    # an anchor whose own text is its right answer still counts it
    assert Fixed().evaluate([Pair("q", "q"), Pair("r", "z")])["recall@1"] == 1.0


def test_retrieval_beyond_ten_counts_zero():
    corpus = np.eye(12)
    query = np.linspace(1.0, 0.1, 12)[None, :]  # row 11 ranks twelfth
    m = retrieval_metrics(query, corpus, [11])
    assert m["mrr@10"] == 0.0 and m["ndcg@10"] == 0.0 and m["recall@10"] == 0.0


def test_pairs_files_whose_first_record_is_unusual_are_read_or_refused_not_misread(tmp_path):
    from spanflow.errors import DataError
    from spanflow.tasks.embed.pairs import read_pairs

    mixed = tmp_path / "mixed.jsonl"  # the first record fixes the keys: a later score would be dropped
    mixed.write_text('{"sentence1": "a b", "sentence2": "c d"}\n{"sentence1": "e f", "sentence2": "g h", "score": 3}\n')
    with pytest.raises(DataError, match=r"mixed.jsonl:2: record has a 'score' key that the first record \(line 1\)"):
        read_pairs(str(mixed))
    empty_first = tmp_path / "e.csv"  # no header: its first record's score is missing, not a header's name
    empty_first.write_text("a b,c d,\ne f,g h,3\ni j,k l,4\n")
    with pytest.raises(DataError, match=r"e.csv:1: score is missing"):
        read_pairs(str(empty_first))
    named = tmp_path / "qd.csv"  # a retrieval header of two known names is a header, not a pair
    named.write_text("query,document\nwhat is x,x is y\nwho is she,she is Ann\n")
    assert [p.a for p in read_pairs(str(named))] == ["what is x", "who is she"]


@pytest.mark.parametrize("text", ['[{"anchor": "a", "positive": "b"}, {"anchor": "c", "positive": "d"}]\n',
                                  '[\n  {"anchor": "a", "positive": "b"},\n  {"anchor": "c", "positive": "d"}\n]\n'])
def test_a_json_list_of_pairs_is_named_with_its_conversion(tmp_path, text):
    """A one-line list said "expected a JSON object, got list"; a pretty-printed one "invalid JSON"."""
    path = write(tmp_path, "p.json", text)
    with pytest.raises(DataError, match=r"p\.json:1: is one JSON list; pair files are JSONL, one object a line "
                                        r"\(convert it with jq -c '\.\[\]' .*p\.json > .*p\.jsonl\)"):
        read_pairs(path)


def test_a_header_of_known_names_in_another_order_is_read_by_its_names(tmp_path):
    scored = write(tmp_path, "s.csv", "score,sentence1,sentence2\n4.0,the cat sat,a cat sat\n1.0,dogs run,a dog ran\n")
    assert read_pairs(scored) == [Pair("the cat sat", "a cat sat", 1.0), Pair("dogs run", "a dog ran", 0.0)]
    swapped = write(tmp_path, "p.csv", "positive,anchor\na cat sat,the cat sat\na dog ran,dogs run\n")
    assert read_pairs(swapped) == [Pair("the cat sat", "a cat sat"), Pair("dogs run", "a dog ran")]
    neg = write(tmp_path, "t.tsv", "negative\tanchor\tpositive\nfish swim\tthe cat sat\ta cat sat\n")
    assert read_pairs(neg) == [Pair("the cat sat", "a cat sat", negative="fish swim")]


def test_an_unknown_header_is_said_and_a_text_or_code_in_the_first_row_is_no_header(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="spanflow"):
        got = read_pairs(write(tmp_path, "qa.csv", "q,a\nthe cat sat,a cat sat\ndogs run,a dog ran\n"))
    assert got[0] == Pair("q", "a") and "its first row (q, a) looks like a header" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="spanflow"):  # names of capitalised words too (unsaid before)
        got = read_pairs(write(tmp_path, "qt.csv", "Question Text,Answer Text\nthe cat sat,a cat sat\n"
                                                   "dogs run,a dog ran\n"))
    assert "its first row (Question Text, Answer Text) looks like a header" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="spanflow"):  # pairs of single words are data, said of none
        assert len(read_pairs(write(tmp_path, "w.csv", "cat,dog\nbird,fish\n"))) == 2
    assert "looks like a header" not in caplog.text
    # a first negative that is a text, later ones years: triplets, not a header over scores
    t = write(tmp_path, "t.csv", "the cat sat,a cat sat,fish swim\ndogs run,a dog ran,1999\nx y,z w,rain falls\n")
    assert [p.negative for p in read_pairs(t)] == ["fish swim", "1999", "rain falls"]
    # a first negative that is a year, the rest texts: triplets too (refused as scores before)
    t = write(tmp_path, "n.tsv", "a b\tc d\t1999\ne f\tg h\tsome other text\ni j\tk l\ta third text\n")
    assert [p.negative for p in read_pairs(t)] == ["1999", "some other text", "a third text"]
    spaced = write(tmp_path, "s.csv", "Sentence A,Sentence B,Similarity Score\na cat,the cat,4.5\ndogs,a dog,3.8\n")
    assert read_pairs(spaced) == [Pair("a cat", "the cat", 1.0), Pair("dogs", "a dog", 0.0)]  # a header of spaces
    # chosen by index: an unselected column's "n/a" over a number makes no header
    w = write(tmp_path, "i.csv", "n/a,the cat sat,a cat sat,4\n5,dogs run,a dog ran,3\n7,birds fly,a bird flew,1\n")
    assert len(read_pairs(w, columns="1,2,3")) == 3


def test_a_jsonl_third_key_is_never_dropped_unsaid(tmp_path):
    both = write(tmp_path, "b.jsonl", '{"anchor": "x", "positive": "y", "negative": "z", "score": 1}\n')
    with pytest.raises(DataError, match=r"b\.jsonl:1: record has both 'score' and 'negative'.*--columns"):
        read_pairs(both)
    later = write(tmp_path, "l.jsonl", '{"anchor": "x", "positive": "y", "negative": "z"}\n'
                                       '{"anchor": "u", "positive": "v", "negative": "w", "score": 3}\n')
    with pytest.raises(DataError, match=r"l\.jsonl:2: record has a 'score' key that the first record"):
        read_pairs(later)
    assert read_pairs(both, columns="anchor,positive,negative") == [Pair("x", "y", negative="z")]


def test_a_jsonl_similarity_is_a_score_and_another_key_is_said(tmp_path, caplog):
    """`similarity`, a score's name in a CSV header, was dropped in JSONL (the pairs trained unscored);
    a third field under a name not read (hard_negative) is said, an id is not."""
    sim = write(tmp_path, "s.jsonl", '{"sentence1": "a b", "sentence2": "a c", "similarity": 4.5}\n'
                                     '{"sentence1": "d e", "sentence2": "f g", "similarity": 0.5}\n')
    got = read_pairs(sim)
    assert [p.score for p in got] == [1.0, 0.0]
    with caplog.at_level("WARNING", logger="spanflow"):
        hard = write(tmp_path, "h.jsonl", '{"id": 7, "anchor": "x", "positive": "y", "hard_negative": "z"}\n')
        assert read_pairs(hard) == [Pair("x", "y")]
    assert "h.jsonl:1: the key(s) 'hard_negative' are not read" in caplog.text and "'id'" not in caplog.text
    assert "--columns anchor,positive,hard_negative" in caplog.text
    caplog.clear()  # beside a third key read, other keys are metadata: nothing said
    with caplog.at_level("WARNING", logger="spanflow"):
        meta = write(tmp_path, "m.jsonl", '{"sentence1": "a", "sentence2": "b", "score": 3, "genre": "news"}\n')
        assert read_pairs(meta) == [Pair("a", "b", 1.0)]
    assert "not read" not in caplog.text
    assert read_pairs(hard, columns="anchor,positive,hard_negative") == [Pair("x", "y", negative="z")]


def test_prose_whose_quotes_run_over_lines_is_still_plain_text():
    import tempfile

    from spanflow.data.formats.sniff import sniff

    prose = ('"Come here\nnow," she said to him.\nHe looked up at her, slowly.\n"Why, though?" he asked, and she '
             'laughed.\nThey walked on, together, to the shop.\nIt was late, and the lights were on.\n"Stop," she '
             'said, "now."\nHe stopped, at last, by the door.\nThe end came soon, as it does.\n')
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prose)
    assert sniff(f.name).name == "text"


def test_a_csv_whose_quoted_fields_run_over_lines_is_read_as_pairs(tmp_path):
    text = ('query,passage\nwhat is paris,"Paris is the capital.\nIt lies on the Seine.\nIt has museums."\n'
            'who wrote hamlet,"Shakespeare wrote it.\nAround 1600.\nSet in Denmark."\n')
    got = read_pairs(write(tmp_path, "ml.csv", text))
    assert [p.a for p in got] == ["what is paris", "who wrote hamlet"] and got[1].b.endswith("Set in Denmark.")


def test_what_was_read_is_said_in_one_line(tmp_path):
    said = []
    raw = write(tmp_path, "sts.csv", "a cat sits,a cat is sitting,5.0\na dog runs,the sky is blue,0\nmen play,people play,2.5\n")
    read_pairs(raw, log_fn=said.append)
    assert said == [f"read {raw}: 3 scored pairs from columns 0,1,2 (counted from 0; no header row); scores 0 to 5, "
                    "read as similarity 0 to 1"]
    named = write(tmp_path, "named.csv", "score,sentence1,sentence2\n4,a b,c d\n1,e f,g h\n")
    read_pairs(named, log_fn=said.append)
    assert said[-1] == (f"read {named}: 2 scored pairs from its header's columns sentence1,sentence2,score; scores 1 "
                        "to 4, read as similarity 0 to 1")
    trip = write(tmp_path, "t.jsonl", "".join(json.dumps({"anchor": a, "positive": p, "negative": n}) + "\n"
                                              for a, p, n in TRIPLETS))
    read_pairs(trip, log_fn=said.append)
    assert said[-1] == f"read {trip}: 2 triplets from the keys anchor,positive,negative"
    one = write(tmp_path, "one.tsv", "q one\tp one\n")
    read_pairs(one, columns="1,0", log_fn=said.append)
    assert said[-1] == f"read {one}: 1 pair from columns 1,0 (counted from 0; no header row)"


def test_a_label_of_nli_classes_read_as_similarity_is_warned(tmp_path, caplog):
    nli = write(tmp_path, "nli.csv", "sentence1,sentence2,label\na b,c d,0\ne f,g h,1\ni j,k l,2\n")
    graded = write(tmp_path, "graded.csv", "sentence1,sentence2,label\na b,c d,0\ne f,g h,1\ni j,k l,3\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        read_pairs(graded)
        assert "NLI" not in caplog.text
        pairs = read_pairs(nli)
    assert "its label holds 0, 1 and 2 only" in caplog.text and "contradictions count as the closest pairs (in training and in a score alike)" in caplog.text
    assert [p.score for p in pairs] == [0.0, 0.5, 1.0]  # still read as asked: the warning says what it means
    caplog.clear()
    capital = write(tmp_path, "cap.csv", "Sentence1,Sentence2,Label\na b,c d,0\ne f,g h,1\ni j,k l,2\n")
    with caplog.at_level("WARNING", logger="spanflow"):
        read_pairs(capital)  # a header's names in any case
    assert "its label holds 0, 1 and 2 only" in caplog.text
    # a header shorter than the columns picked: read, and said by index
    said = []
    short = write(tmp_path, "short.csv", "sentence1,sentence2\na b,c d,1\ne f,g h,0\n")
    assert len(read_pairs(short, columns="0,1,2", log_fn=said.append)) == 2 and "columns sentence1,sentence2,2" in said[0]


def test_a_csv_split_by_semicolons_is_told_so_and_prose_is_not(tmp_path):
    semi = write(tmp_path, "semi.csv", "a b;c d;1\ne f;g h;2\n")
    with pytest.raises(DataError, match="plain text lines.*its fields look separated by semicolons"):
        read_pairs(semi)
    prose = write(tmp_path, "prose.csv", "I came; I saw\nthen I left\n")
    with pytest.raises(DataError, match="plain text lines") as e:
        read_pairs(prose)
    assert "separated by" not in str(e.value)


def test_scores_at_the_ends_of_a_float_normalise_without_overflow(tmp_path):
    pairs = read_pairs(write(tmp_path, "huge.csv", "a b,c d,-1e308\ne f,g h,1e308\ni j,k l,0\n"))
    assert [p.score for p in pairs] == [0.0, 1.0, 0.5]
