# issue 50 item 1 at HEAD dcebc72 (monai/ as at fbc0649): trained-network and click agreement, fused = modules =
# upstream, on an H100 (carry: .wheels)
export PYTHONPATH=$PWD:/tmp/deps; mkdir -p $OUT/call1; (nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; bash tests/benchmarks/run_h200.sh $OUT/call1 setup trained_agreement click_agreement; echo "total $SECONDS s") > $OUT/call1/stdout.txt 2>&1; tail -40 $OUT/call1/stdout.txt
