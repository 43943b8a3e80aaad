"""DDP on CPU with gloo: 2 real processes against single-process training on the same batches."""
import json
import os
import shutil
import sys
import socket
import signal
import time

import pytest
import torch
import torch.multiprocessing as mp

from spanflow.data.synthetic import synthetic_ner
from spanflow.training.distributed import (all_sum, broadcast, exit_now, gather, init_from_env, shard_gather,
                                           shutdown)
from spanflow.training.loop import TaskHooks, train_loop
from spanflow.training.plan import epoch_plan
from spanflow.training.options import TrainOptions
from spanflow.runtime.policy import resolve_policy

OPTS = dict(epochs=2, lr=3e-3, max_tokens=200, seed=3, patience=0, log_every=0, warmup_ratio=0.1)
N_TEXTS = 37


def setup_task(head="softmax"):
    """A tiny NER model without dropout (so runs compare exactly) and its windows."""
    from spanflow.models.encoder import build_tiny
    from spanflow.tasks.ner import NerModel
    from spanflow.tasks.ner.features import make_collate, ner_loss, prepare_windows, window_targets

    data = synthetic_ner(N_TEXTS, seed=11, max_clauses=2)
    enc, tok = build_tiny([e.text for e in data], hidden=32, embedding=32, bigram_buckets=1009, seed=0)
    nm = NerModel(encoder=enc, tokenizer=tok, labels=sorted({s[2] for e in data for s in e.spans}), limit=64,
                  policy=resolve_policy("fp32", "cpu"), head_type=head)
    torch.manual_seed(0)
    nm.module.head.proj.reset_parameters()
    for m in nm.module.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    windows = prepare_windows(data, tok, {lab: i for i, lab in enumerate(nm.id2label)}, max_length=64, stride=8)
    hooks = TaskHooks(collate=make_collate(tok.pad_token_id), loss_fn=ner_loss, evaluate=None,
                      save_model=lambda path: None, targets=window_targets)
    return nm, windows, hooks


def _join(rank, world, port):
    """Join a gloo group as torchrun would describe it in the environment."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank), SPANFLOW_DEVICE="cpu")
    torch.set_num_threads(1)
    return init_from_env()


def _record_peak_measurements(path):
    """Write when this process measured the CPU's matmul peak (monotonic clock: one for all processes)."""
    from spanflow.monitor import device

    measure = device._matmul_rate
    os.makedirs(os.path.dirname(path), exist_ok=True)

    def timed(*a):
        t0 = time.monotonic()
        rate = measure(*a)
        with open(path, "a") as f:
            f.write(json.dumps([t0, time.monotonic()]) + "\n")
        return rate

    device._matmul_rate = timed


class _Bar:
    """A terminal's progress bar as the loop sees it, one second old whenever asked: the rate it is
    given is the tokens it counts; written to OUT/bar.json as the loop sets it."""

    format_dict = {"elapsed": 1.0}

    def __init__(self, out):
        self.out, self.shown = out, []

    def update(self, n):
        pass

    def set_postfix(self, **kw):
        self.shown.append(kw["tok_s"])
        with open(os.path.join(self.out, "bar.json"), "w") as f:
            json.dump(self.shown, f)

    def close(self):
        pass


def _with_bar(out, rank=0):
    """The loop's progress bar on rank 0 as on a terminal (_Bar), none on the others."""
    from spanflow.training import loop

    loop.progress_bar = lambda r: _Bar(out) if rank == 0 else None


def _worker(rank, world, port, out, extra):
    d = _join(rank, world, port)
    _record_peak_measurements(os.path.join(out, f"peak_measured.{rank}"))
    extra = dict(extra)
    if extra.pop("bar", False):
        _with_bar(out, rank)
    head = extra.pop("head", "softmax")
    _sparse_below(extra.pop("vocab_rows", None))
    nm, windows, hooks = setup_task(head)
    opts = TrainOptions(**{**OPTS, **extra})
    if opts.resume:  # the model weights come from the checkpoint, as train_ner does
        from spanflow.tasks.ner import NerModel

        nm.module.load_state_dict(NerModel.load(os.path.join(out, "checkpoint", "model"), device="cpu")
                                  .module.state_dict())
    hooks.save_model = nm.save if rank == 0 else (lambda p: None)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=out, log=_log_to(out, rank), dist=d,
               weights=_weights(nm, windows, opts))
    if rank == 0:
        torch.save({k: v.clone() for k, v in nm.module.state_dict().items()}, os.path.join(out, "params.pt"))
    shutdown()
    exit_now(0)  # as spanflow's CLI leaves a rank: no interpreter teardown for gloo to trip on


def _log_to(out, rank: int = 0):
    """Rank 0's log lines into OUT/log.txt (the lines a user reads)."""
    def log(line: str) -> None:
        if rank == 0:
            with open(os.path.join(out, "log.txt"), "a") as f:
                f.write(line + "\n")
    return log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ddp(out, **extra):
    mp.spawn(_worker, args=(2, free_port(), str(out), extra), nprocs=2, join=True)
    return torch.load(os.path.join(out, "params.pt"))


def _weights(nm, windows, opts):
    from spanflow.batching.sampling import rarity_weights
    from spanflow.tasks.ner.features import window_kinds

    return rarity_weights(window_kinds(windows, nm.id2label), opts.oversample) if opts.oversample else None


def _sparse_below(rows):
    """Tables of at least `rows` rows take sparse gradients (training/optim.py), None: as shipped."""
    if rows is not None:
        from spanflow.training import optim

        optim.VOCABULARY_ROWS, optim.VOCABULARY_NAMES = rows, None


def single_process(out, **extra):
    if extra.pop("bar", False):
        _with_bar(str(out))
    head = extra.pop("head", "softmax")
    nm, windows, hooks = setup_task(head)
    opts = TrainOptions(**{**OPTS, **extra})
    os.makedirs(out, exist_ok=True)
    train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(out), log=_log_to(out),
               plan_world=2, weights=_weights(nm, windows, opts))
    return nm.module.state_dict()


def assert_same(a, b):
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5, msg=k)


def reported_tokens(out) -> list[tuple[int, int]]:
    """(real, padded) tokens of each period in a run's train_report.jsonl."""
    with open(os.path.join(out, "train_report.jsonl")) as f:
        reps = [json.loads(x) for x in f]
    return [(round(r["real_tokens_per_s"] * r["wall_s"]), round(r["padded_tokens_per_s"] * r["wall_s"]))
            for r in reps]


@pytest.mark.slow
def test_ddp_equals_single_process_and_uneven_tail_does_not_hang(tmp_path):
    _, windows, _ = setup_task()
    plans = [epoch_plan([len(w) for w in windows], TrainOptions(**OPTS), e, world=2) for e in range(2)]
    assert any(mb == [] for plan in plans for step in plan for mb in step), "data must leave a rank a short tail"
    for plan in plans:  # the two shards are disjoint and complete
        r0 = [i for step in plan for mb in step[0::2] for i in mb]
        r1 = [i for step in plan for mb in step[1::2] for i in mb]
        assert not set(r0) & set(r1) and sorted(r0 + r1) == list(range(len(windows)))
    ddp = run_ddp(tmp_path / "ddp")  # finishing at all shows no rank waited forever
    spans = sorted(json.loads(x) for r in (0, 1) for x in open(tmp_path / "ddp" / f"peak_measured.{r}"))
    assert len(spans) == 2 and spans[0][1] <= spans[1][0], spans  # the ranks measured the peak one at a time
    assert_same(ddp, single_process(tmp_path / "single"))
    init = setup_task()[0].module.state_dict()
    assert any(not torch.allclose(init[k], ddp[k]) for k in init)  # it trained
    # the report counts both ranks' tokens: every window once an epoch, as one process would
    want = [(sum(len(windows[i]) for step in plan for mb in step for i in mb),
             sum(max(len(windows[i]) for i in mb) * len(mb) for step in plan for mb in step if mb)) for plan in plans]
    assert reported_tokens(tmp_path / "ddp") == reported_tokens(tmp_path / "single") == want
    assert want[0][0] == sum(len(w) for w in windows)


def step_losses(out) -> list[float]:
    return [float(line.split(" loss ")[1].split()[0]) for line in open(os.path.join(out, "log.txt"))
            if line.startswith("step ") and " loss " in line]


@pytest.mark.slow
def test_ddp_logs_the_global_loss_as_one_process_would(tmp_path):
    """Each rank holds its share of a step's loss; the lines print their sum, not rank 0's share."""
    run_ddp(tmp_path / "ddp", log_every=3)
    single_process(tmp_path / "single", log_every=3)
    ddp, one = step_losses(tmp_path / "ddp"), step_losses(tmp_path / "single")
    assert len(ddp) == len(one) >= 2
    assert ddp == pytest.approx(one, rel=1e-3)


def test_ddp_progress_bar_rate_counts_every_ranks_tokens(tmp_path, monkeypatch):
    """The bar's tokens/s is the job's: every rank's tokens, as one process training on the global batch counts."""
    from spanflow.training import loop

    run_ddp(tmp_path / "ddp", log_every=3, bar=True)
    monkeypatch.setattr(loop, "progress_bar", loop.progress_bar)  # single_process's bar is undone after the test
    single_process(tmp_path / "single", log_every=3, bar=True)
    ddp, one = (json.load(open(tmp_path / d / "bar.json")) for d in ("ddp", "single"))
    assert len(ddp) == len(one) >= 2 and ddp == one


@pytest.mark.slow
def test_ddp_crf_head_with_weighted_sampling_equals_single_process(tmp_path):
    # the CRF's transitions are used in the loss, outside DDP's forward; sampling draws the
    # same epoch on every rank from the seed
    ddp = run_ddp(tmp_path / "ddp", head="crf", oversample=1.0)
    assert_same(ddp, single_process(tmp_path / "single", head="crf", oversample=1.0))
    assert not torch.allclose(ddp["head.crf.transitions"], torch.zeros_like(ddp["head.crf.transitions"]))


@pytest.mark.slow
def test_ddp_with_sparse_table_gradients_equals_single_process(tmp_path, monkeypatch):
    # the tiny encoder's tables made sparse, as a vocabulary's is on the CPU: DDP's reducer
    # sums sparse gradients across the ranks, as one process's accumulation does
    from spanflow.training import optim

    monkeypatch.setattr(optim, "VOCABULARY_ROWS", 64)
    monkeypatch.setattr(optim, "VOCABULARY_NAMES", None)
    made = []
    real = optim.sparse_tables
    monkeypatch.setattr(optim, "sparse_tables", lambda m, d, **k: made.extend(real(m, d, **k)) or made)
    ddp = run_ddp(tmp_path / "ddp", vocab_rows=64)
    nm, windows, hooks = setup_task()
    train_loop(nm.module, windows, hooks, opts=TrainOptions(**OPTS), policy=nm.policy, out_dir=str(tmp_path / "one"),
               log=lambda s: None, plan_world=2)
    assert made, "no table took sparse gradients"
    assert_same(ddp, nm.module.state_dict())


@pytest.mark.slow
def test_ddp_resume_matches_uninterrupted(tmp_path):
    full = run_ddp(tmp_path / "full")
    run_ddp(tmp_path / "part", max_steps=3)  # stops after writing a checkpoint
    assert os.path.exists(tmp_path / "part" / "checkpoint" / "state.json")
    resumed = run_ddp(tmp_path / "part", resume=True)
    assert_same(full, resumed)


def test_without_torchrun_the_collectives_stay_in_the_process(monkeypatch):
    for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    d = init_from_env()
    calls = []
    assert shard_gather([3, 1, 2], lambda xs: calls.append(list(xs)) or [x * 2 for x in xs], d) == [6, 2, 4]
    assert calls == [[3, 1, 2]]  # one call over every item: nothing was sharded away
    assert gather("x", d) == ["x"] and broadcast("y", d) == "y" and all_sum([1.0, 2.0], d) == [1.0, 2.0]
    assert d.is_main and not torch.distributed.is_initialized()


def _collective_worker(rank, world, port, out):
    d = _join(rank, world, port)
    got = {"shard_gather": shard_gather(list(range(11)), lambda xs: [[x * x, d.rank] for x in xs], d),
           "gather": gather({"rank": d.rank}, d), "all_sum": all_sum([1.0 + d.rank, 10.0 * d.rank], d),
           "broadcast": broadcast(f"from rank {d.rank}", d), "place": [d.rank, d.world, d.is_main]}
    with open(f"{out}.{rank}", "w") as f:
        json.dump(got, f)
    shutdown()
    exit_now(0)


@pytest.mark.slow
def test_collectives_assemble_the_ranks_results_on_every_rank(tmp_path):
    mp.spawn(_collective_worker, args=(2, free_port(), str(tmp_path / "got")), nprocs=2, join=True)
    for rank in range(2):
        got = json.loads((tmp_path / f"got.{rank}").read_text())
        # each item computed once, by rank (index % 2), and back in input order
        assert got["shard_gather"] == [[x * x, x % 2] for x in range(11)]
        assert got["gather"] == [{"rank": 0}, {"rank": 1}] and got["all_sum"] == [3.0, 10.0]
        assert got["broadcast"] == "from rank 0" and got["place"] == [rank, 2, rank == 0]


def test_devices_other_than_torchruns_processes_is_refused_under_torchrun(tmp_path, monkeypatch, capsys):
    from spanflow.cli.main import main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    data = tmp_path / "t.conll"
    data.write_text("a O\n", encoding="utf-8")
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / "o"), "--devices", "3"]) == 2
    assert ("error: --devices 3: this process is one of the 2 started on this node"
            in capsys.readouterr().err)
    assert not (tmp_path / "o").exists()
    # a 1 given is no default: the run had the 2 processes, not the 1 asked for, unsaid
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / "o"), "--devices", "1"]) == 2
    assert "error: --devices 1: this process is one of the 2 started on this node" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")  # torchrun --nproc-per-node 1: no second launch inside it
    assert main(["train", "ner", "--train", str(data), "--out", str(tmp_path / "o"), "--devices", "2"]) == 2
    assert "error: --devices 2: this process is one of the 1 started on this node" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_cli_devices_relaunches_under_torchrun(tmp_path):
    """`spanflow train --devices 2` re-launches itself through torch.distributed.run (gloo on CPU)."""
    import subprocess
    import sys

    from spanflow.data.formats.jsonl import write_jsonl_record

    train = tmp_path / "train.jsonl"
    with open(train, "w") as f:
        for e in synthetic_ner(80, seed=2):
            write_jsonl_record(f, e.text, e.spans)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    dev = tmp_path / "dev.conll"  # a BIO file whose second entity opens with I-: a reader's warning
    dev.write_text("Ada B-PER\nLovelace I-PER\nworks O\n\nGrace I-PER\nworks O\n\n")
    r = subprocess.run([sys.executable, "-m", "spanflow", "train", "ner", "--train", str(train), "--dev", str(dev),
                        "--out", str(out), "--epochs", "2", "--max-tokens", "512", "--max-length", "64",
                        "--devices", "2", "--lr-scaling", "sqrt"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 processes" in r.stdout + r.stderr
    # every rank reads the file; rank 0 alone says what it found
    assert r.stderr.count("with no opening tag") == 1, r.stderr[-2000:]
    reps = [json.loads(x) for x in open(out / "train_report.jsonl")]
    assert len(reps) == 2  # rank 0 alone writes the report
    assert (out / "model" / "spanflow.json").exists()
    assert all(r_["real_tokens_per_s"] > 0 and 0 < r_["padding_efficiency"] <= 1 for r_ in reps)
    # an error every rank meets (the same data) is said once: each rank printed it
    bad = tmp_path / "bad.conll"
    bad.write_text("a O\nb\n")
    r = subprocess.run([sys.executable, "-m", "spanflow", "train", "ner", "--train", str(bad), "--out",
                        str(tmp_path / "bad"), "--devices", "2"], capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 2 and r.stderr.count("bad.conll:2: expected a token and a tag") == 1, r.stderr[-2000:]


def test_an_error_of_one_rank_is_said_once_and_named(monkeypatch, capsys):
    """Under --devices N every rank leaves its error line for the launcher, rank 0 printing its own:
    the launcher says each other line once, with its rank, before how the run stopped."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from spanflow.training import distributed as D

    folders = []

    def failed(_args):  # the ranks, as report_error runs in each
        folders.append(os.environ[D.ERRORS])
        for rank, line in ((1, "error: data.conll:2: bad"), (0, "error: data.conll:2: bad"), (1, "error: own")):
            monkeypatch.setattr(D, "job_rank", lambda r=rank: r)
            D.report_error(line, lambda x: sys.stderr.write(x + "\n"))
        raise ChildFailedError("spanflow", {1: ProcessFailure(local_rank=1, pid=12, exitcode=2, error_file=""),
                                            0: ProcessFailure(local_rank=0, pid=11, exitcode=2, error_file="")})

    monkeypatch.setattr(run, "run", failed)
    assert D.relaunch(["train", "ner"], 2) == 2
    assert capsys.readouterr().err.splitlines()[1:] == ["error: data.conll:2: bad", "rank 1: error: own"]
    assert D.ERRORS not in os.environ and not os.path.exists(folders[0])  # the launcher's folder, gone
    monkeypatch.setattr(D, "job_rank", lambda: 1)  # outside the launcher: said where it happens
    D.report_error("error: x", lambda x: sys.stderr.write(x + "\n"))
    assert capsys.readouterr().err == "error: x\n"
    monkeypatch.setenv(D.ERRORS, folders[0])  # the launcher's folder gone (a tmp cleaner): said, not lost
    D.report_error("error: y", lambda x: sys.stderr.write(x + "\n"))
    assert capsys.readouterr().err == "error: y\n"
    os.makedirs(os.path.join(folders[0], "rank1"))  # a line that cannot be left: said, with why
    D.report_error("error: z", lambda x: sys.stderr.write(x + "\n"))
    assert capsys.readouterr().err == "error: z (rank 1; not left for the launcher: Is a directory)\n"
    shutil.rmtree(folders[0])


def _auto_budget_worker(rank, world, port, out):
    """`spanflow train --max-tokens auto` on one rank of a group, its measurement of the budget
    answering by rank (as two ranks measuring side by side picked two budgets), the budget
    training takes recorded."""
    _join(rank, world, port)
    os.environ["SPANFLOW_CACHE"] = os.path.join(out, f"cache{rank}")
    from spanflow.cli.main import main
    from spanflow.tasks.ner import train as ner_train
    from spanflow.tuning import auto

    measured = []

    def measure(**kw):
        measured.append(rank)
        return {"best": {"max_tokens": 256 * (rank + 1)}, "points": []}

    auto.quick_profile = measure
    real = ner_train.train_ner

    def train_ner(*a, options, **kw):
        with open(os.path.join(out, f"budget.{rank}"), "w") as f:
            json.dump({"max_tokens": options.max_tokens, "measured": measured}, f)
        return real(*a, options=options, **kw)

    ner_train.train_ner = train_ner
    import spanflow.tasks.ner.task as ner_task
    ner_task.train_ner = train_ner
    from spanflow.data.formats.jsonl import write_jsonl_record

    data = os.path.join(out, "train.jsonl")
    if rank == 0:
        with open(data + ".tmp", "w") as f:
            for e in synthetic_ner(12, seed=2):
                write_jsonl_record(f, e.text, e.spans)
        os.replace(data + ".tmp", data)
    broadcast(None, init_from_env())  # the file is there for both
    main(["train", "ner", "--train", data, "--out", os.path.join(out, "run"), "--epochs", "1", "--max-tokens",
          "auto", "--log-every", "0"])


def test_max_tokens_auto_is_measured_by_rank_0_and_taken_by_every_rank(tmp_path):
    mp.spawn(_auto_budget_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    got = [json.load(open(tmp_path / f"budget.{r}")) for r in (0, 1)]
    assert got == [{"max_tokens": 256, "measured": [0]}, {"max_tokens": 256, "measured": []}]


def test_max_steps_writes_a_partial_report(tmp_path):
    nm, windows, hooks = setup_task()
    opts = TrainOptions(**{**OPTS, "max_steps": 2})
    summary = train_loop(nm.module, windows, hooks, opts=opts, policy=nm.policy, out_dir=str(tmp_path),
                         log=lambda s: None)
    assert not summary["completed"] and summary["global_step"] == 2
    reps = [json.loads(x) for x in open(tmp_path / "train_report.jsonl")]
    assert len(reps) == 1 and reps[0]["partial"] and reps[0]["step"] == 2
    steps = epoch_plan([len(w) for w in windows], opts, 0)[:2]  # the tokens of the two steps it ran
    assert reported_tokens(tmp_path) == [(sum(len(windows[i]) for step in steps for mb in step for i in mb),
                                          sum(max(len(windows[i]) for i in mb) * len(mb) for step in steps
                                              for mb in step))]
    state = json.loads((tmp_path / "checkpoint" / "state.json").read_text())
    assert state["global_step"] == 2 and state["epoch"] == 0  # --resume continues from there


def _eval_worker(rank, world, port, model_dir, data_path, out):
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import NerModel

    d = _join(rank, world, port)
    m = NerModel.load(model_dir, device="cpu").evaluate(read_ner(data_path), dist=d)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(m, f)
    shutdown()
    exit_now(0)  # as spanflow's CLI leaves a rank: no interpreter teardown for gloo to trip on


@pytest.mark.slow
def test_sharded_evaluation_equals_single_process(tmp_path):
    from spanflow.data.formats.jsonl import write_jsonl_record
    from spanflow.data.io import read_ner
    from spanflow.tasks.ner import NerModel, train_ner

    data = synthetic_ner(41, seed=5)
    p = tmp_path / "d.jsonl"
    with open(p, "w") as f:
        for e in data:
            write_jsonl_record(f, e.text, e.spans)
    train_ner(data, None, out_dir=str(tmp_path / "run"), log_fn=lambda s: None,
              options=TrainOptions(epochs=3, max_tokens=512, max_length=64, log_every=0))
    model_dir = str(tmp_path / "run" / "model")
    want = NerModel.load(model_dir, device="cpu").evaluate(read_ner(str(p)))
    mp.spawn(_eval_worker, args=(2, free_port(), model_dir, str(p), str(tmp_path / "m")), nprocs=2, join=True)
    for r in range(2):
        assert json.loads((tmp_path / f"m.{r}").read_text()) == json.loads(json.dumps(want))


def _launch_two(tmp_path):
    """`train ner --devices 2` on enough data to be training when a test signals its launcher;
    returns the launcher once a rank has started its steps, and the run's --out."""
    import subprocess
    import sys

    from spanflow.data.formats.jsonl import write_jsonl_record

    train = tmp_path / "train.jsonl"
    with open(train, "w") as f:
        for e in synthetic_ner(400, seed=2):
            write_jsonl_record(f, e.text, e.spans)
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "spanflow", "train", "ner", "--train", str(train), "--out", str(out),
                             "--epochs", "5000", "--max-tokens", "256", "--max-length", "64", "--log-every", "1",
                             "--devices", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    for line in proc.stdout:  # rank 0's step lines: both ranks are in the loop
        if line.startswith("step "):
            return proc, out
    raise AssertionError(f"the run ended before training: rc {proc.wait()}")


@pytest.mark.slow
@pytest.mark.parametrize("name, said", [
    ("SIGTERM", ["terminated"]),
    # a closed terminal's SIGHUP: torchrun's agent passes it on, and it killed the ranks outright,
    # leaving --out's lock; the ranks now stop as on SIGTERM, and the launcher's one line names the
    # signal (rank 0's "terminated" came before it)
    ("SIGHUP", ["stopped by SIGHUP"]),
])
def test_a_signal_to_the_launcher_stops_the_ranks_in_one_line(tmp_path, name, said):
    import signal

    sig = getattr(signal, name)
    proc, out = _launch_two(tmp_path)
    try:
        proc.send_signal(sig)
        rest = proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    lines = rest.strip().splitlines()
    assert proc.returncode == 128 + sig and "Traceback" not in rest, rest[-2000:]
    assert [x.split(";")[0] for x in lines[-len(said):]] == said, lines[-4:]
    # the launcher's line alone, not one per process, with the hint of the checkpoint the ranks left
    assert sum(x.startswith(("terminated", "stopped by")) for x in lines) == 1
    assert lines[-1].endswith(f"goes on from {out / 'checkpoint'}") or not (out / "checkpoint").exists(), lines[-1]
    assert not (out / ".lock").exists()


@pytest.mark.slow
def test_a_killed_launcher_leaves_no_rank_training(tmp_path):
    import signal
    import time

    proc, out = _launch_two(tmp_path)
    rank0 = int((out / ".lock").read_text())  # rank 0 holds --out
    proc.send_signal(signal.SIGKILL)  # as a scheduler does: the launcher cannot stop its ranks itself
    proc.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and os.path.exists(f"/proc/{rank0}") and \
            open(f"/proc/{rank0}/stat").read().split()[2] != "Z":
        time.sleep(0.1)
    alive = os.path.exists(f"/proc/{rank0}") and open(f"/proc/{rank0}/stat").read().split()[2] != "Z"
    if alive:
        os.kill(rank0, signal.SIGKILL)
    assert not alive, "rank 0 trained on after its launcher was killed"
    assert not (out / ".lock").exists()  # it stopped as on SIGTERM, releasing --out


def test_the_launchers_own_loggers_are_quiet_while_it_runs_the_ranks(monkeypatch):
    """torch's agent logs `Received 15 death signal, shutting down workers` on its own module's
    logger, whose own level would let it through a quiet parent."""
    import logging

    from torch.distributed import run

    from spanflow.training.distributed import relaunch

    agent = logging.getLogger("torch.distributed.elastic.agent.server.api")
    monkeypatch.setattr(agent, "level", logging.WARNING)  # as torch leaves it
    monkeypatch.delenv("LOGLEVEL", raising=False)
    levels = []
    monkeypatch.setattr(run, "run", lambda _args: levels.append((agent.getEffectiveLevel(), os.environ["LOGLEVEL"])))
    assert relaunch(["train", "ner"], 2) == 0
    assert levels == [(logging.CRITICAL, "CRITICAL")]  # a logger made during the launch reads LOGLEVEL
    assert agent.level == logging.WARNING and "LOGLEVEL" not in os.environ  # the caller's again after it


def test_the_ranks_time_lines_count_from_the_launchers_start(monkeypatch):
    """`train --devices N`: each rank's command counts from its launcher's start (passed in the
    environment), so the time line holds the launch too."""
    from torch.distributed import run

    from spanflow.monitor import clock
    from spanflow.training.distributed import relaunch

    seen = []
    monkeypatch.setattr(run, "run", lambda _args: seen.append(os.environ.get(clock.ENV)))
    with clock.command():
        launched = clock.current()
        assert relaunch(["train", "ner"], 2) == 0
    assert seen == [repr(launched)] and clock.ENV not in os.environ
    monkeypatch.setenv(clock.ENV, seen[0])  # in a rank, started after its launcher
    with clock.command():
        assert clock.current() == launched


@pytest.mark.parametrize("sig,word", [(signal.SIGTERM, "terminated"), (signal.SIGINT, None),
                                      (signal.SIGHUP, "stopped by SIGHUP"), (signal.SIGQUIT, "stopped by SIGQUIT")])
def test_a_signal_to_the_launcher_is_named_and_its_exit_code_returned(monkeypatch, capsys, sig, word):
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.api import SignalException

    from spanflow.training.distributed import relaunch

    def stopped(_args):
        raise SignalException(f"Process got signal: {sig}", sigval=sig)

    monkeypatch.setattr(run, "run", stopped)
    assert relaunch(["train", "ner"], 2) == 128 + int(sig)
    said = capsys.readouterr().err.splitlines()[1:]  # after the launching line
    # the launcher says how the run stopped (its ranks, told by LAUNCHED, do not: a rank cannot tell the
    # stop passed on from the user's from the agent's stop of a killed rank's survivors); Ctrl-C, which
    # a terminal sends every process of its group, rank 0 says
    assert said == ([word] if word else [])


def test_a_second_signal_while_the_launcher_stops_its_ranks_is_ignored(monkeypatch, capsys):
    """A second signal (Ctrl-C twice, a group's TERM then the terminal's INT) raised again in torch's
    wait for the ranks to stop: the launcher left with the second one's code (130 after a TERM) and
    its ranks met their parent's death in their clean-up."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing import api

    from spanflow.training.distributed import relaunch

    stops = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT]
    saved = {sig: signal.getsignal(sig) for sig in stops}

    def launcher(_args):  # torch's: its handler on each stop, which the agent's run catches to stop the ranks
        for sig in stops:
            signal.signal(sig, api._terminate_process_handler)
        try:
            signal.raise_signal(signal.SIGTERM)
        except api.SignalException:
            signal.raise_signal(signal.SIGINT)  # arrives while the ranks are stopped
            raise

    monkeypatch.setattr(run, "run", launcher)
    try:
        assert relaunch(["train", "ner"], 2) == 128 + int(signal.SIGTERM)
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    assert "Traceback" not in capsys.readouterr().err


def test_a_stop_signal_while_a_lost_peers_hint_is_read_ends_the_hint_not_the_line(monkeypatch, capsys):
    """torchrun's agent ends the survivors of a killed rank with SIGTERM, which can arrive while the
    resume hint is read: the command still ends on its one line (rank 0) or none, no traceback."""
    import torch.distributed as dist

    from spanflow.cli import doctor
    from spanflow.cli.main import Terminated, main
    from spanflow.training import distributed

    def lost(_args):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")

    hints = []

    def hint(_args):
        hints.append(1)
        raise Terminated()

    rank = [0]
    monkeypatch.setattr(doctor, "run", lost)
    monkeypatch.setattr(doctor, "after_stop", hint, raising=False)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: rank[0])
    monkeypatch.setattr(distributed, "exit_now", lambda rc: None)
    assert main(["doctor"]) == 1
    assert capsys.readouterr().err.strip() == "error: another process of this training job stopped"
    rank[0] = 1
    assert main(["doctor"]) == 1 and capsys.readouterr().err == ""
    assert hints == [1]  # rank 1 says nothing, so it reads no hint


def test_a_rank_of_the_devices_launcher_leaves_the_stop_to_the_launcher(monkeypatch, capsys):
    """The agent stops the survivors of a killed rank with SIGTERM: rank 0 said `terminated; ...
    --resume ...`, a user's stop, before the launcher's `error: rank 1 was killed by signal 9`. A
    rank cannot tell the two SIGTERMs apart; under --devices the launcher says how the run stopped."""
    import torch.distributed as dist

    from spanflow.cli import doctor
    from spanflow.cli.main import Terminated, main
    from spanflow.training import distributed

    def stopped(_args):
        raise Terminated()

    def lost(_args):
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer")

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: 0)
    monkeypatch.setattr(distributed, "exit_now", lambda rc: None)
    monkeypatch.setattr(doctor, "run", stopped)
    assert main(["doctor"]) == 143 and capsys.readouterr().err == "terminated\n"  # plain torchrun: rank 0 says it
    monkeypatch.setenv(distributed.LAUNCHED, "1")
    assert main(["doctor"]) == 143 and capsys.readouterr().err == ""
    monkeypatch.setattr(doctor, "run", lost)
    assert main(["doctor"]) == 1 and capsys.readouterr().err == ""


def test_a_lost_peer_is_one_line_from_rank_0_and_none_from_the_others(monkeypatch, capsys):
    import torch.distributed as dist

    from spanflow.cli import doctor
    from spanflow.cli.main import main
    from spanflow.training import distributed

    def lost(_args):  # what gloo raises in the backward's all-reduce when the other rank was killed
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
                           "[127.0.0.1]:45455")

    rank = [0]
    monkeypatch.setattr(doctor, "run", lost)
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_rank", lambda: rank[0])
    monkeypatch.setattr(distributed, "exit_now", lambda rc: None)  # the process would end here
    assert main(["doctor"]) == 1
    assert capsys.readouterr().err.strip() == "error: another process of this training job stopped"
    rank[0] = 1
    assert main(["doctor"]) == 1 and capsys.readouterr().err == ""

    def interrupted(_args):
        raise KeyboardInterrupt

    monkeypatch.setattr(doctor, "run", interrupted)
    assert main(["doctor"]) == 130 and capsys.readouterr().err == ""  # every rank met the Ctrl-C: rank 0 says it
    rank[0] = 0
    assert main(["doctor"]) == 130 and capsys.readouterr().err.strip() == "interrupted"
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setenv("RANK", "3")  # a cluster pod's environment outside any torchrun job: its own line stays
    assert main(["doctor"]) == 130 and capsys.readouterr().err.strip() == "interrupted"
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(doctor, "run", lost)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)  # outside a job the same error is a bug: traceback
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        main(["doctor"])


def test_a_rank_killed_by_a_signal_is_named_whichever_rank_failed_first(monkeypatch, capsys):
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from spanflow.training.distributed import relaunch

    def failed(_args):  # rank 1 killed; rank 0 then stopped on the lost peer (exit 1), and its failure came first
        raise ChildFailedError("spanflow", {0: ProcessFailure(local_rank=0, pid=11, exitcode=1, error_file=""),
                                            1: ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file="")})

    monkeypatch.setattr(run, "run", failed)
    assert relaunch(["train", "ner"], 2) == 1
    assert capsys.readouterr().err.splitlines()[1:] == ["error: rank 1 was killed by signal 9"]


def test_a_killed_rank_0_is_named_with_how_the_run_goes_on(monkeypatch, capsys, tmp_path):
    """kill -9 of rank 0 said only which rank was killed, though its checkpoint was there to resume."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from spanflow.cli.main import main
    from spanflow.training.checkpoint import STATE

    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)

    def killed(_args):  # rank 0 wrote its checkpoint, then was killed
        (out / "checkpoint" / STATE).write_bytes(b"state")
        raise ChildFailedError("spanflow", {0: ProcessFailure(local_rank=0, pid=11, exitcode=-9, error_file="")})

    monkeypatch.setattr(run, "run", killed)
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    assert main(["train", "ner", "--train", "t.conll", "--out", str(out), "--devices", "2"]) == 1
    said = capsys.readouterr().err.splitlines()[1:]
    assert said == [f"error: rank 0 was killed by signal 9; the same command with --resume goes on from "
                    f"{out / 'checkpoint'}"], said


def test_the_launcher_says_how_a_run_goes_on_after_a_ranks_error_or_stop(monkeypatch, capsys, tmp_path):
    """Its ranks say nothing of how the run stopped: a rank that failed on an error of its own (out of
    memory), or a `kill <pid>` of one rank (which stops as on SIGTERM, exit 143), ended the run without
    the resume hint, or without any line."""
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from spanflow.cli.main import main
    from spanflow.training.checkpoint import STATE

    out = tmp_path / "run"
    (out / "checkpoint").mkdir(parents=True)
    code = [2]

    def failed(_args):
        (out / "checkpoint" / STATE).write_bytes(b"state")
        raise ChildFailedError("spanflow", {1: ProcessFailure(local_rank=1, pid=12, exitcode=code[0], error_file="")})

    monkeypatch.setattr(run, "run", failed)
    for k in ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(k, raising=False)
    hint = f"; the same command with --resume goes on from {out / 'checkpoint'}"
    assert main(["train", "ner", "--train", "t.conll", "--out", str(out), "--devices", "2"]) == 2
    assert capsys.readouterr().err.splitlines()[1:] == ["the run stopped on rank 1's error" + hint]
    code[0] = 143
    assert main(["train", "ner", "--train", "t.conll", "--out", str(out), "--devices", "2"]) == 143
    assert capsys.readouterr().err.splitlines()[1:] == ["error: rank 1 was stopped by SIGTERM" + hint]


def test_the_launchers_own_stop_of_the_survivors_is_not_named_as_a_failure(monkeypatch, capsys):
    from torch.distributed import run
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from spanflow.training.distributed import relaunch

    def failed(_args):  # rank 1 killed; the agent then stopped rank 0 with SIGTERM before it met a collective
        raise ChildFailedError("spanflow", {0: ProcessFailure(local_rank=0, pid=11, exitcode=-15, error_file=""),
                                            1: ProcessFailure(local_rank=1, pid=12, exitcode=-9, error_file="")})

    monkeypatch.setattr(run, "run", failed)
    assert relaunch(["train", "ner"], 2) == 1
    assert capsys.readouterr().err.splitlines()[1:] == ["error: rank 1 was killed by signal 9"]


def test_the_launcher_shares_this_machines_cores_among_its_processes(monkeypatch, capsys):
    from torch.distributed import run

    from spanflow.training.distributed import relaunch

    seen = []
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    monkeypatch.setattr(run, "run", lambda args: seen.append(os.environ["OMP_NUM_THREADS"]))
    assert relaunch(["train", "ner"], 4) == 0
    assert seen == ["4"]  # torchrun would have set 1 a process, and said so in a banner
    assert "OMP_NUM_THREADS" not in os.environ  # for the launch only: the caller's environment is as it was
    assert capsys.readouterr().err.startswith("launching: torchrun --nproc-per-node 4 -m spanflow train ner "
                                              "(OMP_NUM_THREADS=4)")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting stays
    assert relaunch(["train", "ner"], 4) == 0 and seen[-1] == "3"
    assert "warning" not in capsys.readouterr().err  # 12 threads on 16 cores
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # 32 threads on 16 cores: said
    assert relaunch(["train", "ner"], 4) == 0 and seen[-1] == "8"
    assert ("warning: OMP_NUM_THREADS=8 for each of 4 processes is more threads than this machine's 16 cores: they "
            "wait on each other; unset it, and the launcher gives each process 4") in capsys.readouterr().err


@pytest.mark.parametrize("argv,spread", [
    (["predict", "--model", "m", "--input", "i.txt", "--output", "o.jsonl"], True),
    (["embed", "--model", "m", "--input", "i.txt", "--output", "o.npy"], True),
    (["evaluate", "--model", "m", "--data", "d.conll"], False),
])
def test_a_command_of_one_process_under_torchrun_stops_in_one_line(monkeypatch, capsys, tmp_path, argv, spread):
    """Under torchrun every rank ran predict's whole job into the same file (one of them then failed
    on the other's lock) and evaluate printed its table once per rank."""
    from spanflow.cli.main import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "job")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for rank, said in (("0", 1), ("1", 0)):  # rank 0 says it, every rank stops
        monkeypatch.setenv("RANK", rank)
        assert main(argv) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == said and all(f"spanflow {argv[0]} runs as one process" in line for line in err)
        assert all(("--ray" in line) == spread for line in err)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")  # a cluster's WORLD_SIZE alone is no torchrun job
    monkeypatch.setenv("RANK", "0")
    assert main(argv) == 2 and "runs as one process" not in capsys.readouterr().err  # the model is missing
