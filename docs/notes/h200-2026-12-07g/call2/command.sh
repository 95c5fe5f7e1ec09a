# the whole unit suite on the GPU at 10c0ca4 (the statistics' order after the hand-over, 7119502, and the
# far-edge mask had only the resident kernel's and the fused network's GPU tests), the serve and DICOM wheels carried
set -u
export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader; git log --oneline -1 2>/dev/null
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu 2>&1 | tail -5
tail -3 $OUT/pytest_gpu.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest_gpu.txt | head -30
echo "total $SECONDS s"
