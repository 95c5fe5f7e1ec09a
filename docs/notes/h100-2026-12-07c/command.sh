# call 1 (H100 80GB, torch 2.11.0+cu130, Triton 3.6; working tree at d7ef186 + the voxel-rows experiment, carry .wheels)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv,noheader; bash tests/benchmarks/run_h200.sh $OUT setup mma_forms fused_idle voxel_rows 2>&1 | tail -120
# where the runs were:
#   mma_forms:  python3 tests/benchmarks/experiments/gluon_conv3d/mma_forms.py
#   fused_idle: python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1,14
#   voxel_rows: python3 tests/benchmarks/experiments/gluon_conv3d/voxel_rows.py
# call 2 (H100 80GB; working tree at 2ce8423 + the change committed as 35a952c, and HEAD's vista3d_fused.py as an
# untracked old_vista3d_fused.py, carry .wheels)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv,noheader
bash tests/benchmarks/run_h200.sh $OUT setup fused_idle fused_idle_eager 2>&1 | grep -v "^ \|^-\|Name" | tail -70
F="python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --repeats 5"
$F --json $OUT/forward_new.json > $OUT/forward_new.txt 2>&1; echo "new rc=$?"; tail -12 $OUT/forward_new.txt
cp old_vista3d_fused.py monai/networks/nets/vista3d_fused.py
$F --json $OUT/forward_old.json > $OUT/forward_old.txt 2>&1; echo "old rc=$?"; tail -12 $OUT/forward_old.txt
# where fused_idle_eager was: python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1 --graph-max-windows 0
# call 3 (H100; the tree of the docs commit after 35a952c + tests/benchmarks/experiments/graph_launch.py, carry .wheels)
export PYTHONPATH=$PWD:/tmp/deps; nvidia-smi --query-gpu=name --format=csv,noheader; bash tests/benchmarks/run_h200.sh $OUT setup > /dev/null 2>&1; python3 tests/benchmarks/experiments/graph_launch.py 2>&1 | tee $OUT/graph_launch.txt; timeout 170 python3 -m pytest -q -p no:cacheprovider tests/networks/test_vista3d_fused.py > $OUT/fused_tests.txt 2>&1; echo "pytest rc=$?"; tail -4 $OUT/fused_tests.txt
# call 4 (H100; the same tree + tests/benchmarks/experiments/one_window_host.py)
export PYTHONPATH=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader; python3 tests/benchmarks/experiments/one_window_host.py 2>&1 | tee $OUT/one_window_host.txt | tail -8
# call 5 (H100; the tree at 3826ae7 + tests/benchmarks/experiments/eager_host_profile.py)
export PYTHONPATH=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader; timeout 120 python3 tests/benchmarks/experiments/eager_host_profile.py > $OUT/eager_host_profile.txt 2>&1; echo rc=$?; head -c 9000 $OUT/eager_host_profile.txt
# call 6 (H100; the tree at fdf2259 + the single-channel operand cached in PaddedWeights, committed next)
export PYTHONPATH=$PWD; nvidia-smi --query-gpu=name --format=csv,noheader; timeout 100 python3 tests/benchmarks/vista3d_fused.py --device cuda --profile 1 > $OUT/fused_idle1.txt 2>&1; grep -A16 "idle GPU before" $OUT/fused_idle1.txt | head -24; grep "without the profiler\|idle between" $OUT/fused_idle1.txt
