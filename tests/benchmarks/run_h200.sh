#!/usr/bin/env bash
# The H200 measurements recorded in docs/benchmarks.md, in the order they were run.
# Usage (on the GPU machine, from the repository root): bash tests/benchmarks/run_h200.sh A|B OUTDIR
# Expects the wheels of upstream MONAI 1.6.1, nibabel and parameterized in .wheels/ (no registry there).
set -u
part=$1; out=${2:-/tmp/h200}; mkdir -p "$out"
pip install -q --no-deps --no-index --target /tmp/up .wheels/monai-1.6.1-py3-none-any.whl >/dev/null 2>&1
pip install -q --no-deps --no-index --target /tmp/deps .wheels/nibabel-*.whl .wheels/parameterized-*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/deps
step() { name=$1; lim=$2; shift 2; echo "=== $name: $*" | tee -a "$out/log.txt"; s=$(date +%s)
  timeout "$lim" "$@" > "$out/$name.txt" 2>&1; echo "rc=$? $(( $(date +%s) - s )) s" | tee -a "$out/log.txt"; tail -n 25 "$out/$name.txt"; }
if [ "$part" = A ]; then
  step everything 240 python3 tests/benchmarks/vista3d_everything.py --device cuda --upstream /tmp/up --sw-batch-sizes 1,4,14,auto --compare-logits --json "$out/everything.json"
  step class_head 60 python3 tests/benchmarks/vista3d_class_head.py --device cuda --size 128 --json "$out/class_head.json"
  step class_memory 60 python3 tests/benchmarks/vista3d_class_only_memory.py --device cuda --size 128 --modes class,points,mixed --json "$out/class_memory.json"
  step sw_timing 90 python3 tests/benchmarks/sliding_window_timing.py --device cuda --json "$out/sw_timing.json"
  step pytest_gpu 100 python3 -m pytest tests -q -x -p no:cacheprovider
else
  step everything 200 python3 tests/benchmarks/vista3d_everything.py --device cuda --upstream /tmp/up --sw-batch-sizes 1,4,14,auto --compare-logits --json "$out/everything.json"
  step streaming256 130 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up --sizes 256x256x256 --classes 117,1 --repeats 20 --json "$out/streaming256.json"
  step streaming512 120 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up --sizes 512x512x512 --classes 117 --repeats 5 --full-repeats 1 --acc-dtypes float16 --json "$out/streaming512.json"
  step pipeline 90 python3 -m monai.apps.vista3d benchmark --device cuda --json "$out/pipeline.json"
  step pytest_gpu 45 python3 -m pytest tests -q -x -p no:cacheprovider -m "not slow"
fi
