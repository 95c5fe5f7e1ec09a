# session 2026-12-05b, call 3: click latency (fused vs module vs upstream), then vista3d serve over the socket
O=$OUT/call3; mkdir -p $O; cp gpu_call3.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader > $O/gpu.txt
s=$(date +%s); timeout 220 python3 tests/benchmarks/vista3d_clicks.py --device cuda --upstream /tmp/up --repeats 5 --clicks 5 --json $O/clicks.json > $O/clicks.txt 2>&1; echo "clicks rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
s=$(date +%s); timeout 330 python3 tests/benchmarks/vista3d_serve.py --device cuda --weights-size published --clients 1,4,16 --rounds 2 --json $O/serve.json > $O/serve.txt 2>&1; echo "serve rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
tail -30 $O/clicks.txt; tail -30 $O/serve.txt
