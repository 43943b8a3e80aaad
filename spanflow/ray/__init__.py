"""spanflow's bulk jobs on Ray Data (the optional extra `ray`): `spanflow predict/embed ... --ray`.

Nothing here is imported by `import spanflow`; Ray itself is imported only when a job runs.
The pieces: source.py (what is read, and by whom), stages.py (tokenizing and model stages, the
job's tally), resources.py (the actor pool), output.py (the directory of Parquet files),
job.py (the pipeline: read, tokenize, chunks of the single-process job's size, model, write),
cli.py (the flags and the summary line).
"""
