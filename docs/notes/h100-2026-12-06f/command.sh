# H100 80GB HBM3 (torch 2.11.0+cu130, Triton 3.6), 2026-12-06 (fifth session), issue 50 items 2 and 3.
# Each call ran on a fresh machine (hosts differ: compare rows of one call only), carry [".wheels"].
# Two calls did not start (no machine; ~90 s of device time each).

# call 1 (b49c80a): Slicer's clicks over the socket at today's code; the fresh-process timeline beside one with CUDA
# graphs for the one CT; CUDA's start beside the imports; clicks in fresh processes with times (autotune on/off)
bash tests/benchmarks/run_h200.sh $OUT setup slicer_clicks startup_graphs cuda_init_beside_imports clicks_across_processes

# Two calls did not start.

# call 2 (cb367fd: Triton's hash once per process and waited for by the first kernel, the hash started by the command before its imports, nibabel without pydicom; the
# timeline's conv3d mark): the timeline and the goal-2 rows; then the changed tests on the GPU (20 passed)
bash tests/benchmarks/run_h200.sh $OUT setup startup_profile cold_quick
python3 -m pytest -q -p no:cacheprovider tests/utils/test_triton_support.py tests/networks/test_vista3d_fused.py \
  tests/apps/vista3d/test_cli.py -k "Prefetch or prefetched or wait or KernelCacheKey or Pydicom or FusedKernels" -n 8

# Five calls did not start (no machine; ~90 s of device time each).

# call 3 (199e6e8: + cuDNN started beside cuBLAS): the timelines at HEAD and at the session's base 00d69f2 on the
# same host; then the changed tests on the GPU (30 passed). The budget left no room for cold_quick.
BASE_REV=00d69f2 bash tests/benchmarks/run_h200.sh $OUT setup startup_profile startup_base
python3 -m pytest -q -p no:cacheprovider tests/utils/test_cuda_libraries.py tests/utils/test_triton_support.py \
  tests/apps/vista3d/test_network_ready.py tests/networks/test_vista3d_fused.py -k "not TestFusedReference" -n 8
