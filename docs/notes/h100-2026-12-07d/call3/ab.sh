# A/B of the fused forward: HEAD's package (base_head/, untracked) against the working tree, in one call
set -u
B="python3 tests/benchmarks/vista3d_fused.py --device cuda --forward --repeats 5"
for round in 1 2; do
  for side in base new; do
    if [ $side = base ]; then PP=$PWD/base_head:$PWD; else PP=$PWD; fi
    echo "=== round $round $side"
    PYTHONPATH=$PP python3 -c "import monai; print(monai.__file__)"
    if [ $round = 1 ]; then S=14,1; else S=1; fi
    PYTHONPATH=$PP timeout 200 $B --sw-batch-sizes $S --json $OUT/${side}_$round.json 2>&1 | grep -v Warning | tail -14
  done
done
