# H100 80GB HBM3 (run kind nvidia-h200, either card; carry .wheels), 2026-12-06, one call per folder.
# call1 at 6891b12 (label map's first launches on a thread, 5ddb3e0) beside f7711e9 (its parent):
export BASE_REV=f7711e9 PYTHONPATH=$PWD:/tmp/deps
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile windows_gpu_busy startup_base cold_quick
