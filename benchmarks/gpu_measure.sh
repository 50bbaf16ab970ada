#!/usr/bin/env bash
# The SMoE networks on CUDA, as one prepared device call: correctness first, then speed.
#
#   bash benchmarks/gpu_measure.sh prepare   # here, with network: wheels the GPU image lacks -> .gpu/wheels
#   # then, through the device tool (carry [".gpu"], timeout_s 580):
#   bash benchmarks/gpu_measure.sh run       # on the GPU machine: results -> benchmarks/results and $OUT
#
# `run` does, each part under its own time limit so one slow part cannot eat the rest:
#   1. correctness, three parts side by side (none of them timed):
#      - the CUDA-only tests (tests/test_smoe_fastpath.py -k cuda)  -> cuda_tests.log;
#      - benchmarks/gpu_check.py correctness: SMoE-U-Net and SMoE ResNet, 20 Adam steps, CUDA against CPU
#        -> benchmarks/results/gpu_correctness_cuda.{json,md};
#      - `smoe train` of the SMoE ResNet (embedded world) with strategy=ddp on one GPU, 30 steps with
#        validation: no unused-parameter error -> ddp.log;
#   2. benchmarks/gpu_check.py step: SMoE ResNets and U-Nets against dense twins and wider/deeper dense
#      networks (the equal-cost dense network) -> benchmarks/results/gpu_step_cuda.{json,md};
#      and benchmarks/gpu_check.py profile: where the layer's time goes -> benchmarks/results/gpu_profile_cuda.txt;
#   3. benchmarks/smoe_layer.py --device cuda: both route_impls, fp32 and bf16, batch 64 then 16
#      -> benchmarks/results/smoe_layer_cuda.json (setup.batch, setup.dtype, time_ratio, memory_ratio);
#   4. benchmarks/resnet_step.py --device cuda at paper size (19 blocks, 128 filters), batch 64 and 16
#      -> benchmarks/results/resnet_step_cuda_b64.json, resnet_step_cuda_b16.json.
# Everything (results, logs, parts.txt with each part's exit status) is packed into $OUT/gpu_measure.tar.gz after
# every part, so a time-out keeps what was measured. Unpack it into benchmarks/results, commit with this command,
# then take the README/results numbers from them. The routing study at GPU budgets, paper size and heat need
# the GCM world packed (../shared/tools/gpu/README.md) and more device time than one call: not part of this.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu/wheels
# What the GPU image lacks (../shared/tools/gpu/README.md), zarr and numcodecs at the versions the project is
# tested with; cftime is imported by smoeweather itself; pytest for the CUDA-only tests.
PACKAGES=(zarr==3.1.6 numcodecs==0.16.6 donfig google-crc32c dask partd locket cftime bottleneck lazy-importer
          importlib-metadata tblib h5netcdf pytest pluggy iniconfig)

case "${1:-}" in
  prepare)
    mkdir -p "$WHEELS"
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --platform manylinux2014_x86_64 --dest "$WHEELS" "${PACKAGES[@]}"
    du -sh "$WHEELS"
    ;;
  run)
    SITE=${SITE:-/tmp/site}
    export PYTHONPATH="$PWD:${PYTHONPATH:-}"
    if ! python -c "import cftime, zarr" 2>/dev/null; then
      if ! ls "$WHEELS"/*.whl >/dev/null 2>&1; then
        echo "ERROR: this image lacks cftime/zarr and $WHEELS has no wheels: run '$0 prepare' here and carry .gpu" >&2
        exit 2
      fi
      python -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
      export PYTHONPATH="$PYTHONPATH:$SITE"
    fi
    DEVICE=${DEVICE:-cuda}  # DEVICE=cpu with tiny BATCHES only to check this script where there is no GPU
    if [ "$DEVICE" = cuda ] && ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
      echo "ERROR: DEVICE=cuda but torch sees no CUDA device on this machine (run this on the GPU machine)" >&2
      exit 2
    fi
    BATCHES=${BATCHES:-64 16}  # the batch-64 targets first
    OUT=${OUT:-runs/gpu_measure}  # the device tool returns only a few files: everything is packed into one
    LOGS=${LOGS:-/tmp/gpu_measure}  # gpu_measure.tar.gz in $OUT, re-packed after every part
    mkdir -p "$OUT" "$LOGS"
    pack() { cp -f benchmarks/results/*_"$DEVICE"*.* "$LOGS/" 2>/dev/null || true
             tar czf "$OUT/gpu_measure.tar.gz" -C "$LOGS" .; }
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
      python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$LOGS/device.txt"
    status=0
    part() {  # part NAME TIMEOUT_S COMMAND...: run, log to $LOGS/NAME.log, record the exit status
      local name=$1 limit=$2; shift 2
      local rc=0
      timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
      echo "$name $rc" >> "$LOGS/parts.txt"
      tail -n 25 "$LOGS/$name.log"
      return "$rc"
    }
    ACCELERATOR=$([ "$DEVICE" = cuda ] && echo gpu || echo cpu)
    # 1. correctness: side by side, none of it is timed
    part cuda_tests "${CHECK_TIMEOUT:-150}" python -m pytest -q -p no:cacheprovider tests/test_smoe_fastpath.py \
      -k cuda & p1=$!
    part correctness "${CHECK_TIMEOUT:-150}" python benchmarks/gpu_check.py correctness --device "$DEVICE" & p2=$!
    part ddp "${CHECK_TIMEOUT:-150}" python -m smoeweather train --config weatherbench/world_smoe_all_prior.yaml \
      trainer.accelerator="$ACCELERATOR" trainer.devices=1 trainer.strategy=ddp trainer.deterministic=false \
      trainer.max_steps=30 trainer.val_check_interval=15 trainer.limit_val_batches=4 \
      trainer.enable_progress_bar=false data.store=/tmp/gpu_world.zarr output_dir=/tmp/gpu_ddp & p3=$!
    for p in $p1 $p2 $p3; do wait "$p" || status=$?; done
    pack
    # 2. network training steps against dense networks (timed: nothing else runs)
    part step "${STEP_TIMEOUT:-120}" python benchmarks/gpu_check.py step --device "$DEVICE" \
      --rounds "${STEP_ROUNDS:-5}" || status=$?
    pack
    part profile "${PROFILE_TIMEOUT:-60}" python benchmarks/gpu_check.py profile --device "$DEVICE" || status=$?
    pack
    rm -f "benchmarks/results/smoe_layer_$DEVICE.json"  # a fresh file: --append adds only this run's batches
    # 3./4. layer and paper-size ResNet, batch by batch (the batch-64 targets first): a time-out loses one part
    for batch in $BATCHES; do
      part "smoe_layer_b$batch" "${LAYER_TIMEOUT:-150}" python benchmarks/smoe_layer.py --device "$DEVICE" \
        --batches "$batch" --dtypes fp32 bf16 --impls index_select channels_last --repeats "${REPEATS:-5}" \
        --rounds "${ROUNDS:-1}" --append || status=$?
      pack
      part "resnet_step_b$batch" "${RESNET_TIMEOUT:-50}" python benchmarks/resnet_step.py --device "$DEVICE" \
        --batch "$batch" --steps "${STEPS:-10}" --out "benchmarks/results/resnet_step_${DEVICE}_b$batch.json" \
        ${BLOCKS:+--blocks "$BLOCKS"} || status=$?
      pack
    done
    exit "$status"
    ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
