#!/usr/bin/env bash
# The same 2-process ZeRO-3 launch N times in a row (default 20): NCADistillationTrainer, full fine-tuning, 2 steps,
# on the tiny test model, as tests/project/test_launches.py::test_distillation_trainer_under_zero3 runs it. Prints each exit
# code and the count of non-zero ones; run it while another job loads the cores, where a process left with its
# backend's threads at exit used to abort (SIGABRT, exit -6) after a good run.
#     bash benchmarks/launch_exits.sh [N]
set -uo pipefail
cd "$(dirname "$0")/.."
n=${1:-20}
work=$(mktemp -d)
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
python -c "from trl_nca.testing import save_tiny_model; save_tiny_model('$work/tiny', seed=0)" >/dev/null 2>&1
failed=0
for i in $(seq 1 "$n"); do
    port=$((20000 + RANDOM % 20000))
    python -m accelerate.commands.launch --config_file examples/accelerate/zero3.yaml --num_processes 2 \
        --mixed_precision no --main_process_port "$port" tests/scripts/ds_distill.py "$work/out$i" "$work/tiny" \
        >"$work/log$i" 2>&1
    rc=$?
    echo "launch $i: exit $rc"
    if [ "$rc" != 0 ]; then failed=$((failed + 1)); tail -n 5 "$work/log$i"; fi
done
echo "$failed of $n launches exited non-zero (logs in $work)"
