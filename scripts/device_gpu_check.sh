#!/usr/bin/env bash
# gpu_check.py's device-independent parts on a lent GPU machine whose image has torch / transformers / peft
# but not this project's other dependencies (no installs there): the package mapped by symlinks, the
# embedded engine's check and one update of the log-prob pass on the demo's shipped model.
#   bash scripts/device_gpu_check.sh OUT_DIR [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?out dir}; PY=${2:-python3}
NS=$(mktemp -d); mkdir -p "$NS/teamtr"
for d in graphs training serving evals cli; do ln -s "$PWD/$d" "$NS/teamtr/$d"; done
MODEL=$(ls -d training/warmstart/shipped/*/ | head -1)
export PYTHONPATH="$NS:$PWD/scripts:${PYTHONPATH:-}" PYTHONUNBUFFERED=1
"$PY" scripts/gpu_check.py --update-only --model "$MODEL" --out "$OUT/gpu_update.json" "${@:3}"
"$PY" - "$MODEL" "$OUT/gpu_embedded.json" "${@:3}" <<'PY'
import json, sys
import gpu_check as g
from teamtr.engines.embedded import EmbeddedEngine
model, out = sys.argv[1], sys.argv[2]
device = "cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu" else "cuda"
tok = EmbeddedEngine(model, device="cpu", dtype="float32").tokenizer()
texts = (g.PROMPTS * 8)[:64]
res = g.embedded_check(model, device, "float32" if device == "cpu" else "bfloat16", [tok(t)["input_ids"] for t in texts], 64)
print(json.dumps(res)); open(out, "w").write(json.dumps(res, indent=1))
PY
