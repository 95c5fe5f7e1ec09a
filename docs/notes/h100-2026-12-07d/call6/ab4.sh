# the session's final state: HEAD against the session's starting commit (base_head/), then the GPU suite
set -u
R=$PWD
export PYTHONPATH=$R:/tmp/deps
bash tests/benchmarks/run_h200.sh $OUT setup > /dev/null 2>&1
B="python3 $R/tests/benchmarks/vista3d_fused.py --device cuda --forward --repeats 5"
for side in new base; do
  echo "=== $side"
  if [ $side = base ]; then PP=$R/base_head:$R:/tmp/deps; else PP=$R:/tmp/deps; fi
  PYTHONPATH=$PP timeout 150 $B --sw-batch-sizes 14,1 --json $OUT/${side}_$SECONDS.json 2>&1 | grep -v Warn | grep "bs\|vs\|Error"
done
bash tests/benchmarks/run_h200.sh $OUT pytest_gpu 2>&1 | tail -8
