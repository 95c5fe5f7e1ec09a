# H100 80GB HBM3 (torch 2.11.0+cu130, Triton 3.6.0), 2026-12-06 (sixth session), issue 50 items 1 and 2.
# Each call ran on a fresh machine (hosts differ: compare rows of one call only), carry [".wheels"], kind nvidia-h200
# (either card; each call says which it got). Three asks found no machine first (~90 s + 2 x 15 s of device time).

# call 1 (beebc4d: 63e62c5 the weights counted without a meta build, 102189d gc.freeze in the program, b59cb45
# Triton's key kept beside the kernel cache, beebc4d the loader preprocessing the first image): the timeline and
# two experiments on startup_profile's inputs, Triton 3.6's use of its key, the changed tests; then the
# placeholder network's timelines beside the command's own, the base 586ee87 on the same host, the goal-2 rows.
# startup_profile.txt, windows_gpu_busy.txt and weights_to_gpu.txt did not come back (too many files under $OUT,
# the .prof files): log_a.txt holds each one's last 25 lines.
export BASE_REV=586ee87; export PYTHONPATH=$PWD:/tmp/deps
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile windows_gpu_busy weights_to_gpu > $OUT/log_a.txt 2>&1
python3 -c "import triton, inspect, triton.runtime.cache as c; print(triton.__version__); print(inspect.getsource(c.get_cache_key))"
grep -rn "triton_key\|get_cache_key" $(python3 -c 'import triton,os;print(os.path.dirname(triton.__file__))') --include=*.py
python3 -m pytest -q -p no:cacheprovider tests/utils/test_triton_cache_key.py tests/apps/vista3d/test_cli_run.py \
  tests/apps/vista3d/test_feasibility.py tests/apps/vista3d/test_network_ready.py tests/apps/vista3d/test_once_per_image.py \
  tests/apps/vista3d/test_pipeline.py -n 8 > $OUT/pytest_targeted.txt 2>&1
bash tests/benchmarks/run_h200.sh $OUT placeholder_window startup_base cold_quick > $OUT/log_b.txt 2>&1

# Two calls did not start (~90 s each).

# call 2 (dd74e72: + the tiles' add through the Triton window-add kernel): the timeline at HEAD, the goal-2 rows,
# the whole suite on the GPU (3232 passed, 1 failed: a test still patching triton_support._cache_key_thread, mended
# at 2c7bdca). windows_gpu_busy*.txt did not come back (more than 8 files under $OUT); call 2b reran them.
export PYTHONPATH=$PWD:/tmp/deps
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile windows_gpu_busy > $OUT/log_a.txt 2>&1
bash tests/benchmarks/run_h200.sh $OUT cold_quick > $OUT/log_b.txt 2>&1
bash tests/benchmarks/run_h200.sh $OUT pytest_gpu > $OUT/log_c.txt 2>&1
# call 2b (the same machine, warm): windows_gpu_busy at dd74e72 and at 586ee87 (windows_gpu_busy_dd74e72_and_586ee87.txt)
