"""Every ```bash and ```python block of README.md and docs/*.md, run as written on the data
`spanflow demo --write-data` makes.

Each page runs in a directory of its own that holds the demo data, its blocks in page order.
Commands run through `spanflow.cli.main`; a synopsis line runs with its required part, and
every `[--optional FLAG]` and `a|b` alternative of it is parsed by the real parser. Python
blocks are executed; `EXPR  # -> VALUE` compares what EXPR gives with VALUE (`...` stands
for anything, a set of names for a dict with those keys; a VALUE that is no literal, such as
`list[NerExample(...)]`, only shows the shape). `spanflow serve` builds its app in the test,
and `curl` lines are requests to it. Placeholders become models built here: `DIR` is `tiny`
(an encoder directory where an embedding model is meant), `MINILM_DIR`, `ENCODER_DIR` and
`path/to/all-MiniLM-L6-v2` a small BERT directory of MiniLM's 384 dimensions; a `runs/X`
model a page uses but does not train is trained once for every page.

To stay short, trainings are cut (SPEED, PY_EPOCHS) and one already run with the same data
and arguments is copied rather than run again. What is not run, or runs in another form, is
listed in NOT_RUN and ADAPTED, each with why.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DATA_SIZE = 200  # --train-size of the demo data here (the docs' default, 1500, trains for minutes)

# (page, command as its words, or a Python block's first line): why it does not run here
NOT_RUN = {
    ("README.md", "make test"): "runs this test suite",
    ("docs/serving.md", "pip install -e .[serve]"): "installs from the network; the tests' environment has the extra",
    ("docs/spacy.md", "pip install -e .[spacy]"): "installs from the network; the tests' environment has the extra",
    ("docs/distributed.md", "spanflow train ner ... --devices 4"):
        "four processes, one per accelerator (`--devices 2` on CPU runs in test_distributed.py)",
    ("docs/distributed.md", "torchrun --nproc-per-node 4 -m spanflow train ner ..."):
        "the same four processes, through torchrun",
    ("docs/distributed.md", ("torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 "
                             "-m spanflow train ner ...")): "a cluster of two nodes",
    ("docs/recipes.md", "python bench/recipes_wnut17.py --train wnut17/train.conll --dev wnut17/dev.conll"):
        "a benchmark of many trainings on WNUT-17, which is not in the repository",
    ("docs/spacy.md", 'nlp = spacy.blank("en")'): "spaCy's own training loop, a fragment shown for comparison",
    ("docs/data-formats.md", "import lancedb, pyarrow.compute as pc, pyarrow.parquet as pq"):
        "LanceDB is no dependency of spanflow, and `query_vector` is the reader's",
    ("docs/ray.md", "pip install spanflow[ray]"): "installs from the network; the tests' environment has the extra",
    ("docs/ray.md", "spanflow embed --model MODEL --input texts.parquet --column text --output vectors/ --ray"):
        "starts a Ray runtime for the job (test_ray.py runs the pipeline on a local Ray)",
    ("docs/ray.md", ("spanflow predict --model /shared/models/ner --input s3://bucket/docs/ --column body "
                     "--id-column doc_id --keep-columns url --output s3://bucket/entities/ --ray")):
        "a Ray cluster and an object store",
    ("docs/ray.md", "import pyarrow.dataset as ds"): "reads what the --ray job above writes",
    ("docs/ray.md", "import ray"): "an object store (test_ray.py runs Predictor in Ray Data on a local Ray)",
    ("docs/ray.md", "ray start --head --port 6379"): "starts a Ray cluster",
    ("docs/ray.md", "ray start --address HEAD:6379"): "joins a Ray cluster",
    ("docs/ray.md", ("spanflow embed --model /shared/models/minilm --input /shared/texts/ --column text "
                     "--output /shared/vectors/ --ray")): "a Ray cluster and its shared file system",
    ("docs/ray.md", "spanflow embed ... --ray HEAD:6379"): "a Ray cluster",
    ("docs/ray.md", "spanflow embed ... --ray ray://HEAD:10001"): "a Ray cluster, through Ray Client",
}
TRIPLETS = ("spanflow train embed --train triplets.tsv --dev qa_dev.jsonl --model MINILM_DIR --out runs/tri "
            "--symmetric --matryoshka-dims 384,256,128,64")
# (page, command as its words): (what runs instead, why)
ADAPTED = {
    ("README.md", "make demo"): ("spanflow demo --out demo_out",
                                 "the Makefile's recipe; the .venv set-up before it installs from the network"),
    ("docs/cli.md", "spanflow export --model runs/ner/model --out OUT"):
        ("spanflow export --model runs/export/model --out OUT",
         "export refuses tiny and CRF models (ner.md): this one has a softmax head on an encoder directory"),
    ("docs/training.md", TRIPLETS + " --devices 2"):
        (TRIPLETS, "in one process: two need two accelerators (`--devices 2` on CPU runs in test_distributed.py)"),
}
# flags appended to keep a command short (the last of a repeated flag wins)
SPEED = {
    "train": ["--epochs", "1"],
    "demo": ["--train-size", str(DATA_SIZE), "--epochs", "1"],
    "tune": ["--sample", "32", "--repeats", "1", "--budgets", "256,512", "--no-backends"],
    "doctor": ["--steps", "2"],
    "serve": ["--backend", "eager"],  # auto compiles the encoder at start
}
# Python trainings: the tasks' default epochs cut to these; NER's are enough to find what the docs show
PY_EPOCHS = {"ner": 8, "re": 1, "embed": 1}
# models a page may use without training them: trained once (copied into each page that needs one)
SEEDS = {
    "runs/ner": "spanflow train ner --train train.conll --dev dev.conll --model tiny --out runs/ner",
    "runs/re": "spanflow train re --train train_triples.json --dev dev_triples.json --model tiny --out runs/re",
    "runs/emb": "spanflow train embed --train pairs.csv --dev dev_pairs.csv --model MINILM_DIR --out runs/emb",
    "runs/export": ("spanflow train ner --train train.conll --dev dev.conll --model ENCODER_DIR --head softmax "
                    "--out runs/export"),
}
ENCODERS = {"MINILM_DIR", "ENCODER_DIR", "path/to/all-MiniLM-L6-v2"}
DATA_OF_TASK = {"ner": "train.conll", "re": "train_triples.json", "embed": "texts.txt"}
# values of placeholders in a synopsis, where a flag's type needs one
VALUES = {"N": "2", "LR": "1e-3", "GIB": "8", "MS": "100", "KEY": "docs-key", "NAME": "text", "A,B": "text"}
NUMBERS = {"--max-tokens": "512", "--max-length": "64", "--stride": "16", "--epochs": "1", "--column": "0"}
FENCE = re.compile(r"^ {0,3}```(\w*)\s*$")


@dataclasses.dataclass
class Block:
    page: str
    line: int  # of the block's first line of code
    lang: str
    code: str


def pages() -> list[str]:
    return ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md"))]


def blocks_of(page: str, text: str) -> list[Block]:
    """The ```bash and ```python blocks of a page."""
    out, lang, start, lines = [], None, 0, []
    for i, line in enumerate(text.split("\n"), 1):
        m = FENCE.match(line)
        if lang is None and m and m.group(1):
            lang, start, lines = m.group(1), i + 1, []
        elif lang is not None and line.strip().startswith("```"):
            if lang in ("bash", "python"):
                out.append(Block(page, start, lang, "\n".join(lines)))
            lang = None
        elif lang is not None:
            lines.append(line)
    return out


def commands(code: str) -> list[list[str]]:
    """A bash block's commands as words: continued lines joined, comments dropped, `&&` split."""
    out = []
    for line in code.replace("\\\n", " ").split("\n"):
        words = shlex.split(line, comments=True)
        while words:
            cut = words.index("&&") if "&&" in words else len(words)
            out.append(words[:cut])
            words = words[cut + 1:]
    return out


# --- synopses: [optional] parts and a|b alternatives


def unbracket(words: list[str], *, optional: bool) -> list[str]:
    """The words of a synopsis without its brackets: only the required ones, or (`optional`)
    the optional ones too, the first of `[--a X | --b Y]` alternatives kept."""
    out, depth, skip_below = [], 0, None
    for w in words:
        opens, closes = len(w) - len(w.lstrip("[")), len(w) - len(w.rstrip("]"))
        word = w[opens:len(w) - closes]
        depth += opens
        if word == "|" and depth and skip_below is None:
            skip_below = depth
        elif word and skip_below is None and (depth == 0 or optional):
            out.append(word)
        depth -= closes
        if skip_below is not None and depth < skip_below:
            skip_below = None
    return out


def pipes_outside_a_synopsis(words: list[str]) -> bool:
    """`--model DIR|tiny` in a line with no [optional] part: a line to copy, where | pipes."""
    return not any(w.startswith("[") for w in words) and any("|" in w for w in words)


def alternatives(word: str) -> list[str]:
    """`texts.txt|.jsonl` -> texts.txt, texts.jsonl; `crf|softmax` -> crf, softmax."""
    alts = word.split("|") if "|" in word.strip("|") else [word]
    stem = os.path.splitext(alts[0])[0]
    return [stem + a if a.startswith(".") else a for a in alts]


def variants(words: list[str]) -> list[list[str]]:
    """One command line per alternative: the i-th alternative of every word (its last one when fewer)."""
    alts = [alternatives(w) for w in words]
    n = max((len(a) for a in alts), default=1)
    return [[a[min(i, len(a) - 1)] for a in alts] for i in range(n)]


def task_of(argv: list[str]) -> str:
    if argv[0] == "train":
        return argv[1]
    if argv[0] == "embed":
        return "embed"
    return argv[argv.index("--task") + 1] if "--task" in argv else "ner"


def substitute(argv: list[str], encoder: str) -> list[str]:
    """Placeholders (after `spanflow`) replaced by what runs here."""
    task, out = task_of(argv), []
    for i, w in enumerate(argv):
        flag = argv[i - 1] if i else ""
        if flag == "--model":
            name, eq, path = w.rpartition("=")
            if path in ENCODERS or (path == "DIR" and task == "embed"):
                path = encoder
            elif path == "DIR":
                path = "tiny"
            w = name + eq + path
        elif w == "F":
            w = {"--input": "texts.txt", "--field": "text"}.get(flag, DATA_OF_TASK.get(task, "texts.txt"))
        elif w == "N":
            w = NUMBERS.get(flag, VALUES["N"])
        elif w in VALUES:
            w = VALUES[w]
        out.append(w)
    return out


def parse_check(argv: list[str]) -> None:
    """The real parser takes the command line: every flag exists and every value is one it takes."""
    from spanflow.cli.main import build_parser

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            build_parser().parse_args(argv)
    except SystemExit:
        raise AssertionError(f"spanflow {shlex.join(argv)}: {err.getvalue().strip()}") from None


# --- what the Python blocks show


def matches(value, shown) -> bool:
    """`shown` (a literal from a `# ->` comment) describes `value`: `...` is anything, a set of
    names is a dict with those keys, a sequence ending in `...` a prefix."""
    if shown is Ellipsis:
        return True
    if isinstance(shown, set):
        return isinstance(value, dict) and {k for k in shown if k is not Ellipsis} <= set(value)
    if isinstance(shown, dict):
        return isinstance(value, dict) and all(k in value and matches(value[k], v) for k, v in shown.items())
    if isinstance(shown, (list, tuple)):
        if not isinstance(value, type(shown)):
            return False
        if shown and shown[-1] is Ellipsis:
            shown = shown[:-1]
            value = value[:len(shown)]
        return len(value) == len(shown) and all(matches(v, s) for v, s in zip(value, shown))
    return type(value) is type(shown) and value == shown


def _shown(value, shown: str, where: str):
    assert matches(value, ast.literal_eval(shown)), f"{where}: the docs show {shown}, it gives {value!r}"
    return value


def checked_source(block: Block, encoder: str) -> ast.Module:
    """The block's code with placeholder strings replaced, and each `EXPR  # -> LITERAL`
    line turned into a check of EXPR's value."""
    comments = {t.start[0]: t.string for t in tokenize.generate_tokens(io.StringIO(block.code).readline)
                if t.type == tokenize.COMMENT}
    tree = ast.parse(block.code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = encoder if node.value in ENCODERS else "tiny" if node.value == "DIR" else node.value
    body = []
    for stmt in tree.body:
        comment = comments.get(stmt.end_lineno, "")
        shown = comment[len("# ->"):].strip() if comment.startswith("# ->") else None
        if shown is not None and _is_literal(shown):
            where = f"{block.page}:{block.line + stmt.end_lineno - 1}"
            assert isinstance(stmt, ast.Expr), f"{where}: a `# -> VALUE` is checked on an expression line only"
            call = ast.Call(ast.Name("_shown", ast.Load()), [stmt.value, ast.Constant(shown), ast.Constant(where)], [])
            stmt = ast.Expr(call)
        body.append(stmt)
    tree.body = body
    return ast.fix_missing_locations(tree)


def _is_literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return False
    return True


# --- running a page


def _digest(*parts) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def _value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _files_digest(argv: list[str]) -> str:
    """The contents of the files a training reads: a page that changed them trains again."""
    h = hashlib.sha256()
    for path in filter(None, (_value(argv, "--train"), _value(argv, "--dev"))):
        if os.path.isfile(path):  # a missing one is the command's to report
            h.update(Path(path).read_bytes())
    return h.hexdigest()


class Trained:
    """Trainings already run, by their data and arguments: one asked for again is copied."""

    def __init__(self):
        self.done: dict[str, tuple[str, object]] = {}

    def reuse(self, key: str, out_dir: str):
        """The result of an earlier run of `key`, its directory copied to `out_dir`; None if none ran."""
        if key not in self.done:
            return None
        src, result = self.done[key]
        if os.path.abspath(out_dir) != src:
            shutil.copytree(src, out_dir, dirs_exist_ok=True)
        return result

    def keep(self, key: str, out_dir: str, result) -> None:
        self.done[key] = (os.path.abspath(out_dir), result)


class Page:
    """One page's blocks run in order in one directory, as a reader would run them."""

    def __init__(self, page: str, work: Path, encoder: str, trained: Trained, monkeypatch):
        self.page, self.cwd, self.encoder, self.trained = page, work, encoder, trained
        self.apps: list = []
        self.client = None
        self.stack = contextlib.ExitStack()
        monkeypatch.setattr("spanflow.serving.address.serve_on", lambda socks, app, **kw: self.apps.append(app))
        monkeypatch.chdir(work)

    def spanflow(self, argv: list[str]) -> None:
        from spanflow.cli.main import main

        if argv[0] != "doctor" or "--model" in argv:  # doctor's --steps belongs to its probe alone
            argv = argv + SPEED.get(argv[0], [])
        where, out = f"{self.page}: spanflow {shlex.join(argv)}", _value(argv, "--out")
        key = None
        if argv[0] == "train":  # the same training on the same data: copied
            i = argv.index("--out")
            key = _digest(argv[:i] + argv[i + 2:], _files_digest(argv))
            if self.trained.reuse(key, out) is not None:
                return
        assert main(argv) == 0, where
        for written in (out, _value(argv, "--output")):
            assert written is None or os.path.exists(written), f"{where}: wrote no {written}"
        if key:
            self.trained.keep(key, out, True)
        if argv[0] == "serve":
            self.serve(self.apps[-1])

    def serve(self, app) -> None:
        from fastapi.testclient import TestClient

        self.client = self.stack.enter_context(TestClient(app))

    def curl(self, words: list[str]) -> None:
        """A `curl -s URL [-H H] -d BODY` line as a request to the app `spanflow serve` built."""
        assert self.client is not None, f"{self.page}: curl {shlex.join(words)} before any spanflow serve"
        args, headers, body, url = iter(words), {"content-type": "application/x-www-form-urlencoded"}, None, None
        for w in args:
            if w == "-d":
                body = next(args)
            elif w == "-H":
                name, _, value = next(args).partition(":")
                headers[name.strip().lower()] = value.strip()
            elif not w.startswith("-"):
                url = w
        path = "/" + url.split("/", 1)[1]
        r = self.client.request("POST" if body is not None else "GET", path, content=body, headers=headers)
        assert r.status_code == 200, f"{self.page}: curl {url}: {r.status_code} {r.text[:300]}"
        assert "error" not in r.json()

    def command(self, words: list[str]) -> None:
        line = " ".join(words)
        if (self.page, line) in NOT_RUN:
            if words[0] == "spanflow" and "..." not in words:  # not run, but its flags are still checked
                self.check_flags(words[1:])
            return
        if (self.page, line) in ADAPTED:
            words = shlex.split(ADAPTED[self.page, line][0])
        if words[0] == "cd":
            self.cwd = self.cwd / words[1]
            os.chdir(self.cwd)
        elif words[0] == "curl":
            self.curl(words)
        elif words[0] == "spanflow":
            assert not pipes_outside_a_synopsis(words), f"{self.page}: {line}: a shell reads | as a pipe"
            self.check_flags(words[1:])
            self.spanflow(substitute(variants(unbracket(words[1:], optional=False))[0], self.encoder))
        else:
            raise AssertionError(f"{self.page}: no way to run {line!r} here; list it in NOT_RUN or ADAPTED with why")

    def check_flags(self, argv: list[str]) -> None:
        """Every alternative of a command line, its optional flags included, parsed."""
        for variant in variants(unbracket(argv, optional=True)):
            parse_check(substitute(variant, self.encoder))

    def python(self, block: Block) -> None:
        first = block.code.strip().split("\n")[0]
        if (self.page, first) in NOT_RUN:
            return
        code = compile(checked_source(block, self.encoder), f"{block.page}:{block.line}", "exec")
        exec(code, {"__name__": "__docs__", "_shown": _shown})  # noqa: S102 (the docs' own code)

    def run(self, blocks: list[Block]) -> None:
        with self.stack:
            for b in blocks:
                if b.lang == "bash":
                    for words in commands(b.code):
                        self.command(words)
                else:
                    self.python(b)


def made_by(text: str) -> set[str]:
    return set(re.findall(r"(?:--out |out_dir=\")(runs/\w+)", text))


def needed_by(page: str, text: str) -> set[str]:
    """The runs/X models a page uses (also in its ADAPTED commands) and does not train."""
    used = text + " ".join(cmd for (p, _), (cmd, _) in ADAPTED.items() if p == page)
    return {s for s in SEEDS if s + "/" in used} - made_by(text)


@pytest.fixture(scope="module")
def demo_data(tmp_path_factory):
    from spanflow.cli.main import main

    d = tmp_path_factory.mktemp("demo-data")
    assert main(["demo", "--write-data", str(d), "--train-size", str(DATA_SIZE)]) == 0
    return d


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, demo_data):
    """A one-layer BERT directory with MiniLM's 384 dimensions, its tokenizer fitted to the demo texts."""
    from helpers import tiny_bert

    texts = [line.split("\t")[0] for line in (demo_data / "triplets.tsv").read_text(encoding="utf-8").splitlines()]
    texts += (demo_data / "texts.txt").read_text(encoding="utf-8").splitlines()
    model, tok = tiny_bert(texts, hidden=384, layers=1, heads=6)
    d = tmp_path_factory.mktemp("encoder")
    model.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def trained():
    return Trained()


def _cut_epochs(monkeypatch) -> None:
    from spanflow.tasks.embed import train as embed_train
    from spanflow.tasks.ner import train as ner_train
    from spanflow.tasks.re import train as re_train

    for table, task in ((ner_train.DEFAULTS, "ner"), (re_train.DEFAULTS, "re"), (embed_train.DEFAULTS, "embed"),
                        (embed_train.RANKING_DEFAULTS, "embed")):
        for kind, d in list(table.items()):
            monkeypatch.setitem(table, kind, dataclasses.replace(d, epochs=PY_EPOCHS[task]))


def _remember_trainings(monkeypatch, trained: Trained) -> None:
    """train_ner, train_re and train_embedder, each call already made with the same arguments copied."""
    import spanflow.tasks.embed.train as embed_train
    from spanflow.tasks import ner
    from spanflow.tasks import re as re_task

    for module, name in ((ner, "train_ner"), (re_task, "train_re"), (embed_train, "train_embedder")):
        real = getattr(module, name)

        def remembered(*args, _real=real, _name=name, out_dir, **kw):
            key = _digest(_name, args, sorted(kw.items()))
            done = trained.reuse(key, out_dir)
            if done is None:
                done = _real(*args, out_dir=out_dir, **kw)
                trained.keep(key, out_dir, done)
            return done

        monkeypatch.setattr(module, name, remembered)


def _page_text(page: str) -> str:
    return (ROOT / page).read_text(encoding="utf-8")


def run_page(page: str, text: str, work: Path, demo_data: Path, encoder: str, trained: Trained, monkeypatch) -> None:
    """Every block of `text` (the page's markdown) run in `work`, a copy of the demo data."""
    shutil.copytree(demo_data, work)
    _cut_epochs(monkeypatch)
    _remember_trainings(monkeypatch, trained)
    seeder = Page(page, work, encoder, trained, monkeypatch)
    for seed in sorted(needed_by(page, text)):
        seeder.command(shlex.split(SEEDS[seed]))
    Page(page, work, encoder, trained, monkeypatch).run(blocks_of(page, text))


PAGES_WITH_CODE = [p for p in pages() if blocks_of(p, _page_text(p))]


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES_WITH_CODE)
def test_the_examples_of_a_page_run_as_written(page, tmp_path, demo_data, encoder, trained, monkeypatch, capsys):
    run_page(page, _page_text(page), tmp_path / "work", demo_data, encoder, trained, monkeypatch)


def test_what_is_not_run_is_still_in_the_docs():
    """Every NOT_RUN and ADAPTED entry names a command or block of its page: none is left over."""
    found = set()
    for page in pages():
        for b in blocks_of(page, _page_text(page)):
            if b.lang == "bash":
                found |= {(page, " ".join(w)) for w in commands(b.code)}
            else:
                found.add((page, b.code.strip().split("\n")[0]))
    left_over = (set(NOT_RUN) | set(ADAPTED)) - found
    assert not left_over, f"listed, but in no page: {sorted(left_over)}"


def test_the_makefile_demo_runs_what_adapted_says():
    assert "$(BIN)/spanflow demo --out demo_out" in (ROOT / "Makefile").read_text(encoding="utf-8")


def test_a_synopsis_is_parsed_with_its_optional_flags_and_alternatives():
    words = shlex.split("spanflow predict --model runs/ner/model --input texts.txt|.jsonl --output spans.jsonl "
                        "[--field F | --column N|NAME] [--max-length N]")[1:]
    assert unbracket(words, optional=False) == ["predict", "--model", "runs/ner/model", "--input", "texts.txt|.jsonl",
                                                "--output", "spans.jsonl"]
    full = unbracket(words, optional=True)
    assert full[-4:] == ["--field", "F", "--max-length", "N"]
    assert [v[4] for v in variants(full)] == ["texts.txt", "texts.jsonl"]
    assert substitute(full, "ENC")[-3:] == ["text", "--max-length", "64"]
    nested = shlex.split("doctor [--model DIR|tiny --data F [--task ner|re] [--batch-size N]]")
    assert unbracket(nested, optional=False) == ["doctor"]
    assert substitute(variants(unbracket(nested, optional=True))[1], "ENC") == \
        ["doctor", "--model", "tiny", "--data", "train_triples.json", "--task", "re", "--batch-size", "2"]


def test_alternatives_are_for_synopses_only():
    assert pipes_outside_a_synopsis(shlex.split("spanflow train ner --model DIR|tiny --out runs/ner"))
    assert not pipes_outside_a_synopsis(shlex.split("spanflow train ner --model DIR|tiny [--head crf|softmax]"))
    assert not pipes_outside_a_synopsis(shlex.split("spanflow train ner --model tiny --out runs/ner"))


def test_a_flag_the_parser_does_not_know_fails_the_check():
    parse_check(["predict", "--model", "m", "--input", "texts.txt", "--output", "o.jsonl", "--max-length", "64"])
    with pytest.raises(AssertionError, match="--no-such-flag"):
        parse_check(["predict", "--model", "m", "--input", "texts.txt", "--output", "o.jsonl", "--no-such-flag"])


def test_what_a_python_block_shows_is_compared():
    assert matches([[(0, 12, "PER")]], [[(0, 12, "PER")]])
    assert not matches([[(0, 12, "PER")]], [[(0, 12, "LOC")]])
    assert matches({"f1": 0.5, "per_label": {"PER": {}}}, ast.literal_eval('{"f1": ..., "per_label": {...}}'))
    assert matches({"f1": 1, "precision": 1, "x": 0}, {"f1", "precision"})
    assert not matches({"f1": 1}, {"f1", "precision"})
    block = Block("p.md", 3, "python", 'x = [1, 2]\nx   # -> [1, 3]\nlen(x)   # -> int, the length\n')
    code = compile(checked_source(block, "ENC"), "p.md", "exec")
    with pytest.raises(AssertionError, match=r"p.md:4: the docs show \[1, 3\], it gives \[1, 2\]"):
        exec(code, {"_shown": _shown})  # noqa: S102


def test_demo_write_data_writes_what_the_readers_read_back(tmp_path, capsys):
    from spanflow.cli.main import main
    from spanflow.data.io import read_ner, read_re
    from spanflow.data.synthetic import synthetic_ner, synthetic_re
    from spanflow.tasks.embed.pairs import read_pairs

    d = tmp_path / "data"
    assert main(["demo", "--write-data", str(d), "--train-size", "30"]) == 0
    assert "wrote 10 files" in capsys.readouterr().out
    assert read_ner(d / "train.conll") == synthetic_ner(30, seed=0)
    assert len(read_ner(d / "dev.conll")) == 100  # a fifth of the training set, at least 100
    gold = {(e.text, tuple(e.triples)) for e in synthetic_re(60, seed=0)}
    back = read_re(d / "train_triples.json")
    assert len(back) == 30 and all((e.text, tuple(e.triples)) in gold and not e.unlocated for e in back)
    scored, pairs, triplets = (read_pairs(str(d / f)) for f in ("pairs.csv", "qa_train.jsonl", "triplets.tsv"))
    assert len(scored) == len(pairs) == len(triplets) == 30
    assert len({p.score for p in scored}) == 4 and all(p.score is None for p in pairs)  # 0, 1, 2 or 3 shared
    assert all(t.negative and t.negative not in (t.a, t.b) for t in triplets)
    assert len((d / "texts.txt").read_text(encoding="utf-8").splitlines()) == 20


@pytest.mark.parametrize("where, message", [("file", "is a file; give a directory"),
                                            ("file/below", "cannot write to --write-data")])
def test_demo_write_data_into_a_file_is_one_error_line(tmp_path, capsys, where, message):
    from spanflow.cli.main import main

    (tmp_path / "file").write_text("x", encoding="utf-8")
    assert main(["demo", "--write-data", str(tmp_path / where)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]


def test_json_of_the_casrel_file_is_one_record_a_line(tmp_path):
    from spanflow.data.synthetic import write_demo_data

    write_demo_data(str(tmp_path), train_size=5)
    lines = (tmp_path / "train_triples.json").read_text(encoding="utf-8").splitlines()
    assert lines[0] == "[" and lines[-1] == "]" and len(lines) == 7
    assert len(json.loads("\n".join(lines))) == 5
