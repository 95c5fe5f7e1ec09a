# call 1 (H200, HEAD 3d897aa, carry .wheels)
export BASE_REV=b42e0bf PYTHONPATH=$PWD:/tmp/deps COLD_REPEATS=4; bash tests/benchmarks/run_h200.sh $OUT setup end_to_end startup_profile startup_base cold_quick > $OUT/call1.log 2>&1; python3 tests/benchmarks/experiments/label_map_transfer.py --repeats 5 --size 512,512,480 > $OUT/lmt480.log 2>&1
