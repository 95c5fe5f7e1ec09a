# issue 50 item 1 at HEAD dcebc72: the whole unit suite on the same warm H100 (the serve wheels carried; the tests that
# need SimpleITK or schemathesis left out as run_h200.sh's NOT_CARRIED says)
export PYTHONPATH=$PWD:/tmp/deps; mkdir -p $OUT/call2; (nvidia-smi --query-gpu=name,driver_version --format=csv; bash tests/benchmarks/run_h200.sh $OUT/call2 pytest_gpu; echo "total $SECONDS s") > $OUT/call2/stdout.txt 2>&1; tail -30 $OUT/call2/stdout.txt
