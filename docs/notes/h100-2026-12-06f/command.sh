# H100 80GB HBM3 (torch 2.11.0+cu130, Triton 3.6), 2026-12-06 (fifth session), issue 50 items 2 and 3.
# Each call ran on a fresh machine (hosts differ: compare rows of one call only), carry [".wheels"].
# Two calls did not start (no machine; ~90 s of device time each).

# call 1 (b49c80a): Slicer's clicks over the socket at today's code; the fresh-process timeline beside one with CUDA
# graphs for the one CT; CUDA's start beside the imports; clicks in fresh processes with times (autotune on/off)
bash tests/benchmarks/run_h200.sh $OUT setup slicer_clicks startup_graphs cuda_init_beside_imports clicks_across_processes
