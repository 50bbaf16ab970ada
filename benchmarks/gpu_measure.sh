#!/usr/bin/env bash
# The SMoE networks on CUDA, as one prepared device call: correctness, the launch-bound step, paper
# size, then the heat table and the GCM routing study side by side in the time left.
#
#   bash benchmarks/gpu_measure.sh prepare   # here, with network: .gpu/site.tar.xz (the packages the GPU image
#                                            # lacks), .gpu/gcm_year{1,2}.pack (the GCM world) and .gpu/export
#                                            # (a checkpoint and its export, made at this commit), ~45 MB
#   # then, through the device tool: carry [".gpu"], timeout_s 560
#   bash benchmarks/gpu_measure.sh run       # on the GPU machine: everything packed into $OUT/gpu_measure.tar.gz
#
# `run`, each part under its own `timeout`; $OUT/gpu_measure.tar.gz is re-packed after every part (and every
# 30 s during parts 3-4), so a time-out keeps what was measured. parts.txt holds each part's exit status.
#   background from the start (CPU only): the 64x64 heat store (reference generator) and the GCM-world store;
#   1. correctness, side by side (not timed): the CUDA-only tests; gpu_check.py correctness (SMoE ResNet and
#      SMoE-U-Net, 20 steps CUDA against CPU, dropout off); gpu_check.py selected (every expert path, used
#      and selected, against "all": layers over a land-sea prior and the SMoE-U-Net); gpu_export.py check
#      (`smoe forecast` from the export folder against the checkpoint on the device, and model.onnx in
#      onnxruntime against torch);
#   2. gpu_compile.py (timed, alone): eager / CUDA-graph / torch.compile steps of SMoE networks against dense
#      twins, and the layer at batch 64 and 16, fp32 and bf16; profiles where a target is missed;
#   5. gpu_paper.py (timed, alone): gcm_128x19 dense and SMoE, samples/s and peak memory at batch 8..64;
#   3. + 4. together until the end: gpu_heat.py rows smoe, smoe_no_rc_no_damping, conv (64x64, one process
#      each, stopped at an epoch end before the budget and scored on test), and `smoe study` of
#      configs/studies/gcm_16x3.yaml (STUDY_ARMS, 3 seeds each, one process per run).
# Every size has an env override; a CPU dry run (minutes):
#   DEVICE=cpu TOTAL=900 QUICK=1 nice -n 10 bash benchmarks/gpu_measure.sh run
# Unpack: mkdir -p benchmarks/results/gpu_run && tar xzf FILES_AT/gpu_measure.tar.gz -C benchmarks/results/gpu_run
set -euo pipefail
cd "$(dirname "$0")/.."
GPU=.gpu
# What the GPU image lacks (../shared/tools/gpu/README.md; pytest, pluggy, iniconfig are there), zarr and
# numcodecs at the versions the project is tested with; cftime is imported by smoeweather itself.
PACKAGES=(zarr==3.1.6 numcodecs==0.16.6 donfig google-crc32c dask partd locket cftime bottleneck lazy-importer
          importlib-metadata tblib h5netcdf safetensors)
WORLD=${GCM_WORLD_DIR:-../shared/data/gcm_world}

case "${1:-}" in
  prepare)
    PY=${PYTHON:-.venv/bin/python}
    mkdir -p "$GPU"
    wheels=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "${GPU_PYTHON:-3.12}" \
      --platform manylinux2014_x86_64 --dest "$wheels" "${PACKAGES[@]}"
    "$PY" -m benchmarks.gpu_pack site "$GPU/site.tar.xz" "$wheels"/*.whl
    rm -rf "$wheels" "$GPU/wheels"
    "$PY" -m benchmarks.gpu_export prepare --out "$GPU/export" > /dev/null  # the code of this commit: always anew
    for y in 1 2; do
      [ -f "$GPU/gcm_year$y.pack" ] || "$PY" -m benchmarks.gpu_pack gcm "$GPU/gcm_year$y.pack" \
        "$WORLD/gcm_5.625deg_year$y.nc"
    done
    du -sh "$GPU"
    tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
    gpu=$(du -sb "$GPU" | cut -f1)
    echo "travels: working tree $((tree / 1000000)) MB + $GPU $((gpu / 1000000)) MB = $(((tree + gpu) / 1000000)) MB (limit 67.1 MB = 64 MiB)"
    [ $((tree + gpu)) -lt 67108864 ] || { echo "ERROR: over the device tool's 64 MiB limit" >&2; exit 1; }
    ;;
  run)
    T0=$SECONDS
    TOTAL=${TOTAL:-540}  # seconds this script may take in all (the device call's timeout_s minus a margin)
    SITE=${SITE:-/tmp/site}
    export PYTHONPATH="$PWD:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
    if ! python -c "import cftime, zarr, h5netcdf" 2>/dev/null; then
      [ -f "$GPU/site.tar.xz" ] || { echo "ERROR: this image lacks zarr/cftime and $GPU/site.tar.xz is missing: run" \
        "'$0 prepare' here and carry .gpu" >&2; exit 2; }
      python -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='data')" \
        "$GPU/site.tar.xz" "$SITE"  # python's lzma: the image need not have xz
      export PYTHONPATH="$PYTHONPATH:$SITE"
    fi
    DEVICE=${DEVICE:-cuda}  # DEVICE=cpu with QUICK=1 only to check this script where there is no GPU
    if [ "$DEVICE" = cuda ] && ! python -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
      echo "ERROR: DEVICE=cuda but torch sees no CUDA device on this machine (run this on the GPU machine)" >&2
      exit 2
    fi
    if [ "${QUICK:-0}" = 1 ]; then  # tiny sizes: every part runs through in a few minutes on a CPU
      : "${CHECK_STEPS:=2}" "${COMPILE_ARGS:=--rounds 1 --block 1 --batches 2 --dtypes fp32 bf16 --layer-channels 8 --layer-experts 16 --networks --compile-modes}"
      : "${PAPER_ARGS:=--batches 2 4 --steps 1 --width 8 --blocks 2}" "${HEAT_GEN_ARGS:=--runs 4 --val-runs 2 --test-runs 2 --size 16 --steps 20}"
      : "${HEAT_MAX_EPOCHS:=1}" "${STUDY_STEPS:=2}" "${STUDY_SEEDS:=[0]}" "${STUDY_PROCS:=2}"
    fi
    OUT=${OUT:-runs/gpu_measure}
    LOGS=${LOGS:-/tmp/gpu_measure}
    S=${SCRATCH:-/tmp}  # heat store, heat and study outputs
    GCM_STORE=${GCM_STORE:-/tmp/gcm_world.zarr}
    RES=${RESULTS_DIR:-$([ "$DEVICE" = cuda ] && echo benchmarks/results || echo /tmp/gpu_measure_results)}
    mkdir -p "$OUT" "$LOGS/heat" "$LOGS/study"
    pack() { cp -f "$RES"/gpu_*_"$DEVICE"*.* "$LOGS/" 2>/dev/null || true
             cp -f $S/gpu_heat/heat_*.json* "$LOGS/heat/" 2>/dev/null || true
             if [ -d $S/gpu_study/runs ]; then
               (cd $S/gpu_study && find . -name metrics.csv -o -name result.json -o -name 'study.*' | \
                  tar cf - -T - | tar xf - -C "$LOGS/study") 2>/dev/null || true
             fi
             tar czf "$OUT/gpu_measure.tar.gz.tmp" -C "$LOGS" . && mv -f "$OUT/gpu_measure.tar.gz.tmp" "$OUT/gpu_measure.tar.gz"; }
    left() { echo $((TOTAL - (SECONDS - T0))); }
    { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
      python -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
      nproc; echo "git $(git rev-parse --short HEAD 2>/dev/null || echo none)"; } | tee "$LOGS/device.txt"
    status=0
    part() {  # part NAME TIMEOUT_S COMMAND...: run, log to $LOGS/NAME.log, record the exit status and seconds
      local name=$1 limit=$2; shift 2
      local rc=0 start=$SECONDS
      timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1 || rc=$?
      echo "$name $rc $((SECONDS - start))s (limit ${limit}s)" >> "$LOGS/parts.txt"
      echo "--- $name: exit $rc after $((SECONDS - start)) s"; tail -n 15 "$LOGS/$name.log"
      return "$rc"
    }
    # background, CPU only (niced, 2 threads each; parts.txt says when they ended): the data of parts 3 and 4
    OMP_NUM_THREADS=2 part heat_generate "${PREP_TIMEOUT:-300}" nice python -m smoeweather heat generate --out $S/gpu_heat.zarr \
      --generator reference --overwrite ${HEAT_GEN_ARGS:---runs 1000 --val-runs 20 --test-runs 20 --size 64} \
      > /dev/null & heat_gen=$!
    OMP_NUM_THREADS=2 part gcm_prepare "${PREP_TIMEOUT:-300}" nice python -m benchmarks.gpu_study prepare --packs "$GPU" \
      --world /tmp/gcm_world --store "$GCM_STORE" > /dev/null & gcm_prep=$!
    # 1. correctness: side by side, none of it is timed
    part cuda_tests "${CHECK_TIMEOUT:-120}" python -m pytest -q -p no:cacheprovider tests/nn/test_smoe_fastpath.py \
      -k cuda & p1=$!
    part correctness "${CHECK_TIMEOUT:-120}" python -m benchmarks.gpu_check correctness --device "$DEVICE" --out "$RES" \
      --steps "${CHECK_STEPS:-20}" & p2=$!
    part selected "${CHECK_TIMEOUT:-120}" python -m benchmarks.gpu_check selected --device "$DEVICE" --out "$RES" \
      --steps "${CHECK_STEPS:-20}" & p3=$!
    part export "${CHECK_TIMEOUT:-120}" python -m benchmarks.gpu_export check --prepared "$GPU/export" --device "$DEVICE" \
      --out "$RES" --work $S/gpu_export & p4=$!
    for p in $p1 $p2 $p3 $p4; do wait "$p" || status=$?; done
    pack
    # 2. the launch-bound step (timed; the background data jobs are CPU-only and niced)
    part compile "${COMPILE_TIMEOUT:-170}" python -m benchmarks.gpu_compile --device "$DEVICE" --out "$RES" \
      --deadline "${COMPILE_DEADLINE:-110}" ${COMPILE_ARGS:-} || status=$?
    pack
    # 5. paper size (timed)
    part paper "${PAPER_TIMEOUT:-60}" python -m benchmarks.gpu_paper --device "$DEVICE" --out "$RES" --deadline "${PAPER_DEADLINE:-35}" \
      ${PAPER_ARGS:-} || status=$?
    pack
    # 3. + 4. together in the time left
    wait "$heat_gen" || status=$?
    wait "$gcm_prep" || status=$?
    budget=$(( $(left) - 15 )); [ "$budget" -gt 60 ] || budget=60
    echo "parts 3+4: ${budget} s left" | tee -a "$LOGS/parts.txt"
    heat_minutes=$(python -c "print(max(0.1, ($budget - ${HEAT_MARGIN:-40}) / 60))")
    pids=()
    for row in ${HEAT_ROWS:-smoe smoe_no_rc_no_damping conv}; do
      OMP_NUM_THREADS=2 part "heat_$row" "$budget" python -m benchmarks.gpu_heat --row "$row" --store $S/gpu_heat.zarr \
        --out $S/gpu_heat --minutes "$heat_minutes" ${HEAT_MAX_EPOCHS:+--max-epochs "$HEAT_MAX_EPOCHS"} & pids+=($!)
    done
    python -m benchmarks.gpu_study config --study configs/studies/gcm_16x3.yaml --device "$DEVICE" \
      --store "$GCM_STORE" --arms ${STUDY_ARMS:-dense smoe_all_prior} --out $S/gpu_study.yaml --workers "${STUDY_WORKERS:-1}" \
      ${STUDY_STEPS:+--steps "$STUDY_STEPS"} > "$LOGS/study_config.log" 2>&1 && cp $S/gpu_study.yaml "$LOGS/"
    n=${STUDY_PROCS:-6}
    for k in $(seq 0 $((n - 1))); do
      part "study_$k" "$budget" python -m smoeweather study --config $S/gpu_study.yaml --out $S/gpu_study \
        --shard "$k/$n" ${STUDY_SEEDS:+seeds="$STUDY_SEEDS"} & pids+=($!)
    done
    alive() { for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
    while alive "${pids[@]}"; do sleep 30; pack; done  # while any runs: partial results every 30 s
    for p in "${pids[@]}"; do wait "$p" || status=$?; done
    python -m benchmarks.gpu_heat --summary $S/gpu_heat > /dev/null 2>&1 && cp $S/gpu_heat/heat_gpu.md "$LOGS/heat/"
    pack
    echo "total $((SECONDS - T0)) s" | tee -a "$LOGS/parts.txt"
    exit "$status"
    ;;
  *)
    echo "usage: $0 prepare|run" >&2
    exit 2
    ;;
esac
