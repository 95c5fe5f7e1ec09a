# H100 80GB HBM3 (run kind nvidia-h200, either card; carry .wheels), 2026-12-06, one call per folder, main at d28beda.
export PYTHONPATH=$PWD:/tmp/deps
# call1: the tiny streamed pass on a thread (84b811e..dae087c) beside 6891b12 (its one-tile form)
BASE_REV=6891b12 bash tests/benchmarks/run_h200.sh $OUT setup startup_profile windows_gpu_busy startup_base cold_quick
# call2: the unit suite on the GPU (issue 50, item 1)
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu
# call3: trained-network agreement, labels and clicks (issue 50, item 1)
bash tests/benchmarks/run_h200.sh $OUT setup trained_agreement click_agreement
# call4: file to file against the bundle (item 5), and the timelines with --sw-batch-size auto (item 2)
bash tests/benchmarks/run_h200.sh $OUT setup end_to_end startup_auto
