# issue 50 item 1 at c488e50 (norm in the class product by default, the resident kernel's statistics after the
# hand-over and masked on far-edge tiles only, the upsampling with its skip add): labels and clicks of a network
# trained on the phantom, fused against modules against upstream
set -u
export PYTHONPATH=$PWD:/tmp/deps
nvidia-smi --query-gpu=name --format=csv,noheader
bash tests/benchmarks/run_h200.sh $OUT setup trained_agreement click_agreement 2>&1 | grep -v Warn | tail -12
echo "total $SECONDS s"
