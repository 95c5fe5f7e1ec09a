# (run at a0e3857: the variant named normproduct there is norm_in_product=True, the default since e2f3da3)
# the opt-in forms against the default at 14 and 1 windows (one process), the statistics' order in the resident
# kernel, then the kernels' and the fused network's GPU tests (the budget left allows no whole suite)
set -u
R=$PWD
export PYTHONPATH=$R:/tmp/deps
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
bash tests/benchmarks/run_h200.sh $OUT setup >/dev/null 2>&1
echo "=== candidates"
timeout 220 python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --sw-batch-sizes 14,1 --triton-conv default,normproduct,resident96,96p2 --repeats 5 --json $OUT/candidates.json > $OUT/candidates.txt 2>&1
echo "rc=$? $SECONDS s"; grep "bs\|vs\|Error\|error" $OUT/candidates.txt | grep -v Warn | tail -30
bash tests/benchmarks/run_h200.sh $OUT stats_order 2>&1 | grep -v Warn | tail -8
echo "=== GPU tests at $SECONDS s"
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 12 tests/networks tests/inferers > $OUT/pytest_networks.txt 2>&1
echo "rc=$?"; tail -3 $OUT/pytest_networks.txt; grep -E "^(FAILED|ERROR)" $OUT/pytest_networks.txt | head -20
echo "total $SECONDS s"
