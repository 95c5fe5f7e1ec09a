# H100 80GB (nvidia-h100-x1), torch 2.11.0+cu130, Triton 3.6; 2026-12-07 (fourteenth session)
# call 1 (tree at 867921b): graph_launch with cuDNN's and cuBLAS's memset nodes, and the kernel profiles
export PYTHONPATH=$PWD; bash tests/benchmarks/run_h200.sh $OUT graph_launch fused_idle 2>&1 | tail -150
# call 2 (tree at 867921b + graph_start.py, committed as 15868fd): the forward's own graph (its first form, without
# keep_graph, wrote no DOT file; the one before it lacked the host steps)
export PYTHONPATH=$PWD; bash tests/benchmarks/run_h200.sh $OUT graph_start 2>&1 | tail -30
# calls 3-6: base_head/ = `git archive 867921b monai` untracked beside the tree; the scripts are call3/ab.sh ...
# call6/ab4.sh (run as `bash base_head/abN.sh`, carry .wheels for 4-6)
#   call 3: the statistics change (110bce0) against 867921b
#   call 4: + the first upsampling kernel (compile-time loops): slower, rewritten
#   call 5: + the pipelined upsampling kernel (0e30d41 but for its default launch) and its launch variants
#   call 6: 0e30d41 against 867921b, then run_h200.sh pytest_gpu
