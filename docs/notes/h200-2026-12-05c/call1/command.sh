# session 2026-12-05c, call 1: clicks (redrawn clicks), serve like for like, masks on the GPU, fresh-process timelines
O=$OUT/call1; mkdir -p $O; cp gpu_call1.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $O/gpu.txt
st() { name=$1; lim=$2; shift 2; s=$(date +%s); timeout $lim "$@" > $O/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt; }
st masks_gpu 60 python3 -m pytest -q -p no:cacheprovider tests/apps/vista3d/test_streaming.py -k Masks
st clicks 150 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json
st serve 110 python3 tests/benchmarks/vista3d_serve.py --device cuda --weights-size published --clients 1,4,16 --rounds 3 --json $O/serve.json
# fresh processes: what a process pays before its label map, by FusedConfig policy
W=/tmp/tl; python3 -c "import sys; sys.path.insert(0,'tests/benchmarks'); from pathlib import Path; from vista3d_cold_start import write_inputs; write_inputs(Path('$W'), False, 1, 0)"
export TRITON_CACHE_DIR=$W/triton_cache
CLI="-i $W/cts/ct0.nii.gz -o $W/out --weights $W/model.pt --device cuda --timing --overwrite"
TL="python3 tests/benchmarks/experiments/process_timeline.py"
st fill 90 python3 -m monai.apps.vista3d $CLI
T='import time,subprocess,sys; t=time.perf_counter(); r=subprocess.run(sys.argv[2:],capture_output=True,text=True); print(f"=== {sys.argv[1]} wall {time.perf_counter()-t:.2f} s rc {r.returncode}"); print(r.stderr[-2500:]); print("\n".join(l for l in r.stdout.splitlines() if "inference" in l or "load " in l or "save " in l))'
s=$(date +%s)
{ for i in 1 2 3; do python3 -c "$T" baseline python3 -c "import torch; torch.zeros(1).cuda()"; done
  for i in 1 2 3; do python3 -c "$T" default $TL -- $CLI; python3 -c "$T" graphs0 $TL graph_max_windows=0 -- $CLI; python3 -c "$T" autotune0 $TL cudnn_autotune=False -- $CLI; done
  for i in 1 2; do python3 -c "$T" both0 $TL graph_max_windows=0 cudnn_autotune=False -- $CLI; python3 -c "$T" no-fuse $TL -- $CLI --no-fuse; done
} > $O/timeline.txt 2>&1; echo "timeline $(( $(date +%s) - s )) s" | tee -a $O/log.txt
unset TRITON_CACHE_DIR
st masks512 100 python3 tests/benchmarks/vista3d_streaming.py --device cuda --fuse --sizes 512x512x512 --classes 117 --sw-batch-size 14 --acc-dtypes float16 --repeats 1 --no-fork-full --per-class --json $O/masks512.json
cat $O/gpu.txt; tail -3 $O/masks_gpu.txt; tail -12 $O/clicks.txt; tail -12 $O/serve.txt; grep "===" $O/timeline.txt; tail -8 $O/masks512.txt
