# Shared set-up for Tessera's scripts: sourced, not run.
# Installs what a fresh Debian (bookworm) machine lacks, as root.

tessera_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# Prints the usage paragraph of a script's header comment (from "Usage:" to
# the first blank comment line) on stderr, and exits 2.
tessera_usage() {
    sed -n 's/^# \{0,1\}//; /^Usage:/,/^$/p' "$1" | sed '/^$/q' >&2
    exit 2
}

# `podman run`'s rlimits: these sandboxed machines forbid raising them, which
# podman's defaults would do (crun: "setrlimit RLIMIT_NOFILE: Operation not
# permitted"). tests/support/src/podman.rs pins the same for the Rust tests.
TESSERA_PODMAN_LIMITS=(--ulimit nofile=4096:4096 --ulimit nproc=4096:4096)

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

# containerd 1.7 (CDI via enable_cdi) for the CRI end-to-end tests, beside
# bookworm's packages, not instead of them: bookworm ships 1.6.20. The trixie
# suite is added as an apt source pinned to priority 100 (never chosen by a
# plain `apt-get install`), containerd's .deb is downloaded and unpacked under
# /opt/tessera-e2e/containerd-1.7 (usr/bin: containerd, containerd-shim-runc-v2,
# ctr). The tests run it with bookworm's runc (/usr/sbin/runc); trixie's runc
# needs a newer glibc. Idempotent: nothing is done when 1.7 is already there.
TESSERA_CONTAINERD_DIR=/opt/tessera-e2e/containerd-1.7

# The URI of the Debian archive the machine's bookworm packages come from
# (deb822 .sources or a one-line sources.list entry).
tessera_debian_mirror() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [ -f "$f" ] || continue
        awk '/^URIs:/ { uri = $2 } /^Suites:/ && / bookworm( |$)/ && uri !~ /security/ { print uri; exit }' "$f"
    done | head -n1 | grep . && return 0
    grep -hE '^deb +[a-z]+://[^ ]+ +bookworm +' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
        awk '{ print $2; exit }'
}

# Adds Debian's trixie suite as an apt source pinned to priority 100 (never
# chosen by a plain `apt-get install`; only `apt-get download pkg/trixie`
# takes from it), from the mirror the machine already uses for bookworm, and
# refreshes the package lists. Shared by the installers below; idempotent.
tessera_add_trixie_source() {
    export DEBIAN_FRONTEND=noninteractive
    local sources=/etc/apt/sources.list.d/tessera-trixie.sources
    local pin=/etc/apt/preferences.d/tessera-trixie
    if [ ! -f "$sources" ]; then
        local uri
        uri=$(tessera_debian_mirror)
        if [ -z "$uri" ]; then
            echo "tessera: no Debian mirror found in /etc/apt to add trixie from" >&2
            return 1
        fi
        cat >"$sources" <<SOURCES
# Added by Tessera's scripts/lib.sh (tessera_add_trixie_source): containerd 1.7
# and kubectl 1.32 for the end-to-end tests. Pinned low in preferences.d/tessera-trixie.
Types: deb
URIs: $uri
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SOURCES
    fi
    if [ ! -f "$pin" ]; then
        cat >"$pin" <<'PIN'
# Added by Tessera's scripts/lib.sh: never take trixie packages unless asked.
Package: *
Pin: release n=trixie
Pin-Priority: 100
PIN
    fi
    # Once per shell: both installers call this on a fresh machine.
    if [ -z "${tessera_trixie_updated:-}" ]; then
        apt-get update -q
        tessera_trixie_updated=1
    fi
}

# Downloads trixie's .deb of package $1 and unpacks it into directory $2
# (replaced atomically: unpacked beside it, then renamed), then runs the
# check command given after them from the unpacked tree ($2.tmp as prefix).
tessera_unpack_trixie_deb() {
    local package=$1 dir=$2
    shift 2
    local work
    work=$(mktemp -d)
    chown _apt "$work" 2>/dev/null || true # apt-get download fetches as _apt
    if ! (cd "$work" && apt-get download -q "$package/trixie"); then
        rm -rf "$work"
        return 1
    fi
    rm -rf "$dir.tmp"
    mkdir -p "$dir.tmp"
    if ! dpkg-deb -x "$work/${package}"_*.deb "$dir.tmp"; then
        rm -rf "$work"
        return 1
    fi
    rm -rf "$work"
    "$dir.tmp/$1" "${@:2}" || return 1
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
}

tessera_install_containerd() {
    local bin="$TESSERA_CONTAINERD_DIR/usr/bin/containerd"
    local version
    version=$("$bin" --version 2>/dev/null || true)
    case "$version" in
    *" 1.7."* | *" v1.7."*) return 0 ;;
    esac
    tessera_add_trixie_source
    tessera_unpack_trixie_deb containerd "$TESSERA_CONTAINERD_DIR" usr/bin/containerd --version
}

# kubectl 1.32 (Debian trixie's kubectl package; kubernetes-client, the name
# bookworm's 1.20 had, is a transitional package depending on it there) for the cluster
# tests, unpacked under /opt/tessera-e2e/kubernetes-client (usr/bin/kubectl,
# the path tessera_test_support::kube::DEFAULT_KUBECTL names); bookworm ships
# no kubectl. Never installed over a kubectl on PATH. Idempotent: nothing is
# done when a 1.32 client is already there.
TESSERA_KUBECTL_DIR=/opt/tessera-e2e/kubernetes-client

tessera_install_kubectl() {
    local version
    version=$("$TESSERA_KUBECTL_DIR/usr/bin/kubectl" version --client 2>/dev/null || true)
    case "$version" in
    *"Client Version: v1.32."*) return 0 ;;
    esac
    tessera_add_trixie_source
    tessera_unpack_trixie_deb kubectl "$TESSERA_KUBECTL_DIR" usr/bin/kubectl version --client
}

# What scripts/package.sh and scripts/test-packages.sh need: lintian, rpm (for
# `rpm -qlp`), help2man (man pages from --help), systemd (systemd-analyze
# verify; installs and works in a container without systemd running),
# dpkg-dev (dpkg-shlibdeps, for cargo-deb's dependency list), and the pinned
# cargo-deb and cargo-generate-rpm, installed only when missing or at another
# version. Idempotent: a machine that has everything runs no apt or cargo.
# `--deb-only` (the demo) skips cargo-generate-rpm: it takes minutes to build.
TESSERA_PACKAGING_APT_PACKAGES=(lintian rpm help2man systemd dpkg-dev jq binutils)
TESSERA_CARGO_DEB_VERSION=3.8.0
TESSERA_CARGO_GENERATE_RPM_VERSION=0.21.1

tessera_install_packaging_tools() {
    if [ "$(id -u)" != 0 ]; then
        echo "tessera: run as root (installs Debian packages)" >&2
        exit 1
    fi
    local tool missing=
    for tool in lintian rpm help2man systemd-analyze dpkg-shlibdeps jq readelf; do
        command -v "$tool" >/dev/null 2>&1 || missing=1
    done
    if [ -n "$missing" ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -q
        apt-get install -y -q --no-install-recommends "${TESSERA_PACKAGING_APT_PACKAGES[@]}"
    fi
    tessera_install_rust >/dev/null
    if [ "$(cargo deb --version 2>/dev/null)" != "cargo-deb $TESSERA_CARGO_DEB_VERSION" ]; then
        cargo install --locked "cargo-deb@$TESSERA_CARGO_DEB_VERSION"
    fi
    if [ "${1:-}" != --deb-only ] &&
        [ "$(cargo generate-rpm --version 2>/dev/null)" != "cargo-generate-rpm $TESSERA_CARGO_GENERATE_RPM_VERSION" ]; then
        cargo install --locked "cargo-generate-rpm@$TESSERA_CARGO_GENERATE_RPM_VERSION"
    fi
}
