#!/usr/bin/env bash
# The drafter comparison of benchmarks/bench_eagle3.py confirmed in vLLM (benchmarks/bench_eagle3.md's vLLM figure):
# one lab experiment per draft on code:validation (greedy, 48 tokens, k 2,3,4, 2 repeats), then `draftlab confirm`
# of each experiment's chosen configuration in vLLM's server at concurrency 1 (2 passes per server), three times per
# draft, interleaved (1 2 3, 1 2 3, 1 2 3): one confirm's interval resamples its passes within one pair of server starts,
# and on this CPU the speedup moves by more than that from one confirm to the next (benchmarks/bench_eagle3.md). Suffix decoding
# is left out: vLLM's needs arctic-inference, which does not install on a CPU-only machine.
#
#   ./benchmarks/bench_eagle3_vllm.sh [OUT_DIR]     # the JSON documents go to OUT_DIR (default: a temporary one)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-$(mktemp -d)}"
mkdir -p "$out"
db="sqlite:///$out/bench_eagle3_vllm.db"
specs=("--draft demo-eagle3" "--draft demo-draft-distilled" "--drafter prompt-lookup:3")
for i in 1 2 3; do
  spec="${specs[$((i - 1))]}"
  # shellcheck disable=SC2086
  draftlab run --target demo-target $spec --prompts code:validation --k 2,3,4 --max-new-tokens 48 --repeats 2 \
    --db "$db" --name "bench_eagle3_vllm $spec" --json > "$out/run_$i.json"
  echo "$spec: $out/run_$i.json"
done
for pass in 1 2 3; do
  for i in 1 2 3; do
    draftlab confirm "$i" --concurrency 1 --repeats 2 --db "$db" --json > "$out/confirm_${i}_$pass.json"
    echo "${specs[$((i - 1))]}: $out/confirm_${i}_$pass.json"
  done
done
