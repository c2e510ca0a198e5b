#!/usr/bin/env bash
# Runs every fuzz target in turn for SECONDS_EACH seconds (default 600) and
# prints each target's final libFuzzer stats line. See README.md.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
seconds="${SECONDS_EACH:-600}"
for target in hook_state hook_toml oci_config request ldcache; do
  mkdir -p "corpus/$target"
  RUSTC_BOOTSTRAP=1 cargo fuzz run -O "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 > "logs-$target.txt" 2>&1
  echo "$target: exit $? $(grep -E '^stat::number_of_executed_units' "logs-$target.txt")"
done
