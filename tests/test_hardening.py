"""Bad input, damaged files and hostile conditions, through the real CLI: one `error:` line and
exit 2, never a traceback, never a wrong result in silence, nothing left behind."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from spanflow.cli.main import main
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner
from spanflow.training.outdir import claim_out_dir

TRAIN = synthetic_ner(30, seed=5, max_clauses=1)
FAST = ["--epochs", "1", "--max-tokens", "512", "--log-every", "0"]


def write_jsonl(path, examples):
    with open(path, "w", encoding="utf-8") as f:
        for e in examples:
            write_jsonl_record(f, e.text, e.spans)
    return str(path)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    d = tmp_path_factory.mktemp("hard")
    train = write_jsonl(d / "train.jsonl", TRAIN)
    assert main(["train", "ner", "--train", train, "--out", str(d / "run"), *FAST]) == 0
    return d, train, str(d / "run" / "model")


def fails(argv, capsys, *expect):
    rc = main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "Traceback" not in err and err.count("\n") <= 3, err
    for e in expect:
        assert e in err, err
    return err


def copy_model(src, dst):
    shutil.copytree(src, dst)
    return str(dst)


def test_jsonl_offsets_must_be_integers_and_labels_strings(tmp_path, capsys):
    cases = {
        "bool.jsonl": '{"text": "Ada Lovelace", "entities": [[false, true, "PER"]]}',
        "label.jsonl": '{"text": "Ada Lovelace", "entities": [[0, 3, 7]]}',
        "str.jsonl": '{"text": "Ada Lovelace", "entities": [["0", 3, "PER"], [4, 12, "PER"]]}',
        "digits.jsonl": '{"text": "Ada Lovelace", "entities": [[0, ' + "9" * 5000 + ', "PER"]]}',
        "deep.jsonl": '{"text": "Ada", "entities": ' + "[" * 50000 + "}",
    }
    for name, line in cases.items():
        f = tmp_path / name
        f.write_text('{"text": "ok", "entities": []}\n' + line + "\n")
        err = fails(["train", "ner", "--train", str(f), "--out", str(tmp_path / "o")], capsys, f"{name}:2:")
        assert len(err) < 400
    assert not (tmp_path / "o").exists()


def test_relation_jsonl_is_checked(tmp_path, capsys):
    ok = '{"text": "Ada lives in Oslo", "relations": [{"head": [0, 3], "type": "lives_in", "tail": [13, 17]}]}'
    cases = {
        "type.jsonl": ok.replace('"lives_in"', "7"),
        "head.jsonl": ok.replace("[0, 3]", '"Ada"'),
        "bool.jsonl": ok.replace("[0, 3]", "[false, true]"),
        "digits.jsonl": ok.replace("[13, 17]", "[13, " + "1" * 5000 + "]"),
    }
    for name, line in cases.items():
        f = tmp_path / name
        f.write_text(ok + "\n" + line + "\n")
        fails(["train", "re", "--train", str(f), "--out", str(tmp_path / "o")], capsys, f"{name}:2:")
    (tmp_path / "good.json").write_text(json.dumps([{"text": "Ada lives in Oslo",
                                                    "triple_list": [["Ada", "lives_in", "Oslo"]]}]))
    (tmp_path / "rel2id.json").write_text('[{"0": "lives_in"}, {"lives_in": 0')
    fails(["train", "re", "--train", str(tmp_path / "good.json"), "--out", str(tmp_path / "o")], capsys,
          "rel2id.json", "invalid JSON")


def test_an_error_quotes_at_most_a_short_part_of_a_long_line(tmp_path, capsys):
    f = tmp_path / "long.conll"
    f.write_text("Ada B-PER\n" + "x" * 1_000_000 + "\n")
    err = fails(["train", "ner", "--train", str(f), "--out", str(tmp_path / "o")], capsys, "long.conll:2:")
    assert len(err) < 500


def test_dev_labels_missing_from_train_are_named(tmp_path, capsys):
    train = write_jsonl(tmp_path / "t.jsonl", TRAIN)
    dev = tmp_path / "d.jsonl"
    dev.write_text('{"text": "Zork met Quux", "entities": [[0, 4, "ALIEN"], [9, 13, "ROBOT"]]}\n')
    assert main(["train", "ner", "--train", train, "--dev", str(dev), "--out", str(tmp_path / "o"), *FAST]) == 0
    out = capsys.readouterr().out
    assert "none of the --dev labels occurs in --train (ALIEN, ROBOT)" in out


def test_names_alike_but_for_case_or_space_and_one_unseen_dev_label_are_said():
    from spanflow.training.setup import warn_alike, warn_unseen

    said = []
    warn_alike({"PER", "Per", "LOC", "ORG ", "ORG", "MISC"}, "labels", said.append)
    warn_alike({"PER", "LOC"}, "labels", said.append)
    assert said == ["warning: labels that differ only in case or white space are learned as labels of their own: "
                    "'ORG' and 'ORG '; 'PER' and 'Per'"]
    warn_unseen(["LOC", "PER"], {"LOC", "ORG"}, "labels", said.append)
    warn_unseen(["LOC", "PER"], {"LOC", "ORG", "X"}, "labels", said.append)
    assert said[1:] == ["warning: 1 --dev label never occurs in --train and counts as a miss: ORG",
                        "warning: 2 --dev labels never occur in --train and count as misses: ORG, X"]


def test_damaged_model_directories_are_one_error_line(trained, tmp_path, capsys):
    d, train, model = trained
    pred = ["--input", train, "--output", str(tmp_path / "p.jsonl")]

    m = copy_model(model, tmp_path / "newer")
    cfg = json.loads(open(os.path.join(m, "spanflow.json")).read())
    json.dump({**cfg, "format_version": 99}, open(os.path.join(m, "spanflow.json"), "w"))
    fails(["predict", "--model", m, *pred], capsys, "newer spanflow", "format 99")

    for name, content in (("labels", {**cfg, "labels": []}), ("array", [1, 2])):
        m = copy_model(model, tmp_path / name)
        json.dump(content, open(os.path.join(m, "spanflow.json"), "w"))
        fails(["predict", "--model", m, *pred], capsys, "spanflow.json")

    for rel in ("head.safetensors", "encoder/model.safetensors", "encoder/tokenizer.json"):
        m = copy_model(model, tmp_path / rel.replace("/", "_"))
        f = os.path.join(m, rel)
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
        fails(["predict", "--model", m, *pred], capsys, "truncated or corrupt")

    m = copy_model(model, tmp_path / "no_tokenizer_config")  # tokenizer.json alone names no special token
    os.remove(os.path.join(m, "encoder", "tokenizer_config.json"))
    fails(["predict", "--model", m, *pred], capsys, "names no CLS, SEP or PAD token", "tokenizer_config.json")
    fails(["train", "ner", "--train", train, "--model", os.path.join(m, "encoder"), "--out", str(tmp_path / "o")],
          capsys, "names no CLS, SEP or PAD token")


def test_pickled_weights_are_refused_with_how_to_convert(tmp_path, capsys):
    from spanflow.models.encoder import build_tiny

    enc, tok = build_tiny([e.text for e in TRAIN], hidden=16, embedding=16, bigram_buckets=101)
    import torch

    enc.save_pretrained(tmp_path / "enc")
    tok.save_pretrained(tmp_path / "enc")
    os.remove(tmp_path / "enc" / "model.safetensors")  # the weights as a pickle only, as older tools wrote them
    torch.save(enc.state_dict(), tmp_path / "enc" / "pytorch_model.bin")
    train = write_jsonl(tmp_path / "t.jsonl", TRAIN)
    fails(["train", "ner", "--train", train, "--model", str(tmp_path / "enc"), "--out", str(tmp_path / "o")],
          capsys, "pytorch_model.bin", "safe_serialization=True")
    # a token classifier is converted by its own class: AutoModel would save its encoder alone
    cfg = json.loads((tmp_path / "enc" / "config.json").read_text())
    (tmp_path / "enc" / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForTokenClassification"],
                                                              "id2label": {"0": "O", "1": "B-PER", "2": "I-PER"}}))
    fails(["train", "ner", "--train", train, "--model", str(tmp_path / "enc"), "--out", str(tmp_path / "o")],
          capsys, "from transformers import BertForTokenClassification; BertForTokenClassification.from_pretrained(")


def test_a_truncated_checkpoint_is_one_error_line(trained, tmp_path, capsys):
    d, train, _ = trained
    out = tmp_path / "run"
    assert main(["train", "ner", "--train", train, "--out", str(out), *FAST]) == 0
    capsys.readouterr()
    f = out / "checkpoint" / "trainer.pt"
    with open(f, "r+b") as fh:
        fh.truncate(os.path.getsize(f) // 3)
    fails(["train", "ner", "--train", train, "--out", str(out), "--resume", "--epochs", "2", "--max-tokens", "512"],
          capsys, "checkpoint", f"unreadable: {f} (", "remove the checkpoint to start over, or run without --resume")


def test_out_that_cannot_be_used_is_refused_before_training(trained, tmp_path, capsys):
    _, train, _ = trained
    (tmp_path / "file").write_text("x")
    fails(["train", "ner", "--train", train, "--out", str(tmp_path / "file"), *FAST], capsys, "is a file")
    if os.geteuid() == 0:
        unwritable = "/proc/self/fdinfo"  # root writes through file modes, not into /proc
    else:
        os.chmod(tmp_path, 0o500)
        unwritable = str(tmp_path / "ro")
    t0 = time.monotonic()
    fails(["train", "ner", "--train", train, "--out", unwritable, *FAST], capsys, "cannot write to --out")
    assert time.monotonic() - t0 < 10  # before any training
    os.chmod(tmp_path, 0o700)


def test_two_runs_cannot_share_an_out_dir(trained, tmp_path, capsys):
    _, train, _ = trained
    out = str(tmp_path / "busy")
    with claim_out_dir(out):
        fails(["train", "ner", "--train", train, "--out", out, *FAST], capsys, "another run", str(os.getpid()))
    assert main(["train", "ner", "--train", train, "--out", out, *FAST]) == 0  # free again


def test_a_failed_run_removes_the_out_dir_it_created(trained, tmp_path, capsys):
    _, train, _ = trained
    out = tmp_path / "new"
    fails(["train", "ner", "--train", train, "--out", str(out), "--max-tokens", "8"], capsys, "--max-tokens")
    assert not out.exists()
    out.mkdir()
    (out / "mine.txt").write_text("keep")
    fails(["train", "ner", "--train", train, "--out", str(out), "--max-tokens", "8"], capsys)
    assert (out / "mine.txt").read_text() == "keep"


def test_outputs_and_model_dirs_follow_the_umask(trained, tmp_path, capsys):
    _, train, model = trained
    old = os.umask(0o022)
    try:
        assert main(["predict", "--model", model, "--input", train, "--output", str(tmp_path / "p.jsonl")]) == 0
        assert main(["train", "ner", "--train", train, "--out", str(tmp_path / "run"), *FAST]) == 0
    finally:
        os.umask(old)
    assert os.stat(tmp_path / "p.jsonl").st_mode & 0o777 == 0o644
    for p in ("run/model", "run/checkpoint", "run/model/encoder"):
        assert os.stat(tmp_path / p).st_mode & 0o777 == 0o755, p


def _written(paths) -> bool:
    """Whether any of `paths` holds bytes (one removed meanwhile holds none)."""
    sizes = []
    for p in paths:
        try:
            sizes.append(p.stat().st_size)
        except FileNotFoundError:
            pass
    return any(sizes)


def test_predict_cleans_up_after_sigterm_and_after_a_killed_run(trained, tmp_path):
    _, train, model = trained
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".predict-{int(dead.stdout)}-abc.jsonl"  # what a SIGKILLed run leaves
    stale.write_text("{}\n")
    big = tmp_path / "big.txt"
    big.write_text("\n".join([e.text for e in TRAIN] * 3000) + "\n")
    out = tmp_path / "p.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "spanflow", "predict", "--model", model, "--input", str(big),
                             "--output", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not _written([tmp_path / "p.jsonl.partial"]):
        time.sleep(0.05)  # polls for the event: records in the run's partial output
    assert not stale.exists()  # removed as the run began: its process is gone
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "terminated; the same command with --resume goes on from the last records written"
    assert list(tmp_path.glob(".predict-*")) == [] and not out.exists()  # the journal and the partial file stay
    assert (tmp_path / "p.jsonl.predict.json").exists()


def test_a_window_that_cannot_work_is_one_error_line(trained, tmp_path, capsys):
    _, train, model = trained
    out = ["--input", train, "--output", str(tmp_path / "p.jsonl")]
    fails(["predict", "--model", model, *out, "--max-length", "2"], capsys, "--max-length must be at least 8")
    fails(["evaluate", "--model", model, "--data", train, "--stride", "500"], capsys, "--stride")
    # a stride past the trained window is refused from spanflow.json, before the weights load and the
    # precision is checked (their runtime line)
    for argv in (["predict", "--model", model, *out], ["evaluate", "--model", model, "--data", train]):
        err = fails([*argv, "--stride", "500"], capsys, "--stride must be between 0 and half the window's")
        assert "runtime:" not in err, err
        err = fails([*argv, "--max-length", "100000"], capsys, "--max-length must be between 8 and the model's limit")
        assert "runtime:" not in err, err


SERVE_LOADING_FOREVER = """
import sys, threading
from spanflow.cli import main as cli, serve
def load_services(a):
    print("loading", flush=True)
    threading.Event().wait()  # a load or compile that has not ended when the signal comes
serve.load_services = load_services
sys.argv = ["spanflow", "serve", "--model", "m", "--port", sys.argv[1]]
sys.exit(cli.main())  # as the command line calls it
"""


def test_sigterm_while_serve_loads_its_models_ends_the_process_now(tmp_path):
    """The model thread's work (a load, a compile) is not waited for: the process would otherwise
    end only when that work does, past an orchestrator's grace period."""
    pytest.importorskip("uvicorn")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVE_LOADING_FOREVER, str(port)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "loading"  # on the model thread now
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)  # the load never ends: only a prompt exit gets here
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == "terminated"


def _get(port: int, path: str) -> str:
    import http.client

    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        c.request("GET", path)
        return c.getresponse().read().decode()
    finally:
        c.close()


def test_sigterm_lets_a_request_whose_body_is_still_coming_end_in_its_own_status(trained):
    """The drain waited --timeout alone: a body still arriving (bounded by the longer --read-timeout)
    was cancelled into a bare text 500 and a traceback in the log, the exit still 143."""
    pytest.importorskip("uvicorn")
    import socket

    _, _, model = trained
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "spanflow.cli.main", "serve", "--model", model, "--port", str(port),
                             "--timeout", "0.5", "--read-timeout", "2"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        while "serving" not in proc.stdout.readline():  # the port is open from this line
            assert proc.poll() is None, proc.stderr.read()
        with socket.create_connection(("127.0.0.1", port), timeout=30) as c:
            c.sendall(b"POST /v1/ner HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"texts\": [")
            deadline = time.monotonic() + 60
            while "spanflow_requests_in_flight 1.0" not in _get(port, "/metrics"):  # the handler reads its body
                assert proc.poll() is None and time.monotonic() < deadline
            proc.send_signal(signal.SIGTERM)
            answer = b""
            while part := c.recv(4096):  # to the end: the server closes the connection after its answer
                answer += part
            answer = answer.decode()
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert answer.startswith("HTTP/1.1 408") and '"error"' in answer, answer
    assert proc.returncode == 143 and "Traceback" not in err, err


def test_a_dev_set_with_no_gold_is_refused_before_training(tmp_path, capsys):
    """A dev file of texts alone (or of a key the reader does not take) scored 0 every epoch and
    picked the best model by it, then advised a higher --lr."""
    train = write_jsonl(tmp_path / "t.jsonl", TRAIN)
    dev = tmp_path / "d.jsonl"
    dev.write_text('{"text": "Zork met Quux"}\n{"text": "nobody here", "entities": []}\n')
    err = fails(["train", "ner", "--train", train, "--dev", str(dev), "--out", str(tmp_path / "o"), *FAST], capsys,
                "the --dev data holds no entities (no gold to score against)")
    assert "Traceback" not in err and "triple_list" not in err and not (tmp_path / "o").exists()  # before the run
    re_train = tmp_path / "re.jsonl"
    re_train.write_text(json.dumps({"text": "Ada was born in Paris", "relations": [
        {"head": [0, 3], "type": "born_in", "tail": [16, 21]}]}) + "\n")
    re_dev = tmp_path / "re_dev.json"  # CasRel JSON whose triple lists are all empty
    re_dev.write_text(json.dumps([{"text": "Bob was born in Rome", "triple_list": []}, {"text": "Nothing here"}]))
    fails(["train", "re", "--train", str(re_train), "--dev", str(re_dev), "--out", str(tmp_path / "r"), *FAST], capsys,
          'the --dev data holds no triples (no gold to score against)')
    assert not (tmp_path / "r").exists()


STOP_TWICE = """
import os, signal
from spanflow.cli.main import Terminated, _install_handlers
_install_handlers(True)  # the command line's handlers
try:
    os.kill(os.getpid(), signal.SIGHUP)  # a closed terminal
    print("not stopped")
except Terminated as e:
    # the clean-up runs now: a second signal (the terminal's Ctrl-C, a scheduler's SIGTERM) is ignored
    os.kill(os.getpid(), signal.SIGINT)
    os.kill(os.getpid(), signal.SIGTERM)
    print("stopped by", e.signum, "and the clean-up ran to its end")
"""


STOP_TOGETHER = """
import os, signal
# blocked before any thread starts, so in every thread: both wait until the main thread takes them
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
from spanflow.cli.main import _install_handlers
_install_handlers(True)
os.kill(os.getpid(), signal.SIGINT)  # two Ctrl-C's, or a group's TERM and the terminal's INT, that
os.kill(os.getpid(), signal.SIGTERM)  # arrive before Python runs the first one's handler
try:
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    sum(range(1000))
    print("not stopped")
except KeyboardInterrupt:
    sum(range(1000))  # the second one's handler runs here, in the clean-up
    print("stopped once, the clean-up ran to its end")
"""


def test_two_stops_that_arrive_together_are_one_stop():
    """The first stop made the handlers SIG_IGN, and CPython then reported an OSError ("Signal 15
    ignored due to race condition") for the second, already waiting: a traceback on stderr."""
    r = subprocess.run([sys.executable, "-c", STOP_TOGETHER], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "stopped once, the clean-up ran to its end", r.stdout + r.stderr
    assert "race condition" not in r.stderr


def test_a_stop_is_handled_once_and_sighup_stops_as_sigterm_does():
    """SIGHUP killed a command outright (no clean-up: --out's lock left); and a second signal while
    the first was being handled raised again inside the clean-up, as a traceback."""
    r = subprocess.run([sys.executable, "-c", STOP_TWICE], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == f"stopped by {int(signal.SIGHUP)} and the clean-up ran to its end", \
        r.stdout + r.stderr
