# H100 80GB HBM3 (nvidia-h100-x1; torch 2.11.0+cu130, Triton 3.6), 2026-12-06 (fourth session), issue 50 items 2 and 3.
# Each call ran on a fresh machine (hosts differ: compare rows of one call only), carry [".wheels"].

# call 1 (99049e3): Slicer's clicks over the socket (stopped again: every answer 1753-2279 voxels apart from the
# in-process session; the same counts in every sequence), the network's build beside the CT's load, the timeline;
# then the labeller's GPU tests: python3 -m pytest -q -p no:cacheprovider tests/utils/test_label_rounds.py -> 12 passed
bash tests/benchmarks/run_h200.sh $OUT setup slicer_clicks network_beside_load startup_profile

# call 2 (99049e3 + the finite check on the device, 3c4e2bc's change): clicks in fresh processes, the timeline with
# marks for the pipeline and segment, the goal-2 rows; then the checkpoint's tests on the GPU -> 54 passed
bash tests/benchmarks/run_h200.sh $OUT setup clicks_across_processes startup_profile cold_quick

# call 3 (+ the record made on the saver's thread, f318085's change; clicks_across_processes with four layouts;
# the timeline's library marks): where the two click outcomes come from, the goal-2 rows
bash tests/benchmarks/run_h200.sh $OUT setup clicks_across_processes startup_profile cold_quick

# Two calls did not start (no machine; ~90 s of device time each).

# call 4 (bb42dfe: the finite check on the device, the record on the saver's thread, cuBLAS started on a thread,
# the benchmark's tolerance): the whole suite, the goal-2 rows; slicer_clicks was cut by the session's device budget
# (it had started the server; nothing measured)
bash tests/benchmarks/run_h200.sh $OUT setup pytest_gpu cold_quick slicer_clicks
