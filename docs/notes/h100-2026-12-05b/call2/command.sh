# session 2026-12-05b, call 2: labels of fused vs module vs upstream on the phantom-trained network, classes then clicks
O=$OUT/call2; mkdir -p $O; cp gpu_call2.sh $O/command.sh
bash tests/benchmarks/run_h200.sh $O setup >/dev/null; export PYTHONPATH=$PWD:/tmp/deps
UP="--device cuda --upstream /tmp/up"
s=$(date +%s); timeout 260 python3 tests/benchmarks/vista3d_trained_agreement.py $UP --checkpoint /tmp/trained_vista3d.pt --steps 400 --train-seconds 140 --json $O/trained_agreement.json > $O/trained_agreement.txt 2>&1; echo "trained_agreement rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
s=$(date +%s); timeout 300 python3 tests/benchmarks/vista3d_click_agreement.py $UP --checkpoint /tmp/trained_vista3d.pt --point-steps 300 --train-seconds 120 --json $O/click_agreement.json > $O/click_agreement.txt 2>&1; echo "click_agreement rc=$? $(( $(date +%s) - s )) s" | tee -a $O/log.txt
tail -30 $O/trained_agreement.txt; tail -40 $O/click_agreement.txt
