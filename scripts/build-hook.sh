#!/usr/bin/env bash
# Builds the statically linked tessera-hook (see hook/scripts/build-static.sh)
# and prints its path. Usage: scripts/build-hook.sh [release|debug]
exec bash "$(dirname "${BASH_SOURCE[0]}")/../hook/scripts/build-static.sh" "$@"
