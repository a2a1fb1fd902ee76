#!/usr/bin/env bash
# The device checks for a lent GPU, in one short run (see the device tool's README): the CUDA-only
# tests, the reference bench on CUDA (CUDA graphs, fp16 + GradScaler, pinned prefetch ring), the
# single-GPU NCCL path (one launched rank, DDP), and diagnose/tune on the GPU (the step's parts
# and the optimizer remedy too). Everything lands in
# $OUT; each step has its own time limit so one slow step cannot eat the whole lease (the limits add
# up to 570 s: under one device call's 600 s; give the call timeout_s=600).
#
#   OUT=/tmp/gpu PYTHONPATH=src bash benchmarks/gpu_check.sh          # on the device machine
#   GPU_CHECK_DRY=1 bash benchmarks/gpu_check.sh                      # here: print the steps only
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/looptune-gpu-check}
export PYTHONPATH=${PYTHONPATH:-src}
for cand in "${LOOPTUNE_DATA:-}" shared/data/mnist ../shared/data/mnist; do
  if [ -n "$cand" ] && [ -d "$cand" ]; then export LOOPTUNE_DATA=$cand; break; fi
done
mkdir -p "$OUT"

step() {  # step NAME SECONDS COMMAND...: run with a limit, keep its output and exit code
  local name=$1 limit=$2; shift 2
  echo "== $name (limit ${limit}s): $*" | tee -a "$OUT/steps.txt"
  if [ -n "${GPU_CHECK_DRY:-}" ]; then return 0; fi
  local t0=$SECONDS
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s" | tee -a "$OUT/steps.txt"
  tail -n 25 "$OUT/$name.log"
}

step env 30 bash -c 'nvidia-smi; python -c "import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.version.cuda)"; echo LOOPTUNE_DATA=$LOOPTUNE_DATA'
step cuda-tests 110 python -m pytest -q -x -m "not integration" tests/engine tests/data/test_prefetch.py tests/data/test_augment.py tests/data/test_jpeg.py tests/bench/test_runner.py tests/tune/test_batch.py tests/dist/test_launch_and_ddp_unit.py -rs
step bench-cuda 105 python -m looptune bench mnist --device cuda --epochs 5 \
  --recipes seed-baseline,seed-pinned,tensorized,device,fast --json "$OUT/bench.json" --report "$OUT/bench-report"
step switches-fp16 35 python -m looptune bench mnist --device cuda --epochs 5 --recipes device \
  --set step.precision=fp16 --json "$OUT/fp16.json"
step nccl-1rank 75 python -m torch.distributed.run --standalone --nproc_per_node 1 -m looptune bench mnist \
  --device cuda --epochs 5 --recipes device,fast --json "$OUT/nccl1.json"
step diagnose-baseline 45 python -m looptune diagnose --json "$OUT/diag.json" examples/mnist_tutorial.py --data "$LOOPTUNE_DATA"
step diagnose-pinned 35 python -m looptune diagnose --json "$OUT/diag-pin.json" examples/mnist_tutorial.py --data "$LOOPTUNE_DATA" --workers 8 --pin
step tune-batch 45 python -m looptune tune batch-size --workload mnist-mlp --data "$LOOPTUNE_DATA" --device cuda --budget-s 40 --json "$OUT/tune-batch.json"
# the step's parts on CUDA, AdamW's foreach update replayed against fused (synchronized), and the
# fused remedy rerun with loss parity
step diagnose-update 40 python -m looptune diagnose --steps 40 --verify-kind optimizer \
  --json "$OUT/diag-update.json" tests/diagnose/scripts/update_heavy.py
# issue 33: a folder of JPEGs on the GPU: the per-sample CPU decode, decoded once (packed), and
# decoded on the GPU by nvJPEG (gpu-decode: torchvision.io.decode_jpeg(device='cuda')), warm and cold
step images-gpu 50 python benchmarks/images.py --data "$LOOPTUNE_DATA" --device cuda --train 1500 \
  --test 300 --epochs 2 --rounds 1 --recipes baseline,workers,packed,gpu-decode --json "$OUT/images.json"
echo "results in $OUT"
