#!/usr/bin/env bash
# Builds .gpu/ (git-ignored through .git/info/exclude) for benchmarks/gpu_configs.py on the device machine, which
# reaches no hub and lacks pydantic: the saved tokenizers, SmolLM2-135M-Instruct's config (its architecture runs at
# random weights there), SST-2 and the HH-RLHF harmless pairs from ../shared/data, and pydantic's wheels for the
# device's Python 3.12 (about 6 MB in all). Run here, from the repo root, after `make venv`:
#   benchmarks/gpu_assets.sh
# then on the device machine (carry: [".gpu"]):
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl &&
#   PYTHONPATH=/tmp/site:src python3 benchmarks/gpu_configs.py --assets .gpu --out $OUT
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qsx '/.gpu/' .git/info/exclude || echo /.gpu/ >> .git/info/exclude
data=${COLLABALIGN_DATA:-../shared/data}
mkdir -p .gpu/data/glue .gpu/data/hh-rlhf .gpu/whl
cp -r "$data/glue/SST-2" .gpu/data/glue/
cp "$data/hh-rlhf/harmless-base-test.jsonl.gz" .gpu/data/hh-rlhf/
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 .venv/bin/python - <<'PY'
from collabalign.models.backbones import minilm_l6, smollm2_135m

smol = smollm2_135m()
smol.tokenizer.save_pretrained(".gpu/tok/smollm2")
smol.model.config.save_pretrained(".gpu/smollm2")
minilm_l6().tokenizer.save_pretrained(".gpu/tok/minilm")
PY
wheels=$(grep -iE '^(pydantic|pydantic_core|annotated-types|typing-inspection)==' requirements.txt)
.venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl $wheels
du -sh .gpu
