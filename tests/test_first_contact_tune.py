"""`spanflow tune --budget-seconds N` holds the whole command: what the set-up took is said up front,
the sweep's runs share what is left, and runs that would end past it are left out, said in one line."""
from spanflow.data.formats.jsonl import write_jsonl_record
from spanflow.data.synthetic import synthetic_ner
from spanflow.tuning import timing
from spanflow.tuning.sweep import sweep


def step_ms_of_budget(b: int, L: int) -> dict:
    """Figures of a run whose steps take b/10 ms: 16384 tokens, 1.6 s a step."""
    return {"real_tokens_per_s": float(b), "padded_tokens_per_s": float(b), "padding_efficiency": 1.0,
            "latency_p50_ms": b / 10, "latency_p95_ms": b / 10, "peak_memory_bytes": b, "gpu_util": None,
            "quality": None}


def stopped_clock() -> float:
    """A clock that does not move: the plan is decided by the figures alone, not by this machine."""
    return 100.0


def test_runs_that_would_end_past_the_deadline_are_left_out_and_said():
    said = []
    budgets = [256, 512, 1024, 2048, 4096, 8192]
    points = sweep(step_ms_of_budget, budgets, [128], log_fn=said.append, repeats=2,
                   deadline=stopped_clock() + 1.0, per_run=0.0, clock=stopped_clock)
    # four steps of 2048 tokens (0.8 s) fit in the second left, four of 4096 (1.6 s) do not
    assert [p.max_tokens for p in points] == [256, 512, 1024, 2048]
    assert said[0] == ("out of --budget-seconds: max_tokens 4096, 8192 not measured (a larger --budget-seconds "
                       "measures them)")


def test_a_deadline_already_past_still_measures_each_length_once():
    said = []
    points = sweep(step_ms_of_budget, [256, 512], [64, 128], log_fn=said.append, repeats=2,
                   deadline=stopped_clock() - 1.0, per_run=0.5, clock=stopped_clock)
    assert [(p.max_tokens, p.max_length, len(p.real_tokens_per_s_runs)) for p in points] == [(256, 64, 1),
                                                                                              (256, 128, 1)]
    assert "max_tokens 512 at max_length 64, 512 at max_length 128 not measured" in said[0]
    assert "2 points measured fewer than 2 times" in said[0]


def test_the_set_up_is_said_up_front_and_a_compile_that_cannot_fit_is_left_out():
    said = []
    plan = timing.plan_time(timing.TimeBudget(15, stopped_clock() - 5.0, clock=stopped_clock), 12, compare=True,
                            log=said.append)
    assert not plan.compare and said[0].startswith("backend comparison left out: compiling the encoder takes about 30 s")
    assert said[0].endswith("(--budget-seconds 70 compares it)")
    # 5 s of set-up before the call, on the stopped clock: the line is the budget's arithmetic, exactly
    assert said[1] == ("time: 5.0 s of --budget-seconds 15 went to starting, loading the model and preparing "
                       "the sample (not cut by the budget); up to 12 runs share the 8 s left, at most 0.7 s each")
    assert plan.deadline - stopped_clock() <= 8.5
    roomy = timing.plan_time(timing.TimeBudget(120, stopped_clock() - 5.0, clock=stopped_clock), 12, compare=True,
                             log=said.append)
    assert roomy.compare and said[-1].endswith(", then about 30 s to compile the encoder")


class TickingClock:
    """A clock that moves `tick` seconds each time it is read, whatever this machine's speed: a probe
    step reads it a fixed number of times, so time passes with the steps taken, never otherwise."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_tune_ends_within_its_budget(tmp_path):
    from spanflow.tuning.tune import tune

    data = tmp_path / "train.jsonl"
    with open(data, "w") as f:
        for e in synthetic_ner(64, seed=3):
            write_jsonl_record(f, e.text, e.spans)
    said, clock = [], TickingClock(0.1)
    prof = tune(task="ner", model="tiny", data=str(data), mode="train", budget_seconds=5, sample=64, plot=False,
                device="cpu", precision="fp32", out=str(tmp_path), log_fn=said.append, clock=clock,
                max_lengths=[64], budgets=[256, 512, 1024, 2048])
    # no more runs than the budget's clock holds: a sweep that ignored its deadline ran all eight to 6.2 s
    assert clock.now <= 5 and prof["best"] is not None
    assert any(x.startswith("out of --budget-seconds: ") for x in said)
    assert any(x.startswith("time: ") for x in said) and said[-1].startswith("tune took ")


def test_a_profiles_budget_below_the_datas_longest_text_is_raised_not_refused(tmp_path, capsys):
    """tune measures on a sample (512 texts): where the data holds a longer text than any sampled,
    train with --profile stopped on `--max-tokens 256 is below the longest training window` (a flag
    never typed). A measured budget is raised to hold it, with a note; a number given is refused."""
    import json

    from spanflow.cli.main import main

    data = tmp_path / "train.jsonl"
    with open(data, "w", encoding="utf-8") as f:
        for e in synthetic_ner(12, seed=1, max_clauses=1):
            write_jsonl_record(f, e.text, e.spans)
        long = " ".join(["Ann met Bob in Paris ."] * 12)  # about 72 tokens
        write_jsonl_record(f, long, [(0, 3, "PER")])
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"task": "ner", "mode": "train", "best": {"max_tokens": 32, "max_length": 16}}))
    run = ["train", "ner", "--train", str(data), "--epochs", "1", "--log-every", "0"]
    assert main([*run, "--out", str(tmp_path / "a"), "--profile", str(profile)]) == 0
    out = capsys.readouterr().out
    assert "note: max_tokens 32, measured on a sample of shorter texts, is below the longest training item," in out
    used = json.loads((tmp_path / "a" / "train_options.json").read_text())["max_tokens"]
    assert used > 32 and f"raised to {used}, so that it fits in a batch" in out
    assert main([*run, "--out", str(tmp_path / "b"), "--max-tokens", "32"]) == 2
    assert f"error: --max-tokens 32 is below the longest training window, {used} tokens" in capsys.readouterr().err
