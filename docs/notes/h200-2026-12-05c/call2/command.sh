# session 2026-12-05c, call 2: clicks with the hooking labeller (fc0a), a click profile, fresh-process timelines (again:
# call 1's outputs past 8 files did not come back)
O=$OUT/call2; mkdir -p $O; cp gpu_call2.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"; } >> $O/log.txt
st() { name=$1; lim=$2; shift 2; s=$(date +%s); timeout $lim "$@" > $O/$name.txt 2>&1; echo "$name rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt; }
st pytest 150 bash -c "python3 -m pytest -q -p no:cacheprovider tests/utils/test_point_helpers.py tests/networks/test_vista3d.py tests/apps/vista3d/test_session.py tests/apps/vista3d/test_point_inferer.py; python3 -m pytest -q -p no:cacheprovider tests/networks/test_vista3d_fused.py -k 'click or point or Click or Point'"
st clicks 150 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json
st click_profile 90 python3 tests/benchmarks/experiments/click_profile.py --device cuda --rows 30
W=/tmp/tl; python3 -c "import sys; sys.path.insert(0,'tests/benchmarks'); from pathlib import Path; from vista3d_cold_start import write_inputs; write_inputs(Path('$W'), False, 1, 0)"
export TRITON_CACHE_DIR=$W/triton_cache
CLI="-i $W/cts/ct0.nii.gz -o $W/out --weights $W/model.pt --device cuda --timing --overwrite"
TL="python3 tests/benchmarks/experiments/process_timeline.py"
python3 -m monai.apps.vista3d $CLI > /dev/null 2>&1; echo "cache filled rc=$?" >> $O/log.txt
T='import time,subprocess,sys; t=time.perf_counter(); r=subprocess.run(sys.argv[2:],capture_output=True,text=True); print(f"=== {sys.argv[1]} wall {time.perf_counter()-t:.2f} s rc {r.returncode}"); print(r.stderr[-2500:]); print("\n".join(l for l in r.stdout.splitlines() if "inference" in l or "load " in l or "save " in l))'
s=$(date +%s)
{ for i in 1 2 3; do python3 -c "$T" baseline python3 -c "import torch; torch.zeros(1).cuda()"; python3 -c "$T" default $TL -- $CLI; python3 -c "$T" autotune0 $TL cudnn_autotune=False -- $CLI; done
  for i in 1 2; do python3 -c "$T" graphs0 $TL graph_max_windows=0 -- $CLI; python3 -c "$T" no-fuse $TL -- $CLI --no-fuse; done
} > $O/timeline.txt 2>&1; echo "timeline $(( $(date +%s) - s )) s" | tee -a $O/log.txt
ls $O; cat $O/log.txt; tail -3 $O/pytest.txt; tail -10 $O/clicks.txt; grep "click stages" $O/click_profile.txt; grep "===" $O/timeline.txt
