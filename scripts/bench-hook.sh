#!/usr/bin/env bash
# Benchmark of tessera-hook on a simulated node, side by side in one hyperfine
# run, as root:
#
#  (a) the hook's own wall time, against a static no-op binary (cc -static; it
#      only drains stdin), all fed an OCI state on stdin by a tiny static
#      `feed` program whose own cost is measured and taken out:
#        - a container without an allocation (the fast path every container
#          pays when the hook is registered for all of them)     goal <= 1.2x no-op
#        - a GPU container whose devices are already in config.json (a CDI
#          runtime or containerd 1.6's native Allocate put them there): the
#          binding path — read state, config, spec; record the binding      goal <= 2x no-op
#      Legacy injection (mknod, cgroup, mounts in the container's mount
#      namespace) needs a live container, so it is measured in (b) only.
#  (b) a whole `runc run` (create, hooks, start, exit, delete, poststop) of a
#      busybox container:
#        - without GPU and without the hook (baseline)
#        - without GPU, hook registered (fast path)
#        - with GPU: the hook injects the allocation (legacy mode)  goal <= 1.10x baseline
#
# TESSERA_BENCH_QUICK=1 uses the debug build and few runs (a smoke test for CI).
# TESSERA_BENCH_BASELINE_HOOK=FILE adds the binding rows of another hook build
# (e.g. the last release) to the same hyperfine runs, for a side-by-side
# comparison of a change.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

if [ "$(id -u)" != 0 ]; then
    echo "bench-hook: run as root (containers, mknod, mounts)" >&2
    exit 1
fi
for tool in runc hyperfine jq cc unshare busybox; do
    command -v "$tool" >/dev/null || { echo "bench-hook: $tool is not installed" >&2; exit 1; }
done

target=x86_64-unknown-linux-gnu
if [ "${TESSERA_BENCH_QUICK:-0}" = 1 ]; then
    profile=debug; runs=5; runs_b=3; warmup=1; cargo_profile=()
else
    profile=release; runs=${TESSERA_BENCH_RUNS:-500}; runs_b=${TESSERA_BENCH_RUNS_B:-150}; warmup=20
    cargo_profile=(--release)
fi
# The hook exactly as shipped: static.
bash scripts/build-hook.sh "$profile" >/dev/null
cargo build --locked "${cargo_profile[@]}" -p tessera-cdi -p tessera-sim -p tessera-sim-nvml -p tessera-sim-cuda
bin="$PWD/target/$profile"
hook="$PWD/target/$target/$profile/tessera-hook"
busybox=$(command -v busybox)

# Root-owned scratch dir (the hook trusts only specs and config in directories
# no one else can write).
work=$(mktemp -d /tmp/tessera-bench-hook.XXXXXX)
sleeper=
cleanup() {
    for id in tb-nogpu tb-nogpu-hook tb-cdi tb-gpu tb-base; do runc delete -f "$id-$$" >/dev/null 2>&1 || true; done
    [ -n "$sleeper" ] && kill "$sleeper" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# --- the simulated node, its static spec, one allocation's transient spec
"$bin/tessera-sim" create --profile demo --root "$work/node" >/dev/null
# TESSERA_BENCH_STATE_DIR: where binding records go (default: on disk, like
# /var/lib/tessera; point it at a tmpfs directory to see what fsync costs).
state_dir=${TESSERA_BENCH_STATE_DIR:-$work/state}
mkdir -p "$work/cdi" "$state_dir" "$work/files"
chmod 0755 "$work/cdi" "$state_dir" "$work/files"
"$bin/tessera-cdi" generate --driver-root "$work/node" --hook-path "$hook" \
    --output "$work/cdi/tessera.io-gpu.json" 2>/dev/null
alloc=bench-0
echo "stand-in vGPU library" >"$work/files/libtessera_vgpu.so"
echo "/usr/local/tessera/libtessera_vgpu.so" >"$work/files/ld.so.preload"
echo '{"version":1,"devices":[]}' >"$work/files/vgpu.json"
jq --arg id "$alloc" --arg files "$work/files" --arg hook "$hook" '
  def ro($src; $dst): {hostPath: $src, containerPath: $dst, options: ["ro","nosuid","nodev","bind","rprivate"]};
  { cdiVersion: .cdiVersion, kind: "tessera.io/alloc",
    devices: [{ name: $id, containerEdits: {
      env: ["TESSERA_ALLOC_ID=" + $id],
      deviceNodes: (.containerEdits.deviceNodes + ([.devices[] | select(.name | test(":"))][0].containerEdits.deviceNodes)),
      mounts: [ro($files + "/libtessera_vgpu.so"; "/usr/local/tessera/libtessera_vgpu.so"),
               ro($files + "/ld.so.preload"; "/etc/ld.so.preload"),
               ro($files + "/vgpu.json"; "/usr/local/tessera/vgpu.json")],
      hooks: [{hookName: "createContainer", path: $hook, args: ["tessera-hook","prestart"], env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]},
              {hookName: "poststop", path: $hook, args: ["tessera-hook","poststop"], env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}]
    }}]}' "$work/cdi/tessera.io-gpu.json" >"$work/cdi/tessera.io-alloc_$alloc.json"
chmod 0644 "$work/cdi/"*.json
# The transient spec is complete by the contract (TESSERA_ALLOC_ID, both hooks).
"$bin/tessera-cdi" validate "$work/cdi/tessera.io-alloc_$alloc.json" >/dev/null
printf 'cdi_dir = "%s"\nstate_dir = "%s"\n' "$work/cdi" "$state_dir" >"$work/hook.toml"

# --- static no-op: reads the state like any hook must (crun dies of SIGPIPE
# when a hook exits before it has written the state), then exits.
printf '#include <unistd.h>\nint main(void) { char b[4096]; while (read(0, b, sizeof b) > 0) {} return 0; }\n' >"$work/noop.c"
cc -static -O2 -o "$work/noop" "$work/noop.c"
# --- feed FILE PROG ARGS...: opens FILE as stdin and execs PROG. hyperfine
# 1.15 (Debian 12) has no --input, and a shell per run (~1 ms of noise to
# subtract) would drown a ~1 ms hook; `feed` costs one static exec, the same in
# every row, and is measured alone (`feed` + no-op vs no-op) to take it out.
cat >"$work/feed.c" <<'C'
#include <fcntl.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int fd = open(argv[1], O_RDONLY | O_CLOEXEC);
    if (fd < 0 || dup2(fd, 0) < 0) return 2;
    execv(argv[2], argv + 2);
    return 127;
}
C
cc -static -O2 -o "$work/feed" "$work/feed.c"

# --- bundles: one rootfs, configs differ only in what the benchmark varies
make_bundle() { # dir
    mkdir -p "$1/rootfs/bin"
    cp "$busybox" "$1/rootfs/bin/busybox"
    ln -sf busybox "$1/rootfs/bin/sh"
    ln -sf busybox "$1/rootfs/bin/true"
    (cd "$1" && rm -f config.json && runc spec)
    jq '.process.terminal = false | .process.args = ["/bin/true"] | .root.readonly = false' \
        "$1/config.json" >"$1/config.tmp" && mv "$1/config.tmp" "$1/config.json"
}
hooks_jq='.hooks = {prestart: [{path: $hook, args: ["tessera-hook","prestart","--config",$cfg], env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}],
                    poststop: [{path: $hook, args: ["tessera-hook","poststop","--config",$cfg], env: ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]}]}'
for b in nogpu nogpu-hook gpu bound bound-hook bound-a bound-baseline; do make_bundle "$work/$b"; done
jq --arg hook "$hook" --arg cfg "$work/hook.toml" "$hooks_jq" \
    "$work/nogpu-hook/config.json" >"$work/c" && mv "$work/c" "$work/nogpu-hook/config.json"
jq --arg hook "$hook" --arg cfg "$work/hook.toml" --arg id "$alloc" \
    "$hooks_jq | .annotations[\"tessera.io/alloc-id\"] = \$id" \
    "$work/gpu/config.json" >"$work/c" && mv "$work/c" "$work/gpu/config.json"
# "bound": the allocation's devices and mounts already in config.json, as a
# CDI-capable runtime leaves them.
jq --arg id "$alloc" --slurpfile spec "$work/cdi/tessera.io-alloc_$alloc.json" '
    ($spec[0].devices[0].containerEdits) as $e
  | .annotations["tessera.io/alloc-id"] = $id
  | .linux.devices = [$e.deviceNodes[] | {path, type, major, minor, fileMode: 438, uid: 0, gid: 0}]
  | .linux.resources.devices += [$e.deviceNodes[] | {allow: true, type, major, minor, access: "rw"}]
  | .mounts += [$e.mounts[] | {destination: .containerPath, type: "bind", source: .hostPath, options: .options}]' \
    "$work/bound/config.json" >"$work/c" && mv "$work/c" "$work/bound/config.json"
# "bound-hook": the same, with the hook registered — a GPU container on the
# CDI path (the runtime applied the edits; the hook only binds).
jq --arg hook "$hook" --arg cfg "$work/hook.toml" "$hooks_jq" \
    "$work/bound/config.json" >"$work/bound-hook/config.json"
baseline=${TESSERA_BENCH_BASELINE_HOOK:-}
baseline_a=() baseline_b=()
if [ -n "$baseline" ]; then
    jq --arg hook "$baseline" --arg cfg "$work/hook.toml" "$hooks_jq" \
        "$work/bound/config.json" >"$work/bound-baseline/config.json"
fi

# "bound-a": the same config for (a), in the host's pid namespace like the
# stand-in container below (a config asking for a new pid namespace would
# rightly make the hook refuse a process that has none).
jq '.linux.namespaces |= map(select(.type != "pid"))' "$work/bound/config.json" \
    >"$work/bound-a/config.json"

# --- OCI states for (a); the pid is a stand-in container that the hook can
# prove to be one: started by this script (the parent of hyperfine, which
# starts the hook), in a private mount namespace with the rootfs bind-mounted
# on itself and a procfs under it, as runc leaves a container at prestart.
mkdir -p "$work/bound-a/rootfs/proc"
unshare --mount --propagation private sh -c \
    'mount --bind "$0" "$0" && mount -t proc proc "$0/proc" && exec sleep 3600' \
    "$work/bound-a/rootfs" &
sleeper=$!
for _ in $(seq 100); do [ "$(cat /proc/$sleeper/comm)" = sleep ] && break; sleep 0.05; done
state() { # bundle annotations-json
    jq -n --arg b "$1" --argjson pid "$sleeper" --argjson ann "$2" \
        '{ociVersion: "1.0.2-dev", id: "tessera-bench", status: "created", pid: $pid, bundle: $b, annotations: $ann}'
}
state "$work/nogpu" '{}' >"$work/state-nogpu.json"
state "$work/bound-a" "{\"tessera.io/alloc-id\": \"$alloc\"}" >"$work/state-bound.json"
jq '.status = "stopped" | del(.pid)' "$work/state-bound.json" >"$work/state-bound-stop.json"
cfg="--config $work/hook.toml"

# Sanity: every command must succeed once before it is timed.
"$hook" prestart $cfg <"$work/state-nogpu.json"
"$hook" prestart $cfg <"$work/state-bound.json"
"$hook" poststop $cfg <"$work/state-bound-stop.json"

feed="$work/feed"
if [ -n "$baseline" ]; then
    baseline_a=(-p "$feed $work/state-bound-stop.json $baseline poststop $cfg"
        -n "feed + baseline hook, GPU container, devices in config.json (binding)"
        "$feed $work/state-bound.json $baseline prestart $cfg")
    baseline_b=(-n "runc run, GPU via CDI edits, baseline hook binds"
        "runc run --bundle $work/bound-baseline tb-base-$$")
fi
echo "== (a) hook wall time (static binaries exec'd directly; the state fed by $feed)"
hyperfine --style basic --shell=none --warmup "$warmup" --runs "$runs" --export-json "$work/a.json" \
    -p true -n "static no-op" "$work/noop" \
    -p true -n "feed + static no-op" "$feed $work/state-nogpu.json $work/noop" \
    -p true -n "feed + hook, container without allocation" \
        "$feed $work/state-nogpu.json $hook prestart $cfg" \
    -p "$feed $work/state-bound-stop.json $hook poststop $cfg" \
    -n "feed + hook, GPU container, devices in config.json (binding)" \
        "$feed $work/state-bound.json $hook prestart $cfg" \
    "${baseline_a[@]}"

echo "== (b) runc run (create, hooks, start, exit, delete, poststop)"
hyperfine --style basic --shell=none --warmup "$((warmup < 5 ? warmup : 5))" --runs "$runs_b" \
    --export-json "$work/b.json" \
    -n "runc run, no GPU, no hook" "runc run --bundle $work/nogpu tb-nogpu-$$" \
    -n "runc run, no GPU, hook registered" "runc run --bundle $work/nogpu-hook tb-nogpu-hook-$$" \
    -n "runc run, GPU via CDI edits, hook binds" "runc run --bundle $work/bound-hook tb-cdi-$$" \
    -n "runc run, GPU via hook (legacy injection)" "runc run --bundle $work/gpu tb-gpu-$$" \
    "${baseline_b[@]}"

ms() { jq -r --arg n "$2" '.results[] | select(.command == $n) | .median * 1000' "$1"; }
noop=$(ms "$work/a.json" "static no-op")
feed_noop=$(ms "$work/a.json" "feed + static no-op")
feed_fast=$(ms "$work/a.json" "feed + hook, container without allocation")
feed_bind=$(ms "$work/a.json" "feed + hook, GPU container, devices in config.json (binding)")
# Take the feeder out: hook = (feed + hook) - (feed + no-op) + no-op.
fast=$(awk -v a="$feed_fast" -v f="$feed_noop" -v n="$noop" 'BEGIN { print a - f + n }')
bind=$(awk -v a="$feed_bind" -v f="$feed_noop" -v n="$noop" 'BEGIN { print a - f + n }')
base=$(ms "$work/b.json" "runc run, no GPU, no hook")
reg=$(ms "$work/b.json" "runc run, no GPU, hook registered")
cdi=$(ms "$work/b.json" "runc run, GPU via CDI edits, hook binds")
gpu=$(ms "$work/b.json" "runc run, GPU via hook (legacy injection)")
row() { # name median reference goal
    awk -v n="$1" -v m="$2" -v r="$3" -v g="$4" 'BEGIN {
        ratio = (r > 0) ? m / r : 0
        printf "| %s | %.3f | %s | %s |\n", n, m, (r == m ? "1.00 (reference)" : sprintf("%.2f", ratio)), g }'
}
echo
echo "| benchmark ($profile build, $(nproc) CPUs, load $(cut -d' ' -f1 /proc/loadavg)) | median (ms) | ratio | goal |"
echo "|---|---|---|---|"
row "static no-op" "$noop" "$noop" ""
row "feed + static no-op (feeder cost, taken out below)" "$feed_noop" "$noop" ""
row "tessera-hook prestart, container without allocation (feeder taken out)" "$fast" "$noop" "<= 1.2x no-op"
row "tessera-hook prestart, GPU container, devices in config.json: binding (feeder taken out)" "$bind" "$noop" "<= 2x no-op"
row "runc run, no GPU, no hook" "$base" "$base" ""
row "runc run, no GPU, hook registered" "$reg" "$base" ""
row "runc run, GPU via CDI edits in config.json, hook binds (default path)" "$cdi" "$base" "<= 1.10x"
row "runc run, GPU injected by the hook (legacy path, no CDI in the runtime)" "$gpu" "$base" "<= 1.10x"
if [ -n "$baseline" ]; then
    feed_bind_base=$(ms "$work/a.json" "feed + baseline hook, GPU container, devices in config.json (binding)")
    bind_base=$(awk -v a="$feed_bind_base" -v f="$feed_noop" -v n="$noop" 'BEGIN { print a - f + n }')
    cdi_base=$(ms "$work/b.json" "runc run, GPU via CDI edits, baseline hook binds")
    row "baseline hook ($baseline): binding (feeder taken out)" "$bind_base" "$noop" ""
    row "baseline hook: runc run, GPU via CDI edits, hook binds" "$cdi_base" "$base" ""
fi

missed=$(awk -v n="$noop" -v f="$fast" -v b="$bind" -v base="$base" -v c="$cdi" -v g="$gpu" 'BEGIN {
    if (f > 1.2 * n) print "fast path " f / n "x no-op";
    if (b > 2 * n) print "binding " b / n "x no-op";
    if (c > 1.10 * base) print "runc run with GPU (CDI path) " c / base "x baseline";
    if (g > 1.10 * base) print "runc run with GPU (legacy path) " g / base "x baseline" }')
if [ -n "$missed" ]; then
    echo
    echo "goals missed ($profile build$([ "$profile" = release ] || echo ', a smoke run: goals are judged on the release build')):"
    echo "$missed"
    if [ "$profile" = release ]; then
        echo "GOAL MISSED" >&2
        exit 1
    fi
fi
