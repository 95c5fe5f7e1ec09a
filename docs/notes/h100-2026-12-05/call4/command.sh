O=$OUT/call4; mkdir -p $O; bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader > $O/gpu.txt; git log --oneline -1 >> $O/gpu.txt 2>/dev/null
s=$(date +%s); timeout 110 python3 -m pytest -q -p no:cacheprovider -n 8 -rf tests/apps/vista3d/test_cli.py tests/apps/vista3d/test_parts.py tests/apps/vista3d/test_cli_outputs.py tests/apps/vista3d/server/test_nim_api.py tests/apps/vista3d/server/test_security.py > $O/pytest_apps.txt 2>&1; echo "pytest_apps rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
python3 -c "import sys; sys.path.insert(0,'tests/benchmarks'); from pathlib import Path; import vista3d_cold_start as c; c.write_inputs(Path('/tmp/sp'), False, 1, 0)"
T='import time,subprocess,sys; t=time.perf_counter(); r=subprocess.run(sys.argv[2:],capture_output=True,text=True); print(sys.argv[1], round(time.perf_counter()-t,2), "s rc", r.returncode, [l for l in r.stdout.splitlines() if l.startswith(("inference","load ","save "))], r.stderr[-300:] if r.returncode else "")'
CLI="python3 -m monai.apps.vista3d -i /tmp/sp/cts/ct0.nii.gz -o /tmp/sp/out --weights /tmp/sp/model.pt --device cuda --timing --overwrite"
export TRITON_CACHE_DIR=/tmp/sp/triton_cache
{ python3 -c "$T" fill $CLI; for i in 1 2; do python3 -c "$T" baseline python3 -c "import torch; torch.zeros(1).cuda()"; python3 -c "$T" warm $CLI; done; } > $O/warm_times.txt 2>&1
cat $O/gpu.txt $O/log.txt $O/warm_times.txt; tail -15 $O/pytest_apps.txt
