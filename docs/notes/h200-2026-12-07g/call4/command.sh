# the whole unit suite on the GPU at c488e50 (the part-given-twice test holds its first process until the second has begun)
set -u
export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu 2>&1 | tail -5
tail -3 $OUT/pytest_gpu.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest_gpu.txt | head -30
echo "total $SECONDS s"
