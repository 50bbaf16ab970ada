#!/usr/bin/env bash
# Layer and network speed on CUDA, as one prepared device call.
#
#   bash benchmarks/gpu_measure.sh prepare   # here, with network: wheels the GPU image lacks -> .gpu/wheels
#   # then, through the device tool (carry [".gpu"], timeout_s 590):
#   bash benchmarks/gpu_measure.sh run       # on the GPU machine: results -> benchmarks/results and $OUT
#
# `run` measures, each under its own time limit so one slow part cannot eat the rest:
#   1. benchmarks/smoe_layer.py --device cuda: both route_impls, fp32 and bf16, batch 16 and 64
#      -> benchmarks/results/smoe_layer_cuda.json (setup.batch, setup.dtype, time_ratio, memory_ratio);
#   2. benchmarks/resnet_step.py --device cuda at paper size (19 blocks, 128 filters), batch 16 and 64
#      -> benchmarks/results/resnet_step_cuda_b16.json, resnet_step_cuda_b64.json.
# Copy the files back from $OUT, commit them with this command, then take the README/findings numbers from them.
# Steps 2-5 of the issue (gcm_16x3 routing study, paper size, heat, loader throughput) need the GCM world packed
# (../shared/tools/gpu/README.md) and more device time than one call: they are not part of this script.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu/wheels
# What the GPU image lacks (../shared/tools/gpu/README.md); cftime is imported by smoeweather itself.
PACKAGES=(zarr numcodecs donfig google-crc32c dask partd locket cftime bottleneck lazy-importer
          importlib-metadata tblib h5netcdf)

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
    OUT=${OUT:-runs/gpu_measure}
    mkdir -p "$OUT"
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
      python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"; } | tee "$OUT/device.txt"
    status=0
    # one smoe_layer.py call per batch (--append): a time-out loses one batch size, not all of them
    for batch in $BATCHES; do
      timeout "${LAYER_TIMEOUT:-180}" python benchmarks/smoe_layer.py --device "$DEVICE" --batches "$batch" \
        --dtypes fp32 bf16 --impls index_select channels_last --repeats "${REPEATS:-5}" --rounds "${ROUNDS:-3}" \
        --append 2> >(tee -a "$OUT/smoe_layer.log" >&2) || status=$?
    done
    cp -f "benchmarks/results/smoe_layer_$DEVICE.json" "$OUT/" 2>/dev/null || true
    for batch in $BATCHES; do
      timeout "${RESNET_TIMEOUT:-90}" python benchmarks/resnet_step.py --device "$DEVICE" --batch "$batch" \
        --steps "${STEPS:-10}" --out "benchmarks/results/resnet_step_${DEVICE}_b$batch.json" \
        ${BLOCKS:+--blocks "$BLOCKS"} || status=$?
      cp -f "benchmarks/results/resnet_step_${DEVICE}_b$batch.json" "$OUT/" 2>/dev/null || true
    done
    exit "$status"
    ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
