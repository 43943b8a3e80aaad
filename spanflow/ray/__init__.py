"""spanflow's bulk jobs on Ray Data (the optional extra `ray`): `spanflow predict/embed ... --ray`,
and `Predictor`, a model stage for a Ray Data pipeline of one's own (`Dataset.map_batches`).

Nothing here is imported by `import spanflow`; Ray itself is imported only when a job runs.
The pieces: source.py (what is read, and by whom), stages.py (tokenizing and model stages, the
job's tally), resources.py (the actor pool), output.py (the directory of Parquet files),
job.py (the pipeline: read, tokenize, chunks of the single-process job's size, model, write),
cli.py (the flags and the summary line), predictor.py (the model stage on its own).
"""
__all__ = ["Predictor"]


def __getattr__(name: str):
    if name == "Predictor":  # on first use: the commands import this package's cli.py to parse flags
        from spanflow.ray.predictor import Predictor

        return Predictor
    raise AttributeError(f"module 'spanflow.ray' has no attribute {name!r}")
