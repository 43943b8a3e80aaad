"""`spanflow embed`'s progress: a bar on a terminal; a piped log gets the summary lines, no bar frames."""
from __future__ import annotations

import io
import sys

import pytest

from helpers import tiny_bert
from spanflow.cli.main import main
from spanflow.data.synthetic import synthetic_ner
from spanflow.tasks.embed import Embedder
from spanflow.tasks.embed.job import EmbedSpec, embed_file

TEXTS = [e.text for e in synthetic_ner(12, seed=5)]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(scope="module")
def enc_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("enc")
    enc, tok = tiny_bert(TEXTS, hidden=32, layers=2, heads=2, seed=0)
    enc.save_pretrained(d)
    tok.save_pretrained(d)
    return str(d)


@pytest.fixture
def src(tmp_path):
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n")
    return str(path)


def test_a_piped_log_gets_summary_lines_not_bar_frames(enc_dir, src, tmp_path, capfd):
    out = tmp_path / "v.npy"
    assert main(["embed", "--model", enc_dir, "--input", src, "--output", str(out), "--chunk-size", "4",
                 "--precision", "fp32", "--device", "cpu", "--max-tokens", "256"]) == 0
    stdout, stderr = capfd.readouterr()
    assert "\r" not in stderr and "text/s" not in stderr  # no tqdm frame
    assert f"embedded {len(TEXTS)} texts in" in stdout


def test_a_terminal_gets_the_bar(enc_dir, src, tmp_path, monkeypatch):
    term = Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    emb = Embedder.load(enc_dir, device="cpu", precision="fp32")
    s = embed_file(emb, EmbedSpec(input=src, output=str(tmp_path / "v.npy"), chunk_size=4), calibrate=False,
                   log=lambda m: None)
    assert s["texts"] == len(TEXTS)
    assert "\r" in term.getvalue() and f"{len(TEXTS)}/{len(TEXTS)}" in term.getvalue()
