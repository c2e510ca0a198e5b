# Shared set-up for Tessera's scripts: sourced, not run.
# Installs what a fresh Debian (bookworm) machine lacks, as root.

tessera_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Debian packages the demo and the tests use: real runtimes and a static busybox
# for container root filesystems.
TESSERA_APT_PACKAGES=(podman runc crun busybox-static jq hyperfine ca-certificates curl build-essential pkg-config)

tessera_install_packages() {
    if [ "$(id -u)" != 0 ]; then
        echo "tessera: run as root (device nodes are made with mknod, containers run rootful)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${TESSERA_APT_PACKAGES[@]}"
}

tessera_install_rust() {
    if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    if ! command -v cargo >/dev/null 2>&1; then
        # rust-toolchain.toml pins the version; rustup fetches it on first use.
        curl -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --default-toolchain none
        export PATH="$HOME/.cargo/bin:$PATH"
    fi
    cargo --version
}

# crun refuses hybrid cgroup hosts while a controller is left on the v2
# hierarchy (hugetlb on these machines); binding it to v1 lets crun, podman's
# default runtime, work. Idempotent; a no-op on pure v1 or pure v2 hosts.
tessera_fix_hybrid_cgroups() {
    local unified=/sys/fs/cgroup/unified
    [ -r "$unified/cgroup.controllers" ] || return 0
    if grep -qw hugetlb "$unified/cgroup.controllers" && ! mountpoint -q /sys/fs/cgroup/hugetlb; then
        mkdir -p /sys/fs/cgroup/hugetlb
        mount -t cgroup -o hugetlb cgroup /sys/fs/cgroup/hugetlb || true
    fi
}
