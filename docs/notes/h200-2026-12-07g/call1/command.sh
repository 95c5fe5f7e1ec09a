# first call of the sixteenth session: main (f2e563d) against the branch resident-interior-stats (f8ce02d, its
# statistics' voxel mask built only on far-edge tiles) in the forward and the resident kernel's bench, the branch's
# resident tests, then main's kernel profile at 14 and 1 windows
# (f8ce02d was the branch's commit; main holds its tree as 10c0ca4, its message amended with these numbers)
set -u
R=$PWD
export PYTHONPATH=$R:/tmp/deps
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
bash tests/benchmarks/run_h200.sh $OUT setup >/dev/null 2>&1
(cd /tmp && PYTHONPATH=$R/branch_head:$R:/tmp/deps python3 -c "import monai; print(monai.__file__)")
echo "=== main forward + profile"
timeout 200 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --repeats 5 --profile 14,1 > $OUT/main_forward.txt 2>&1
echo "rc=$? $SECONDS s"; grep "bs\|vs\|Error\|error" $OUT/main_forward.txt | grep -v Warn | tail -12
echo "=== branch forward"
PYTHONPATH=$R/branch_head:$R:/tmp/deps timeout 150 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --repeats 5 > $OUT/branch_forward.txt 2>&1
echo "rc=$? $SECONDS s"; grep "bs\|vs\|Error\|error" $OUT/branch_forward.txt | grep -v Warn | tail -12
echo "=== resident bench main, branch"
timeout 100 python3 tests/benchmarks/experiments/gluon_conv3d/resident_weights.py > $OUT/resident_main.txt 2>&1; echo "rc=$? $SECONDS s"
PYTHONPATH=$R/branch_head:$R:/tmp/deps timeout 100 python3 tests/benchmarks/experiments/gluon_conv3d/resident_weights.py > $OUT/resident_branch.txt 2>&1; echo "rc=$? $SECONDS s"
grep "slab loads" $OUT/resident_main.txt $OUT/resident_branch.txt | cut -c1-260
echo "=== branch resident tests"
PYTHONPATH=$R/branch_head:$R:/tmp/deps timeout 100 python3 -m pytest -q -p no:cacheprovider -n 8 tests/networks/kernels/test_conv3d_resident.py tests/networks/test_vista3d_fused.py > $OUT/branch_tests.txt 2>&1
echo "rc=$?"; tail -3 $OUT/branch_tests.txt
echo "total $SECONDS s"
