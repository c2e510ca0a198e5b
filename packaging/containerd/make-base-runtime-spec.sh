#!/usr/bin/env bash
# Writes containerd's base runtime spec for Tessera: the default OCI spec of the
# installed containerd (`ctr oci spec`) with tessera-hook added as a
# createContainer and a poststop hook, each with an explicit env.
#
# containerd uses base_runtime_spec as the *whole* starting spec of every
# container of that runtime handler, so it must be generated from the installed
# containerd's own default, not written by hand; regenerate it after upgrading
# containerd. Usage: make-base-runtime-spec.sh [OUTPUT] (default: stdout).
set -euo pipefail
hook=${TESSERA_HOOK_PATH:-/usr/bin/tessera-hook}
env_path='PATH=/usr/sbin:/usr/bin:/sbin:/bin'
spec=$(ctr oci spec | jq --arg hook "$hook" --arg env "$env_path" '
    .hooks.createContainer = ((.hooks.createContainer // []) + [{path: $hook, args: ["tessera-hook", "prestart"], env: [$env], timeout: 10}])
  | .hooks.poststop = ((.hooks.poststop // []) + [{path: $hook, args: ["tessera-hook", "poststop"], env: [$env], timeout: 10}])')
if [ $# -gt 0 ]; then
    tmp=$(mktemp "$1.XXXXXX")
    printf '%s\n' "$spec" >"$tmp"
    chmod 0644 "$tmp"
    mv "$tmp" "$1"
else
    printf '%s\n' "$spec"
fi
