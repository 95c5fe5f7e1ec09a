# H100 80GB HBM3 (nvidia-h100-x1; torch 2.11.0+cu130, Triton 3.6), 2026-12-06, issue 50 items 2 and 3.
# Each call ran on a fresh machine (hosts differ: compare rows of one call only), carry [".wheels"].
# The tree of each call: call 1 at f359c36; calls 2-5 on f359c36 plus the then-uncommitted changes of
# 7c6dbcd..25927fe, as far as each had come (see each call's notes); calls 6 and 7 at 25927fe
# (call 7 with the per-click lines of vista3d_slicer_clicks.py added).
# A call between 5 and 6 did not start (no machine in 90 s; ~120 s of device time).

# call 1 (f359c36): the full cold start (bytecode folder, os._exit, one-image config, first time on a GPU) and a
# profiled click 2 (the sequence then ran once, after a one-click warm-up)
bash tests/benchmarks/run_h200.sh $OUT setup cold_start clicks_profile

# call 2 (+ clicks benchmark: whole sequences x3, every click a new window; startup_profile with bytecode and timeline)
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile clicks_profile

# call 3 (+ Triton's hash started while the checkpoint is read; cold_start --quick with the 'package' row)
bash tests/benchmarks/run_h200.sh $OUT setup cold_quick startup_profile clicks_profile

# call 5 (+ the labeller's Triton rounds, before the one-row merge as two items): their GPU tests, then
#   python3 -m pytest -q -p no:cacheprovider tests/utils/test_label_rounds.py tests/utils/test_point_helpers.py \
#       tests/apps/vista3d/test_session.py -x      -> 69 passed in 54.23s
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile clicks_profile

# call 6 (25927fe): the whole suite, the click benchmark against upstream, the goal-2 rows
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu clicks cold_quick

# call 7 (25927fe + per-click lines): Slicer's clicks over the socket -> stopped: every answer differed from the
# in-process session (see call7/slicer_clicks.txt); not yet explained, see docs/benchmarks.md section 5
bash tests/benchmarks/run_h200.sh $OUT setup slicer_clicks
