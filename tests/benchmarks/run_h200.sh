#!/usr/bin/env bash
# The H200 measurements recorded in docs/benchmarks.md, in the order they were run.
# Usage (on the GPU machine, from the repository root): bash tests/benchmarks/run_h200.sh A|B|...|K OUTDIR
# A and B: the first session; C to I: the second (streaming at small window batches, batch throughput, an 80 GiB card);
# J and K: issue 15 (file in, label map out; NIfTI I/O).
# Expects the wheels of upstream MONAI 1.6.1, nibabel, parameterized (and isal for J, K) in .wheels/ (no registry there).
set -u
part=$1; out=${2:-/tmp/h200}; mkdir -p "$out"
pip install -q --no-deps --no-index --target /tmp/up .wheels/monai-1.6.1-py3-none-any.whl >/dev/null 2>&1
pip install -q --no-deps --no-index --target /tmp/deps .wheels/nibabel-*.whl .wheels/parameterized-*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/deps
step() { name=$1; lim=$2; shift 2; echo "=== $name: $*" | tee -a "$out/log.txt"; s=$(date +%s)
  timeout "$lim" "$@" > "$out/$name.txt" 2>&1; echo "rc=$? $(( $(date +%s) - s )) s" | tee -a "$out/log.txt"; tail -n 25 "$out/$name.txt"; }
S512="--sizes 512x512x512 --acc-dtypes float16 --full-repeats 1 --full-sw-batch-size 14"
if [ "$part" = C ]; then
  step forward_batch 90 python3 tests/benchmarks/vista3d_forward_batch.py --device cuda --sw-batch-sizes 1,2,4,8,14 --profile 1,4 --json "$out/forward_batch.json"
  step streaming512_117 480 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up $S512 --classes 117 --sw-batch-size 2,4,14 --repeats 20 --json "$out/streaming512_117.json"
elif [ "$part" = D ]; then
  step streaming512_1 280 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up $S512 --classes 1 --sw-batch-size 2,14 --repeats 20 --json "$out/streaming512_1.json"
  step streaming256_bs2 120 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up --sizes 256x256x256 --classes 117,1 --acc-dtypes float16 --sw-batch-size 2 --full-sw-batch-size 14 --repeats 20 --json "$out/streaming256_bs2.json"
  step batch_1gpu 120 python3 tests/benchmarks/batch_throughput.py --volumes 16 --size 256,256,176 --device cuda --workdir /tmp/bt --json "$out/batch_1gpu.json"
elif [ "$part" = E ]; then
  step batch_1gpu 120 python3 tests/benchmarks/batch_throughput.py --volumes 16 --size 256,256,176 --device cuda --workdir /tmp/bt --json "$out/batch_1gpu.json"
elif [ "$part" = F ]; then
  step streaming512_cap80 400 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up $S512 --classes 117 --sw-batch-size 2 --repeats 3 --no-fork-full --memory-cap-gib 80 --json "$out/streaming512_cap80.json"
elif [ "$part" = G ]; then
  step streaming512_cap80_acc 400 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up $S512 --classes 117 --sw-batch-size 2 --repeats 1 --acc-dtypes float32,float16 --no-fork-full --memory-cap-gib 80 --json "$out/streaming512_cap80_acc.json"
elif [ "$part" = H ]; then
  step streaming512_fp32 480 python3 tests/benchmarks/vista3d_streaming.py --device cuda --upstream /tmp/up $S512 --classes 117 --sw-batch-size 1,2 --repeats 20 --acc-dtypes float32 --no-fork-full --json "$out/streaming512_fp32.json"
elif [ "$part" = I ]; then  # not run yet (the session ran out of device time)
  PYTHONPATH=/tmp/up:$PYTHONPATH step batch_agreement 240 python3 tests/benchmarks/vista3d_batch_agreement.py --device cuda --sizes 256x256x256,512x512x512 --sw-batch-sizes 14,1,2 --json "$out/batch_agreement.json"
elif [ "$part" = J ]; then  # issue 15: file in, label map out, against the bundle's pipeline (~4 min)
  pip install -q --no-deps --no-index --target /tmp/deps .wheels/isal-*.whl >/dev/null 2>&1
  step end_to_end 570 python3 tests/benchmarks/vista3d_end_to_end.py --device cuda --upstream /tmp/up --repeats 3 --workdir /tmp/e2e --json "$out/end_to_end.json"
elif [ "$part" = K ]; then  # issue 15: NIfTI load/save against nibabel on the host's cores (~3 min)
  pip install -q --no-deps --no-index --target /tmp/deps .wheels/isal-*.whl >/dev/null 2>&1
  step nifti_io 570 python3 tests/benchmarks/nifti_io.py --repeat 5 --json "$out/nifti_io.json"
elif [ "$part" = A ]; then
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
