#!/usr/bin/env bash
# Tessera's whole flow on a simulated Kubernetes cluster, as root on a fresh
# Debian 12 machine (the README's first command):
#   - builds Tessera (dev profile) and its two .debs, and unpacks them into
#     the work directory (or, with --installed, uses the installed packages);
#   - brings up a two-node cluster with `tessera-sim cluster up`: stand-in API
#     server, scheduler and kubelets, one containerd 1.7 per node with CDI;
#     node-1 has an A100-40GB in MIG mode with no instances, node-2 an
#     H100-80GB for vGPU slices;
#   - runs the scheduler extender (the scheduler configured with the shipped
#     KubeSchedulerConfiguration) and one device plugin per node from the
#     packages' files, with the shipped cluster ConfigMap;
#   - applies the three pods of examples/ and shows what each one got.
#
# Usage: bash scripts/demo.sh [--installed | --images] [--no-build] [--keep] [--work-dir DIR]
#   --installed   run /usr/bin/tessera-* and /usr/lib/tessera/* of the
#                 installed tessera-node and tessera-cluster packages
#   --images      run the extender and the device plugins from the images
#                 the manifests name, built from the tessera-cluster .deb by
#                 scripts/image.sh, with podman: the plugin as the DaemonSet
#                 runs it (privileged, the host's pids), the extender as the
#                 Deployment does (uid 65532); the host network, as both
#                 listen on 127.0.0.1 here
#   --no-build    do not build (the binaries and, by default, the .debs exist)
#   --keep        leave the cluster up at the end and print how to explore it
#   --work-dir    everything the demo makes (default $TESSERA_DEMO_DIR, else
#                 /tmp/tessera-demo); emptied at the start, left for
#                 inspection at the end (logs under DIR/cluster/logs)
#
# Outside the work directory the demo changes only what the set-up installs
# (Debian packages, rustup, containerd 1.7 and kubectl under /opt/tessera-e2e):
# the nodes have their own CDI directories, no /etc or /var/run/cdi is written.
# (containerd 1.7's shims keep their sockets in /run/containerd/s while they
# run, whatever containerd's state directory; they remove them on exit.)
set -Eeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"

usage() {
    echo "usage: bash scripts/demo.sh [--installed | --images] [--no-build] [--keep] [--work-dir DIR]" >&2
    exit 2
}

installed=
images=
no_build=
keep=
work=${TESSERA_DEMO_DIR:-/tmp/tessera-demo}
while [ $# -gt 0 ]; do
    case "$1" in
    --installed) installed=1 ;;
    --images) images=1 ;;
    --no-build) no_build=1 ;;
    --keep) keep=1 ;;
    --work-dir)
        [ $# -ge 2 ] || usage
        work=$2
        shift
        ;;
    --work-dir=*) work=${1#--work-dir=} ;;
    -h | --help) usage ;;
    *)
        echo "demo.sh: unknown option $1" >&2
        usage
        ;;
    esac
    shift
done
case "$work" in
/ | "") echo "demo.sh: --work-dir must not be / or empty" >&2 && exit 2 ;;
esac
if [ -n "$installed" ] && [ -n "$images" ]; then
    echo "demo.sh: --installed and --images: choose one (the images are built from the .deb, not from what is installed)" >&2
    exit 2
fi

started=$(date +%s)
# Until the cluster exists (then `fail` below reports with its logs).
trap 'printf "\ndemo failed (scripts/demo.sh line %s)\n" "$LINENO" >&2' ERR
step() { printf '\n\033[1m== %s\033[0m\n' "$1"; [ $# -lt 2 ] || printf '   look at: %s\n' "$2"; }
elapsed() { echo "$(($(date +%s) - started)) s"; }

# ---------------------------------------------------------------- set-up
step "set-up: Debian packages, containerd 1.7, kubectl 1.32, Rust" \
    "nothing: this only installs what is missing (apt is skipped when all is there)"
if [ "$(id -u)" != 0 ]; then
    echo "demo.sh: run as root (simulated device nodes are made with mknod, containerd runs containers)" >&2
    exit 1
fi
apt_missing=()
for p in "${TESSERA_APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || apt_missing+=("$p")
done
if [ ${#apt_missing[@]} -gt 0 ]; then
    tessera_install_packages
fi
if [ -z "$no_build" ]; then
    tessera_install_rust
    # cargo-deb and the tools scripts/package.sh needs.
    if [ -z "$installed" ]; then
        tessera_install_packaging_tools --deb-only
    fi
fi
tessera_install_containerd
tessera_install_kubectl
tessera_fix_hybrid_cgroups

# ---------------------------------------------------------------- build
debug="$tessera_root/target/debug"
package_dir="$tessera_root/target/package"
if [ -z "$no_build" ]; then
    step "build (dev profile, target/debug: shared with the tests)" \
        "the paths of the two .debs at the end"
    export CARGO_INCREMENTAL=0
    if [ -z "$installed" ]; then
        # It builds the workspace (dev profile), then packs the .debs.
        bash scripts/package.sh --profile dev --deb-only
    else
        # The workspace, as scripts/test.sh and `package.sh --profile dev`
        # build it: a subset could unify dependency features differently.
        cargo build --workspace --locked
    fi
    echo "built, $(elapsed) after the demo started"
fi

# Where each program comes from: the .debs unpacked into the work dir
# (default) or the installed packages (--installed).
prefix=
if [ -n "$installed" ]; then
    source_of_binaries="the installed packages (/usr/bin, /usr/lib/tessera)"
    for package in tessera-node tessera-cluster; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed' ||
            { echo "demo.sh: --installed: the $package package is not installed (dpkg -i target/package/${package}_*.deb)" >&2 && exit 1; }
    done
else
    newest_deb() { { ls -t "$package_dir"/"$1"_*.deb 2>/dev/null || true; } | head -n1; }
    node_deb=$(newest_deb tessera-node)
    cluster_deb=$(newest_deb tessera-cluster)
    if [ -z "$node_deb" ] || [ -z "$cluster_deb" ]; then
        echo "demo.sh: no tessera-node/tessera-cluster .deb in $package_dir (run without --no-build)" >&2
        exit 1
    fi
    prefix="$work/pkg"
    source_of_binaries="the built packages' files, unpacked into $prefix"
fi

# A fresh work dir: an earlier demo's cluster is taken down first.
sim="$debug/tessera-sim"
for tool in tessera-sim tessera-cdi tessera-cuda-probe; do
    if [ ! -x "$debug/$tool" ]; then
        echo "demo.sh: $debug/$tool is missing (run without --no-build)" >&2
        exit 1
    fi
done
cluster="$work/cluster"
mkdir -p "$work"
# One demo per work dir at a time (scripts/test-packages.sh runs one too);
# the services it leaves running with --keep do not hold the lock.
exec 9>"$work/.lock"
flock -n 9 || { echo "demo.sh: another demo is using $work (--work-dir DIR for another)" >&2 && exit 1; }
if [ -f "$work/down.sh" ]; then
    bash "$work/down.sh" >/dev/null 2>&1 || true
elif [ -f "$cluster/cluster.json" ]; then
    "$sim" cluster down --root "$cluster" >/dev/null 2>&1 || true
fi
# Keep the image archives (slow to build) and the lock: everything else goes.
find "$work" -mindepth 1 -maxdepth 1 ! -name images ! -name .lock -exec rm -rf {} +
mkdir -p "$work/images"

if [ -n "$prefix" ]; then
    step "unpack the packages: dpkg-deb -x into $prefix" "the files the packages install, below $prefix"
    mkdir -p "$prefix"
    for deb in "$node_deb" "$cluster_deb"; do
        echo "$deb"
        dpkg-deb -x "$deb" "$prefix"
    done
fi
hook="$prefix/usr/bin/tessera-hook"
extender="$prefix/usr/bin/tessera-scheduler-extender"
plugin="$prefix/usr/bin/tessera-device-plugin"
plugin_dir="$prefix/usr/bin"
vgpu_lib="$prefix/usr/lib/tessera/libtessera_vgpu.so"
manifests="$prefix/usr/share/tessera/kubernetes"
for f in "$hook" "$extender" "$plugin" "$plugin_dir/kubectl-tessera" "$vgpu_lib"; do
    if [ ! -f "$f" ]; then
        echo "demo.sh: $f is missing ($source_of_binaries)" >&2
        exit 1
    fi
done
scheduler_config_src="$manifests/config/scheduler-config.yaml"
[ -f "$scheduler_config_src" ] || scheduler_config_src="$manifests/scheduler-config.yaml"
cluster_config_src="$manifests/cluster-config.yaml"
for f in "$scheduler_config_src" "$cluster_config_src"; do
    [ -f "$f" ] || { echo "demo.sh: $f is missing" >&2 && exit 1; }
done
# The containers' names: one set per work directory.
container_prefix="tessera-demo-$(printf '%s' "$work" | sha256sum | cut -c1-8)"
podman_run=(podman run --rm --replace --network=host "${TESSERA_PODMAN_LIMITS[@]}"
    -e TESSERA_LOG=info -e NO_COLOR=1)
if [ -n "$images" ]; then
    step "images: scripts/image.sh --deb $cluster_deb" \
        "the two images the manifests name, built from the package's files (no base image)"
    mapfile -t built_images < <(bash scripts/image.sh --deb "$cluster_deb")
    plugin_image=$(printf '%s\n' "${built_images[@]}" | grep -F 'tessera-device-plugin:' || true)
    extender_image=$(printf '%s\n' "${built_images[@]}" | grep -F 'tessera-scheduler-extender:' || true)
    [ -n "$plugin_image" ] && [ -n "$extender_image" ] || { echo "demo.sh: scripts/image.sh built ${built_images[*]:-nothing}" >&2 && exit 1; }
    podman images --filter "reference=$plugin_image" --filter "reference=$extender_image"
    extender=$extender_image plugin=$plugin_image
    source_of_binaries="the images (the extender, the plugin) and the packages' files unpacked into $prefix"
fi
echo "Tessera's programs come from $source_of_binaries:"
printf '  %s\n' "$extender" "$plugin" "$plugin_dir/kubectl-tessera" "$hook" "$vgpu_lib"
echo "the simulation (tessera-sim, tessera-cdi for the nodes' static specs, tessera-cuda-probe) from $debug"


kubectl_bin=${TESSERA_KUBECTL:-$TESSERA_KUBECTL_DIR/usr/bin/kubectl}
export KUBECONFIG="$cluster/kubeconfig"
# kubectl finds the kubectl-tessera plugin on PATH.
export PATH="$plugin_dir:$PATH"
k() { "$kubectl_bin" "$@"; }

# ---------------------------------------------------------------- failure handling
pids_file="$work/pids"
: >"$pids_file"
cluster_up=
# Everything of the cluster, stopped in order: the processes the demo started
# (extender, plugins), then the stand-ins, containerds and their containers.
write_down_script() {
    cat >"$work/down.sh" <<DOWN
#!/usr/bin/env bash
# Takes the demo's cluster down (written by scripts/demo.sh).
while read -r pid; do kill "\$pid" 2>/dev/null || true; done <"$pids_file"
# With --images: the containers (stopped by the kills above; this waits).
podman ps -aq --filter "name=^$container_prefix-" | xargs -r podman rm -f -t 10 >/dev/null 2>&1 || true
"$sim" cluster down --root "$cluster"
DOWN
}
teardown() {
    [ -n "$cluster_up" ] || return 0
    bash "$work/down.sh" || true
    cluster_up=
}
fail() {
    # In a command substitution's subshell: leave the report to the main shell.
    [ "$BASHPID" = "$$" ] || exit 1
    trap - ERR INT TERM
    printf '\n\033[1;31mdemo failed: %s\033[0m\n' "$*" >&2
    if [ -d "$cluster/logs" ]; then
        for log in "$cluster"/logs/*.log; do
            printf '\n--- %s (last 30 lines) ---\n' "$log" >&2
            tail -n 30 "$log" >&2 || true
        done
    fi
    if [ -n "$keep" ] && [ -n "$cluster_up" ]; then
        echo "The cluster stays up (--keep): KUBECONFIG=$KUBECONFIG; take it down with: bash $work/down.sh" >&2
    else
        teardown >&2
    fi
    echo "Logs and state are left in $work." >&2
    exit 1
}
trap 'fail "a command failed (line $LINENO)"' ERR
trap 'fail "interrupted"' INT TERM

# wait_for SECONDS WHAT COMMAND...: runs COMMAND until it succeeds.
wait_for() {
    local timeout=$1 what=$2
    shift 2
    local deadline=$(($(date +%s) + timeout))
    until "$@" >/dev/null 2>&1; do
        if [ "$(date +%s)" -ge "$deadline" ]; then
            fail "$what: not after ${timeout} s"
        fi
        sleep 0.5
    done
}

# A TCP port nobody listens on (from $1 up).
free_port() {
    local port=$1
    while (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do port=$((port + 1)); done
    echo "$port"
}

# Starts a program in its own session (it outlives the demo with --keep),
# logging to $1; its pid goes to the pids file.
start_bg() {
    local log=$1
    shift
    setsid "$@" </dev/null >>"$log" 2>&1 9>&- &
    echo $! >>"$pids_file"
}

# ---------------------------------------------------------------- cluster
extender_port=$(free_port 31993)
step "the scheduler's configuration: the shipped KubeSchedulerConfiguration" \
    "the extender entry (filter, prioritize, bind; managedResources) — only urlPrefix and kubeconfig are changed"
# The shipped file points at the extender's Service and kubeadm's scheduler
# kubeconfig; here the extender listens on 127.0.0.1.
sed -E -e "s#^(\s*- urlPrefix: )http://[^/ ]+#\1http://127.0.0.1:$extender_port#" \
    -e "s#^(\s*kubeconfig: ).*#\1$KUBECONFIG#" \
    "$scheduler_config_src" >"$work/scheduler-config.yaml"
[ "$(grep -c "urlPrefix: http://127.0.0.1:$extender_port" "$work/scheduler-config.yaml")" = 1 ] ||
    fail "$scheduler_config_src: expected one extender urlPrefix"
grep -v '^\s*#' "$work/scheduler-config.yaml" | grep -v '^\s*$'

step "cluster up: node-1 = A100-40GB in MIG mode (no instances), node-2 = H100-80GB" \
    "two nodes Ready; each has containerd 1.7 with enable_cdi and its own CDI directory"
mkdir -p "$cluster"
cluster_up=1
write_down_script
"$sim" cluster up --detach --root "$cluster" --nodes 2 \
    --profile a100-40gb-dynamic,h100-80gb \
    --scheduler-config "$work/scheduler-config.yaml" \
    --hook-path "$hook" \
    --image-dir "$work/images" \
    --cuda-probe "$debug/tessera-cuda-probe" 9>&- ||
    fail "tessera-sim cluster up"
for node in node-1 node-2; do
    echo "-- $node:"
    "$sim" show --root "$cluster/nodes/$node"
done
k get nodes -o wide

step "the cluster ConfigMap: kubectl apply -f $cluster_config_src" \
    "tessera-cluster-config in kube-system; the extender and the plugins read its cluster.yaml"
if grep -q '^kind: ConfigMap' "$cluster_config_src"; then
    k apply -f "$cluster_config_src"
else
    k -n kube-system create configmap tessera-cluster-config --from-file=cluster.yaml="$cluster_config_src"
fi
# What a pod mounting the ConfigMap at /etc/tessera would see.
k -n kube-system get configmap tessera-cluster-config -o jsonpath='{.data.cluster\.yaml}' >"$work/cluster.yaml"
[ -s "$work/cluster.yaml" ] || fail "the ConfigMap has no cluster.yaml"
grep -E '^\s*(nodeSchedulerPolicy|gpuSchedulerPolicy|deviceSplitCount):' "$work/cluster.yaml"

step "tessera-scheduler-extender on 127.0.0.1:$extender_port" \
    "its log: $cluster/logs/extender.log"
if [ -n "$images" ]; then
    # The image runs as uid 65532: its own copy of the kubeconfig.
    install -m 0600 -o 65532 -g 65532 "$KUBECONFIG" "$work/extender.kubeconfig"
    start_bg "$cluster/logs/extender.log" "${podman_run[@]}" --name "$container_prefix-extender" \
        -v "$work/extender.kubeconfig:/etc/tessera/kubeconfig:ro" \
        -v "$work/cluster.yaml:/etc/tessera/cluster.yaml:ro" \
        "$extender_image" --kubeconfig /etc/tessera/kubeconfig --config /etc/tessera/cluster.yaml \
        --listen "127.0.0.1:$extender_port" --namespace kube-system --identity demo
else
    start_bg "$cluster/logs/extender.log" env TESSERA_LOG=info NO_COLOR=1 "$extender" \
        --kubeconfig "$KUBECONFIG" --config "$work/cluster.yaml" \
        --listen "127.0.0.1:$extender_port" --namespace kube-system --identity demo
fi
wait_for 30 "the extender's /readyz" curl -sf "http://127.0.0.1:$extender_port/readyz"
echo "ready"

step "tessera-device-plugin on each node (the node's driver root, kubelet dir, CDI dir)" \
    "each node advertising nvidia.com/gpu and carrying tessera.io/node-gpus"
declare -A metrics_port
port=31994
for node in node-1 node-2; do
    dir="$cluster/nodes/$node"
    port=$(free_port "$port")
    metrics_port[$node]=$port
    if [ -n "$images" ]; then
        # As the DaemonSet: privileged, the host's pids, the driver's root
        # at /driver-root (--host-driver-root: where the host has it; the
        # DaemonSet's is read-only, the simulated driver keeps its state in
        # files there), the kubelet's, CDI and state directories and the
        # packages' files at their host paths.
        launch=("${podman_run[@]}" --name "$container_prefix-plugin-$node" --privileged --pid=host
            -v "$dir:/driver-root" -v "$dir:$dir" -v "$prefix:$prefix:ro" -v "$KUBECONFIG:$KUBECONFIG:ro"
            -v "$work/cluster.yaml:$work/cluster.yaml:ro" "$plugin_image"
            --driver-root /driver-root --host-driver-root "$dir")
    else
        launch=(env TESSERA_LOG=info NO_COLOR=1 "$plugin" --driver-root "$dir")
    fi
    start_bg "$cluster/logs/plugin-$node.log" "${launch[@]}" \
        --node-name "$node" --kubeconfig "$KUBECONFIG" --config "$work/cluster.yaml" \
        --kubelet-dir "$dir/var/lib/kubelet" --cdi-dir "$dir/cdi" \
        --state-dir "$dir/var/lib/tessera" --cdi-mode cdi-field \
        --hook-path "$hook" --hook-config "$dir/etc/tessera/hook.toml" \
        --vgpu-library "$vgpu_lib" --metrics-listen "127.0.0.1:$port"
    echo "$node: metrics on 127.0.0.1:$port, log $cluster/logs/plugin-$node.log"
    port=$((port + 1))
done
node_registered() {
    local cap gpus
    cap=$(k get node "$1" -o jsonpath='{.status.capacity.nvidia\.com/gpu}')
    gpus=$(k get node "$1" -o jsonpath='{.metadata.annotations.tessera\.io/node-gpus}')
    [ -n "$cap" ] && [ "$cap" != 0 ] && [ -n "$gpus" ]
}
for node in node-1 node-2; do
    wait_for 60 "$node: the device plugin's registration" node_registered "$node"
done
k get nodes -o custom-columns='NODE:.metadata.name,nvidia.com/gpu:.status.capacity.nvidia\.com/gpu'
echo "cluster ready, $(elapsed) after the demo started"

# ---------------------------------------------------------------- pods
step "kubectl apply -f examples/" "three pods: mig-pod, vgpu-pod, too-big-pod"
k apply -f examples/mig-pod.yaml -f examples/vgpu-pod.yaml -f examples/unschedulable-pod.yaml

pod_running() {
    [ "$(k get pod "$1" -o jsonpath='{.status.phase}')" = Running ]
}
pod_failed() {
    case "$(k get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null)" in
    Failed | Succeeded) return 0 ;;
    esac
    return 1
}
wait_running() {
    local deadline=$(($(date +%s) + 90))
    until pod_running "$1"; do
        if pod_failed "$1"; then
            k get pod "$1" -o jsonpath='{.status}' >&2 && echo >&2
            fail "pod $1 did not start"
        fi
        [ "$(date +%s)" -lt "$deadline" ] || fail "pod $1: not Running after 90 s"
        sleep 0.5
    done
}
wait_running mig-pod
wait_running vgpu-pod
too_big_reason() {
    k get pod too-big-pod -o jsonpath='{.status.conditions[?(@.type=="PodScheduled")].message}'
}
too_big_refused() { [ -n "$(too_big_reason)" ]; }
wait_for 60 "too-big-pod: a scheduling failure" too_big_refused
k get pods -o wide

# The stand-in kubelet keeps container output in the kubelet's layout
# (no `kubectl logs`/`exec`); this prints a container's, prefixes removed.
container_log() {
    local pod=$1 container=$2 node uid
    node=$(k get pod "$pod" -o jsonpath='{.spec.nodeName}')
    uid=$(k get pod "$pod" -o jsonpath='{.metadata.uid}')
    cut -d' ' -f4- "$cluster/nodes/$node/var/log/pods/default_${pod}_${uid}/$container/0.log"
}
log_has() { container_log "$1" "$2" 2>/dev/null | grep -q "$3"; }

step "(a) mig-pod: two MIG instances made on demand on node-1's A100" \
    "each container sees /dev/nvidia0 (the A100) and only its own instance's two cap nodes (GI and CI)"
mig_node=$(k get pod mig-pod -o jsonpath='{.spec.nodeName}')
echo "mig-pod runs on $mig_node"
for c in first second; do
    wait_for 30 "mig-pod/$c: its device listing" log_has mig-pod "$c" nvidia-cap
    echo "-- container $c: ls -ln /dev/nvidia*"
    container_log mig-pod "$c"
done
echo "-- the pod's tessera.io/allocation (written by the extender, realized ids by the plugin):"
k get pod mig-pod -o jsonpath='{.metadata.annotations.tessera\.io/allocation}' | jq .
echo "-- the node's GPU now (the simulated NVML): tessera-sim show"
"$sim" show --root "$cluster/nodes/$mig_node"

step "(b) vgpu-pod: a 4096 MiB / 30 % slice of node-2's H100 running a CUDA program" \
    "mem_total 4096 MiB inside the slice; 3 GiB succeeds; 5 GiB fails with CUDA_ERROR_OUT_OF_MEMORY"
echo "vgpu-pod runs on $(k get pod vgpu-pod -o jsonpath='{.spec.nodeName}')"
wait_for 60 "vgpu-pod: the probe's output" log_has vgpu-pod main PROBE-DONE
container_log vgpu-pod main | grep -v '^PROBE-DONE'
container_log vgpu-pod main | grep -q 'CUDA_ERROR_OUT_OF_MEMORY' ||
    fail "vgpu-pod: the 5 GiB allocation did not hit the slice's limit"

step "(c) too-big-pod: fits a node, fits no GPU: stays Pending" \
    "the extender's reason in the PodScheduled condition and the FailedScheduling event"
echo "phase: $(k get pod too-big-pod -o jsonpath='{.status.phase}')"
echo "PodScheduled: $(too_big_reason)"
k get events --field-selector involvedObject.name=too-big-pod

step "kubectl tessera inspect -d" \
    "each GPU's allocated/total memory and cores, the A100's MIG slot map, the pods holding each GPU"
k tessera inspect -d

step "the device plugins' metrics (HAMi's names)" \
    "hami_mig_device_info per MIG container on node-1; the slice's memory limit on node-2"
for node in node-1 node-2; do
    echo "-- $node (127.0.0.1:${metrics_port[$node]}/metrics):"
    curl -sf "http://127.0.0.1:${metrics_port[$node]}/metrics" |
        grep -E '^hami_(mig_device_info|vgpu_memory_limit_bytes|vgpu_memory_used_bytes)\{' || true
done

if [ -z "$keep" ]; then
    step "delete the pods: the plugin destroys the MIG instances and the transient specs" \
        "no GPU instance left on the A100, no transient spec (tessera.io-alloc_*) left in the node's CDI directory"
    k delete pod mig-pod vgpu-pod too-big-pod --grace-period=0 --wait=false
    no_gi_left() {
        [ -z "$(k get pods -o name)" ] &&
            [ "$(jq '[.gpus[] | (.gpu_instances // []) | length] | add' "$cluster/nodes/$mig_node/run/tessera-sim/state.json")" = 0 ] &&
            ! ls "$cluster/nodes/$mig_node/cdi" | grep -q '^tessera.io-alloc_'
    }
    wait_for 30 "reclaim on $mig_node" no_gi_left
    "$sim" show --root "$cluster/nodes/$mig_node"
    echo "files in $mig_node's CDI directory: $(ls "$cluster/nodes/$mig_node/cdi" | wc -l) (no static spec there: its A100 has no MIG instance until a pod asks)"
fi

# ---------------------------------------------------------------- the end
trap - ERR INT TERM
if [ -n "$keep" ]; then
    step "done in $(elapsed); the cluster stays up (--keep), with its three pods"
    cat <<KEEP
Explore it:
  export KUBECONFIG=$KUBECONFIG PATH=$plugin_dir:\$PATH
  $kubectl_bin get pods -A
  $kubectl_bin apply -f examples/mig-pod.yaml
  $kubectl_bin tessera inspect -d
  $sim cluster status --root $cluster
  logs: $cluster/logs/ (apiserver, scheduler, kubelet-node-*, extender, plugin-node-*)
  container output: $cluster/nodes/<node>/var/log/pods/
Tear it down (the extender, the plugins, then the cluster):
  bash $work/down.sh
KEEP
else
    step "cluster down" "every process of the cluster gone; $work left for inspection (logs)"
    teardown
    echo "done in $(elapsed). The work directory $work stays (logs under $cluster/logs);"
    echo "remove it with: rm -rf $work"
fi
