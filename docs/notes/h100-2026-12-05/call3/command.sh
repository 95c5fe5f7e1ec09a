O=$OUT/call3; mkdir -p $O; bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > $O/gpu.txt; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)" >> $O/gpu.txt
s=$(date +%s); timeout 200 python3 tests/benchmarks/vista3d_startup_profile.py --device cuda --workdir /tmp/sp --out $O --top 60 > $O/startup_profile.txt 2>&1; echo "startup_profile rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
T='import time,subprocess,sys; t=time.perf_counter(); r=subprocess.run(sys.argv[2:],capture_output=True,text=True); print(sys.argv[1], round(time.perf_counter()-t,2), "s rc", r.returncode, [l for l in r.stdout.splitlines() if "inference" in l or "load " in l or "save " in l])'
CLI="python3 -m monai.apps.vista3d -i /tmp/sp/cts/ct0.nii.gz -o /tmp/sp/out --weights /tmp/sp/model.pt --device cuda --timing --overwrite"
export TRITON_CACHE_DIR=/tmp/sp/triton_cache
{ for i in 1 2 3; do python3 -c "$T" baseline python3 -c "import torch; torch.zeros(1).cuda()"; done
  for i in 1 2 3; do python3 -c "$T" warm $CLI; done
  for i in 1 2; do python3 -c "$T" no-fuse $CLI --no-fuse; done; } > $O/warm_times.txt 2>&1
unset TRITON_CACHE_DIR
s=$(date +%s); timeout 270 python3 -m pytest tests -v --tb=short -rf -p no:cacheprovider -n 14 --durations=15 > $O/pytest_gpu.txt 2>&1; echo "pytest_gpu rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
cat $O/gpu.txt $O/warm_times.txt; grep "===\|in .* s;" $O/startup_profile.txt; grep -E "FAILED|ERROR|passed|failed" $O/pytest_gpu.txt | tail -25
