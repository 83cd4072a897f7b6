#!/usr/bin/env bash
# Computes one piece of a long main form into the per-run caches under results/<run>/, which a later
# `collabalign run <config> --out results/<run>` reads back (results/README.md). Each piece runs in its own
# scratch folder under runs/ (its report is discarded) whose cache folder links to the shared one, so pieces
# can run side by side, one per core, and across sessions.
# usage: results/compute.sh fslora-synthetic | fslora-glue TASK... | pshare-synthetic | pshare-bandit-federated |
#        pshare-text SOURCE... | firm-lm ARM... | meta-reward DOMAIN...
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg PATH="$PWD/.venv/bin:$PATH"

piece() {  # piece NAME RUN CACHE... -- collabalign run ARGS...: the scratch folder runs/piece-NAME
    local name=$1 run=$2 scratch=runs/piece-$1; shift 2
    mkdir -p "$scratch"
    while [ "$1" != -- ]; do
        mkdir -p "results/$run/$1"; ln -sfn "$PWD/results/$run/$1" "$scratch/$1"; shift
    done
    shift
    echo "== $name from $(date -u +%H:%M:%S)"
    collabalign run "$@" --out "$scratch" --force --no-progress
    echo "== $name done $(date -u +%H:%M:%S)"
}

main_budget_task() {  # glue.budget_task of fslora/main.yaml, read from the config so it is stated once
    sed -n 's/^ *budget_task: *\([^ #]*\).*/\1/p' src/collabalign/configs/fslora/main.yaml
}

what=$1; shift
case $what in
    fslora-synthetic)
        piece fslora-synthetic fslora-main fslora_synthetic_runs -- fslora/main "glue.tasks=[]" glue.budget_task=null ;;
    fslora-glue)
        for task in "$@"; do
            # ablations stay on: their settings are in the synthetic runs' key, so turning them off would recompute
            # (and overwrite) the synthetic E1 runs under another key; once fslora-synthetic ran, they are all cached
            budget=null; [ "$task" = "$(main_budget_task)" ] && budget=$task  # E2 on GLUE runs with that task
            piece "fslora-$task" fslora-main fslora_synthetic_runs fslora_glue_runs -- fslora/main \
                "glue.tasks=[$task]" glue.budget_task=$budget theory.run=false
        done ;;
    pshare-synthetic)  # the main comparison and sweeps; one worker process here, as the text pieces use the others
        piece pshare-synthetic pshare-main pshare_synthetic_fits -- pshare-lora/main workers=1 bandit.run=false \
            federated.run=false text.run=false ;;
    pshare-bandit-federated)
        piece pshare-bandit-federated pshare-main pshare_bandit_runs pshare_federated_runs -- pshare-lora/main \
            "methods=[]" text.run=false ;;
    pshare-text)
        for source in "$@"; do
            piece "pshare-$source" pshare-main pshare_text_fits -- pshare-lora/main "methods=[]" bandit.run=false \
                federated.run=false "text.sources=[$source]"
        done ;;
    firm-lm)  # the named LM arms (e.g. p1/p2=0.1 firm), every seed, in one process
        arms=$(IFS=,; echo "$*")
        piece "firm-lm-${1//\//_}" firm-main lm_runs -- firm/main solver.run=false quadratic.run=false \
            momdp.run=false toy.run=false "lm.only=[$arms]" ;;
    meta-reward)  # the sentiment cells of the named held-out domains, every seed (the trunk-state cache shared)
        for domain in "$@"; do
            piece "meta-reward-$domain" meta-reward-main meta_reward_cells meta_reward_cache -- meta_reward/main \
                bandit.run=false "sentiment.held_out=[$domain]"
        done ;;
    *) echo "usage: $0 fslora-synthetic | fslora-glue TASK... | pshare-synthetic | pshare-bandit-federated |" \
            "pshare-text SOURCE... | firm-lm ARM... | meta-reward DOMAIN..." >&2
       exit 2 ;;
esac
