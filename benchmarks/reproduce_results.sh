#!/usr/bin/env bash
# Rerun every experiment of docs/results.md, then rebuild its tables and figures from the new summaries.
#
#   bash benchmarks/reproduce_results.sh              # all of them (organism: about an hour on 2 CPU cores;
#                                                     # the embedded model's runs: several hours)
#   bash benchmarks/reproduce_results.sh org-main     # only the named ones (examples/configs/results/<name>.yaml)
#
# Each experiment is one `trl-nca compare` run into outputs/results/<name>/. It is resumable: a killed run, started
# again, skips the students whose training finished (their done.json) and the evaluation records already written.
# Afterwards each comparison.json is copied to docs/results/data/<name>.json and docs/results.md is rebuilt, so
# `git diff docs/results` shows what changed against the committed numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" TOKENIZERS_PARALLELISM=false

if [ "$#" -gt 0 ]; then
    names=("$@")
else
    # the budget runs first: they fix the training budgets the other runs use
    names=(fr-budget isl-budget org-main org-100 org-sweep org-sweep-100 org-adaptive org-adaptive-100 org-gated fr-main
           flip-budget facts-budget org10-shift org10-flip org10-facts org10-shift-schedules units-shift units-flip
           units-shift-40 units-shift-late units-facts anchor-shift anchor-facts pilot-town town-budget fr-30
           fr-30-fast fr-30-default main-quick pilot-quill pilot-plusone pilot-friend pilot-swap twice)
    # pilot-quill07 (docs/results.md 13.3, candidate 5) was written down but not run: candidate 4 qualified first
fi
for name in "${names[@]}"; do
    config="examples/configs/results/${name}.yaml"
    [ -f "$config" ] || { echo "No experiment named $name: $config does not exist." >&2; exit 2; }
    echo "=== ${name} ($(date -u +%H:%M:%S) UTC)"
    SECONDS=0
    case "$name" in
        pilot-*)  # a pilot of docs/results.md section 11.1 or 13: the base only, one slice, no table
            trl-nca compare --config "$config" --slice base
            echo "=== ${name}: ${SECONDS} s"
            continue ;;
        fr-30)  # run as committed slices (section 11.1), the table built from them
            for unit in base opd-seed0 nca-seed0 opd-seed1 nca-seed1 opd-seed2 nca-seed2; do
                trl-nca compare --config "$config" --slice "$unit"
            done
            trl-nca compare --config "$config" --from_slices true ;;
        fr-30-default)  # section 12: the gated units as slices beside fr-30-fast's (copied), the table from them
            for unit in gated-seed0 gated-seed1 gated-seed2; do
                trl-nca compare --config "$config" --slice "$unit"
            done
            trl-nca compare --config "$config" --from_slices true ;;
        fr-30-fast)  # the whole job in one command (section 11.6), then its units' slices from the finished run
            trl-nca compare --config "$config"
            for unit in base opd-seed0 nca-seed0 opd-seed1 nca-seed1 opd-seed2 nca-seed2; do
                trl-nca compare --config "$config" --slice "$unit"
            done
            trl-nca compare --config "$config" --from_slices true ;;
        twice)  # section 13: its 19 units as slices (each in an output folder of its own), the table from them
            for unit in base opd-10-seed0 nca-10-seed0 gated-10-seed0 opd-40-seed0 nca-40-seed0 gated-40-seed0 \
                        opd-10-seed1 nca-10-seed1 gated-10-seed1 opd-40-seed1 nca-40-seed1 gated-40-seed1 \
                        opd-10-seed2 nca-10-seed2 gated-10-seed2 opd-40-seed2 nca-40-seed2 gated-40-seed2; do
                trl-nca compare --config "$config" --slice "$unit" --output_dir "outputs/results/${name}/${unit}"
            done
            trl-nca compare --config "$config" --from_slices true ;;
        main-quick)  # the quick job itself (section 10.6: its config is examples/configs/main_quick.yaml)
            trl-nca compare --config "$config" --output_dir "outputs/results/${name}" ;;
        *)
            trl-nca compare --config "$config" ;;
    esac
    echo "=== ${name}: ${SECONDS} s"
    python docs/results/build.py --add "${name}=outputs/results/${name}"
done
