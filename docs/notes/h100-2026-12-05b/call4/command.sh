# session 2026-12-05b, call 4: after the two fixes (click in a window's last half voxel; server counts only client bytes)
O=$OUT/call4; mkdir -p $O; cp gpu_call4.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader > $O/gpu.txt
s=$(date +%s); timeout 70 python3 tests/benchmarks/vista3d_serve.py --device cuda --weights-size published --clients 1,4,16 --rounds 2 --json $O/serve.json > $O/serve.txt 2>&1; echo "serve rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
s=$(date +%s); timeout 95 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 3 --clicks 5 --json $O/clicks.json > $O/clicks.txt 2>&1; echo "clicks rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt

tail -22 $O/clicks.txt; tail -9 $O/serve.txt
