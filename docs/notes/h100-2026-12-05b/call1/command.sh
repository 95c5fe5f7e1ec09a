# session 2026-12-05b, call 1: cold-start table at HEAD, then the whole unit suite on the GPU
O=$OUT/call1; mkdir -p $O; cp gpu_call1.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; python3 -c "import torch,triton;print(torch.__version__,triton.__version__)"; git log --oneline -1 2>/dev/null; nproc; } > $O/gpu.txt
s=$(date +%s); timeout 330 python3 tests/benchmarks/vista3d_cold_start.py --device cuda --upstream /tmp/up --repeats 2 --workdir /tmp/cold --json $O/cold_start.json > $O/cold_start.txt 2>&1; echo "cold_start rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
s=$(date +%s); timeout 240 python3 -m pytest tests -q --tb=short -rf -p no:cacheprovider -n 14 --durations=15 > $O/pytest_gpu.txt 2>&1; echo "pytest_gpu rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
cat $O/gpu.txt; tail -40 $O/cold_start.txt; grep -E "FAILED|ERROR|passed|failed" $O/pytest_gpu.txt | tail -25
