# session 2026-12-05c, call 3: clicks with the stitch on the GPU (and the hooking labeller); what CUDA graphs and cuDNN
# autotuning cost and save in one-shot and six-CT processes (fresh processes, warm kernel cache)
O=$OUT/call3; mkdir -p $O; cp gpu_call3.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"; } >> $O/log.txt
st() { name=$1; lim=$2; shift 2; s=$(date +%s); timeout $lim "$@" > $O/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt; }
st clicks 150 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json
st click_profile 60 python3 tests/benchmarks/experiments/click_profile.py --device cuda --rows 20
W=/tmp/tl; python3 -c "import sys; sys.path.insert(0,'tests/benchmarks'); from pathlib import Path; from vista3d_cold_start import write_inputs; write_inputs(Path('$W'), False, 6, 0)"
export TRITON_CACHE_DIR=$W/triton_cache
CLI="-o $W/out --weights $W/model.pt --device cuda --timing --overwrite"
TL="python3 tests/benchmarks/experiments/process_timeline.py"
python3 -m monai.apps.vista3d -i $W/cts/ct0.nii.gz $CLI > /dev/null 2>&1; echo "cache filled rc=$?" >> $O/log.txt
T='import time,subprocess,sys; t=time.perf_counter(); r=subprocess.run(sys.argv[2:],capture_output=True,text=True); print(f"=== {sys.argv[1]} wall {time.perf_counter()-t:.2f} s rc {r.returncode}"); print(r.stderr[-2500:]); print("\n".join(l for l in r.stdout.splitlines() if "inference" in l or " -> " in l))'
s=$(date +%s)
{ for c in "default" "graphs0 graph_max_windows=0" "both0 graph_max_windows=0 cudnn_autotune=False" "autotune0 cudnn_autotune=False"; do set -- $c; n=$1; shift
    python3 -c "$T" six-$n $TL "$@" -- -i $W/cts $CLI; done
  for i in 1 2; do python3 -c "$T" baseline python3 -c "import torch; torch.zeros(1).cuda()"; python3 -c "$T" both0 $TL graph_max_windows=0 cudnn_autotune=False -- -i $W/cts/ct0.nii.gz $CLI; python3 -c "$T" default $TL -- -i $W/cts/ct0.nii.gz $CLI; done
} > $O/timeline.txt 2>&1; echo "timeline $(( $(date +%s) - s )) s" | tee -a $O/log.txt
cat $O/log.txt; tail -10 $O/clicks.txt; grep "click stages" $O/click_profile.txt; grep -E "===|^inference" $O/timeline.txt
