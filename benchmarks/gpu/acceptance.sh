#!/usr/bin/env bash
# The whole GPU acceptance in one command, within one time budget, on a GPU machine with no
# network: installs the wheels carried in the checkout's git-ignored wheels/ (fetched
# beforehand on a networked machine, see benchmarks/gpu/README.md), then runs the parts
# named (default: all, in this order) and leaves each part's JSON and log in $OUT (default
# benchmarks/gpu/results). A part is cut off when the budget runs out; what it wrote so
# far stays. Eight files at most (what a device call brings back): summary.txt, the three
# JSONs and four logs.
#
#   BUDGET_S=560 benchmarks/gpu/acceptance.sh [llm] [conformance] [tune] [serve]
#
#   llm          benchmarks/gpu/llm_acceptance.py (demo, Llama-3.2-1B and -3.1-8B shapes)
#   conformance  the OpenAI server's tests (tests/llm/server) with the server on the GPU
#   tune         benchmarks/gpu/tune_acceptance.py (tune with the device as an axis, served)
#   serve        benchmarks/gpu/serve_acceptance.py (the torch engine's GPU forms, served)
#
# DEVICE=cpu runs the same parts on a CPU, small (each script's --quick): how this script
# is checked without a GPU.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-benchmarks/gpu/results}
mkdir -p "$out"
budget=${BUDGET_S:-560}
device=${DEVICE:-cuda}
quick=()
[ "$device" = cpu ] && quick=(--device cpu --quick)
start=$SECONDS
parts=("$@")
[ ${#parts[@]} -eq 0 ] && parts=(llm conformance tune serve)

if compgen -G "wheels/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site wheels/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD/src
else
  export PYTHONPATH=$PWD/src
fi
export PYTHONUNBUFFERED=1
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  || lscpu | grep "Model name"; } > "$out/summary.txt" 2>&1
python3 -c "import torch; print(torch.__version__, torch.version.cuda)" >> "$out/summary.txt"

left() { echo $((budget - (SECONDS - start))); }
for part in "${parts[@]}"; do
  t=$(left)
  if [ "$t" -le 20 ]; then echo "[$part] skipped: the budget ran out" | tee -a "$out/summary.txt"; continue; fi
  echo "[$part] starting with ${t} s left"
  case $part in
    llm)
      # Sections start while a minute is left of this part's share; the last may run on.
      timeout "$t" python3 benchmarks/gpu/llm_acceptance.py --budget-s $((t > 360 ? 240 : (t > 90 ? t - 60 : 30))) \
        "${quick[@]}" --out "$out/llm_acceptance.json" > "$out/llm.log" 2>&1 ;;
    conformance)
      TURBOINFER_TEST_LLM_DEVICE=$device timeout "$t" python3 -m pytest -q -p no:cacheprovider \
        tests/llm/server > "$out/conformance.log" 2>&1 ;;
    tune)
      timeout "$t" python3 benchmarks/gpu/tune_acceptance.py "${quick[@]}" \
        --out "$out/tune_acceptance.json" > "$out/tune.log" 2>&1 ;;
    serve)
      timeout "$t" python3 benchmarks/gpu/serve_acceptance.py "${quick[@]}" \
        --out "$out/serve_acceptance.json" > "$out/serve.log" 2>&1 ;;
    *) echo "unknown part $part (llm, conformance, tune, serve)"; exit 2 ;;
  esac
  echo "[$part] exit $? after $((SECONDS - start)) s" | tee -a "$out/summary.txt"
  tail -3 "$out/$part.log" 2>/dev/null
done
