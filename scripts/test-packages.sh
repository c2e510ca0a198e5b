#!/usr/bin/env bash
# Tests Tessera's packages on this machine, as root (scripts/test.sh runs it;
# CI is a disposable container without systemd running):
#   1. builds them (scripts/package.sh; --profile dev by default: CI's
#      target/debug build is reused, nothing is built in release);
#   2. lintian on each .deb: no error, no warning (overrides only in
#      packaging/debian/<package>/lintian-overrides, each with its reason);
#   3. each .rpm (`rpm -qlp --scripts`): the same files as its .deb (but what
#      only dpkg reads) and scriptlets made from the deb maintainer scripts;
#   4. the images the manifests name (scripts/image.sh), through the demo
#      run with them (`demo.sh --images --no-build`): --version, no shell,
#      labels, the extender's user;
#   5. snapshots the machine, `dpkg -i` both .debs, runs the installed
#      binaries, checks the hook is static, `systemd-analyze verify` of every
#      installed unit, the demo on the installed packages
#      (`demo.sh --installed --no-build`), `dpkg -r`, `dpkg --purge`, and
#      compares with the snapshot: nothing left behind, nothing changed.
# Every failure prints one line naming what failed and exits non-zero; a failure
# after the install still purges the packages.
#
# Usage: bash scripts/test-packages.sh [--profile dev|release] [--no-build] [--no-demo]
#   --no-build  test the packages already in target/package/
#   --no-demo   skip the demo runs and the images (the slowest steps)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$tessera_root"

usage() { tessera_usage "${BASH_SOURCE[0]}"; }
profile=dev
no_build=
no_demo=
while [ $# -gt 0 ]; do
    case "$1" in
    --profile)
        [ $# -ge 2 ] || usage
        profile=$2
        shift
        ;;
    --no-build) no_build=1 ;;
    --no-demo) no_demo=1 ;;
    -h | --help) usage ;;
    *)
        echo "test-packages.sh: unknown argument '$1'" >&2
        usage
        ;;
    esac
    shift
done
if [ "$(id -u)" != 0 ]; then
    echo "test-packages.sh: run as root (it installs and purges the packages)" >&2
    exit 1
fi

fail() {
    echo "test-packages.sh: FAIL: $*" >&2
    exit 1
}
# Each step prints its name, and the time the one before it took.
step_start=$SECONDS
step_name=
step() {
    [ -z "$step_name" ] || echo "   ($step_name: $((SECONDS - step_start)) s)"
    echo "== packages: $*"
    step_name=$*
    step_start=$SECONDS
}

packages=(tessera-node tessera-cluster)
out=$tessera_root/target/package
work=$(mktemp -d /tmp/tessera-test-packages.XXXXXX)
installed=
cleanup() {
    local rc=$?
    if [ -n "$installed" ]; then
        echo "test-packages.sh: purging the packages after a failure" >&2
        dpkg --purge "${packages[@]}" >/dev/null 2>&1 || true
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT

step "build ($profile)"
if [ -z "$no_build" ]; then
    bash scripts/package.sh --profile "$profile" >"$work/written" || fail "scripts/package.sh --profile $profile"
fi
version=$(cargo metadata --no-deps --format-version 1 --locked |
    jq -r '.packages[] | select(.name == "tessera-cdi") | .version')
declare -A deb rpm
for p in "${packages[@]}"; do
    deb[$p]=$out/${p}_${version}-1_amd64.deb
    rpm[$p]=$out/$p-$version-1.x86_64.rpm
    [ -f "${deb[$p]}" ] || fail "${deb[$p]} was not built"
    [ -f "${rpm[$p]}" ] || fail "${rpm[$p]} was not built"
done

step "lintian"
for p in "${packages[@]}"; do
    if ! lintian --fail-on error,warning "${deb[$p]}" >"$work/lintian.$p" 2>&1; then
        cat "$work/lintian.$p" >&2
        fail "lintian reports errors or warnings on ${deb[$p]##*/} (above)"
    fi
done

step "rpm files and scriptlets against the deb"
for p in "${packages[@]}"; do
    # Files (not directories: the rpm owns none) of the deb, less what only
    # dpkg reads: lintian overrides and the Debian changelog.
    dpkg-deb --fsys-tarfile "${deb[$p]}" | tar -t | grep -v '/$' | sed 's|^\./|/|' |
        grep -vE "^/usr/share/lintian/|^/usr/share/doc/$p/changelog\.Debian\.gz$" | sort >"$work/deb-files.$p"
    rpm -qlp "${rpm[$p]}" 2>/dev/null | sort >"$work/rpm-files.$p"
    if ! diff -u "$work/deb-files.$p" "$work/rpm-files.$p" >"$work/files.diff"; then
        cat "$work/files.diff" >&2
        fail "${rpm[$p]##*/} and ${deb[$p]##*/} hold different files (diff above: - deb, + rpm)"
    fi
    rpm -qlp --scripts "${rpm[$p]}" >"$work/rpm-scripts.$p" 2>/dev/null || fail "rpm -qlp --scripts ${rpm[$p]##*/}"
    # Each scriptlet ends with its deb maintainer script, less the #! line.
    for pair in postinst:POSTIN prerm:PREUN postrm:POSTUN; do
        script=packaging/debian/$p/${pair%%:*}
        scriptlet=$(rpm -qp --qf "%{${pair##*:}}" "${rpm[$p]}" 2>/dev/null)
        body=$(sed '1{/^#!/d}' "$script")
        [[ "$scriptlet" == *"$body" ]] ||
            fail "${rpm[$p]##*/}: the ${pair##*:} scriptlet does not end with $script"
    done
    grep -q '^/usr/lib/systemd/system/' "$work/rpm-files.$p" || fail "${rpm[$p]##*/} has no systemd unit"
done

if [ -z "$no_demo" ]; then
    step "images (scripts/image.sh) and the demo with them (demo.sh --images)"
    # The extender and the plugins run from the images, as the manifests run
    # them; the whole output stays in target/package/demo-images.log.
    if ! bash scripts/demo.sh --images --no-build >"$out/demo-images.log" 2>&1; then
        tail -n 40 "$out/demo-images.log" >&2
        fail "scripts/demo.sh --images --no-build (last lines above; all in $out/demo-images.log)"
    fi
    version=$(dpkg-deb -f "${deb[tessera-cluster]}" Version)
    version=${version%-*}
    podman_run=(podman run --rm --network=none "${TESSERA_PODMAN_LIMITS[@]}")
    for program in tessera-device-plugin tessera-scheduler-extender; do
        image=localhost/$program:$version
        # The manifests name the image (less a registry) that image.sh builds.
        grep -q "image: $program:$version\$" packaging/kubernetes/*.yaml ||
            fail "no manifest in packaging/kubernetes names $program:$version"
        got=$("${podman_run[@]}" "$image" --version 2>&1) || fail "$image --version: $got"
        [ "$got" = "$program $version" ] || fail "$image --version printed '$got'"
        # Nothing to run but the program: no shell, no package manager.
        if "${podman_run[@]}" --entrypoint /bin/sh "$image" -c true >/dev/null 2>&1; then
            fail "$image has a shell"
        fi
        [ "$(podman image inspect --format '{{index .Labels "org.opencontainers.image.version"}}' "$image")" = "$version" ] ||
            fail "$image: label org.opencontainers.image.version is not $version"
    done
    [ "$(podman image inspect --format '{{.Config.User}}' "localhost/tessera-scheduler-extender:$version")" = 65532:65532 ] ||
        fail "the extender's image does not run as 65532:65532"
fi

# The machine's state that installing, running and purging may touch: every
# file and directory (type, mode, owner; size and mtime for non-directories,
# whose own mtime changes whenever an entry comes and goes) under /usr, /etc,
# /var/lib, /opt and the CDI directory, and a sha256 of every regular file
# outside /usr (/usr is big; a change there moves size or mtime). Left out: what
# other programs on a shared machine change meanwhile (container and package
# manager state, kubelet and CNI state, the e2e tools under /opt), the loader
# cache (dpkg's libc trigger rewrites it, same content, new mtime), and dpkg's
# database, compared on its own below.
snapshot() {
    local roots=(/usr /etc /var/lib /opt /run/cdi /run/tessera)
    local existing=() r
    for r in "${roots[@]}"; do
        [ -e "$r" ] && existing+=("$r")
    done
    find "${existing[@]}" -xdev \
        \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/containers -o -path /var/lib/containerd \
        -o -path /var/lib/docker -o -path /var/lib/cni -o -path /var/lib/kubelet -o -path /etc/cni \
        -o -path /opt/tessera-e2e -o -path /etc/ld.so.cache \) -prune -o \
        \( -type d -printf '%p %y %m %u %g\n' \) -o \( -printf '%p %y %m %u %g %s %T@\n' \) | sort
    find "${existing[@]}" -xdev -path /usr -prune -o \
        \( -path /var/lib/dpkg -o -path /var/lib/apt -o -path /var/lib/containers -o -path /var/lib/containerd \
        -o -path /var/lib/docker -o -path /var/lib/cni -o -path /var/lib/kubelet -o -path /etc/cni \
        -o -path /opt -o -path /etc/ld.so.cache \) -prune -o -type f -print0 | sort -z | xargs -0r sha256sum
    # dpkg's record of installed packages: purge must restore it exactly.
    sha256sum /var/lib/dpkg/status /var/lib/dpkg/diversions /var/lib/dpkg/statoverride 2>/dev/null || true
    ls /var/lib/dpkg/info | grep -E '^tessera-' || true
}

step "snapshot"
snapshot >"$work/before"

step "dpkg -i"
installed=1
dpkg -i "${deb[tessera-node]}" "${deb[tessera-cluster]}" >"$work/dpkg-i" 2>&1 || {
    cat "$work/dpkg-i" >&2
    fail "dpkg -i of both packages (output above)"
}
if [ ! -e /dev/nvidiactl ] && ! grep -q '^tessera-node: no NVIDIA driver here' "$work/dpkg-i"; then
    cat "$work/dpkg-i" >&2
    fail "tessera-node's postinst did not say the node has no driver (output above)"
fi

step "installed binaries"
check_version() {
    local bin=$1 got
    got=$("$bin" --version 2>&1) || fail "$bin --version exited non-zero: $got"
    [ "$got" = "${bin##*/} $version" ] || fail "$bin --version printed '$got', not '${bin##*/} $version'"
}
check_version /usr/bin/tessera-cdi
check_version /usr/bin/tessera-hook
check_version /usr/bin/tessera-device-plugin
check_version /usr/bin/tessera-scheduler-extender
/usr/bin/kubectl-tessera --help >/dev/null 2>&1 || fail "/usr/bin/kubectl-tessera --help exited non-zero"
# The hook runs for every container: statically linked, no program interpreter
# (so no dynamic loader, no LD_PRELOAD), no shared library needed.
readelf -lW /usr/bin/tessera-hook | grep -q 'INTERP' && fail "/usr/bin/tessera-hook has a PT_INTERP: not static"
readelf -dW /usr/bin/tessera-hook | grep -q '(NEEDED)' && fail "/usr/bin/tessera-hook needs shared libraries"
[ "$(cat /usr/lib/tessera/ld.so.preload)" = /usr/local/tessera/libtessera_vgpu.so ] ||
    fail "/usr/lib/tessera/ld.so.preload does not name /usr/local/tessera/libtessera_vgpu.so"
readelf -dW /usr/lib/tessera/libtessera_vgpu.so | grep -q 'Shared library' ||
    fail "/usr/lib/tessera/libtessera_vgpu.so is not a shared library"
for page in tessera-cdi tessera-hook tessera-device-plugin tessera-scheduler-extender kubectl-tessera; do
    zcat "/usr/share/man/man1/$page.1.gz" | grep -q '^\.TH' || fail "no man page /usr/share/man/man1/$page.1.gz"
done
# Installed, not enabled (the tessera-node refresh units are enabled).
for unit in tessera-device-plugin.service tessera-scheduler-extender.service; do
    [ -z "$(find /etc/systemd/system -name "$unit" 2>/dev/null)" ] || fail "$unit was enabled by the install"
done
[ -L /etc/systemd/system/multi-user.target.wants/tessera-cdi-refresh.service ] ||
    fail "tessera-cdi-refresh.service was not enabled by the install"

step "systemd-analyze verify"
units=()
for p in "${packages[@]}"; do
    while read -r f; do units+=("$f"); done < <(dpkg -L "$p" | grep '^/usr/lib/systemd/system/.*\.\(service\|path\)$')
done
[ "${#units[@]}" = 4 ] || fail "expected 4 installed units, found ${#units[@]}: ${units[*]}"
# Clean means no output at all: systemd-analyze prints warnings yet exits 0.
# Units named by After=/Wants= that this machine lacks (nvidia-persistenced,
# kubelet) are not reported by verify.
if ! SYSTEMD_LOG_LEVEL=notice systemd-analyze verify "${units[@]}" >"$work/verify" 2>&1 || [ -s "$work/verify" ]; then
    cat "$work/verify" >&2
    fail "systemd-analyze verify of the installed units is not clean (above)"
fi

if [ -z "$no_demo" ]; then
    step "demo on the installed packages"
    # Its whole output stays in target/package/demo-installed.log.
    if ! bash scripts/demo.sh --installed --no-build >"$out/demo-installed.log" 2>&1; then
        tail -n 40 "$out/demo-installed.log" >&2
        fail "scripts/demo.sh --installed --no-build (last lines above; all in $out/demo-installed.log)"
    fi
fi

step "dpkg -r"
dpkg -r "${packages[@]}" >"$work/dpkg-r" 2>&1 || {
    cat "$work/dpkg-r" >&2
    fail "dpkg -r (output above)"
}
for f in /usr/bin/tessera-cdi /usr/bin/tessera-hook /usr/bin/tessera-device-plugin /usr/lib/tessera; do
    [ ! -e "$f" ] || fail "$f is still there after dpkg -r"
done

step "dpkg --purge"
dpkg --purge "${packages[@]}" >"$work/dpkg-purge" 2>&1 || {
    cat "$work/dpkg-purge" >&2
    fail "dpkg --purge (output above)"
}
installed=

step "compare with the snapshot"
snapshot >"$work/after"
if ! diff -u "$work/before" "$work/after" >"$work/snapshot.diff"; then
    grep '^[-+][^-+]' "$work/snapshot.diff" | head -n 40 >&2
    fail "install, use and purge changed the machine (- before, + after: first lines above)"
fi
step "done: nothing left behind"
