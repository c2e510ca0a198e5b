#!/usr/bin/env bash
# Builds the two images the Kubernetes manifests name, tessera-device-plugin
# and tessera-scheduler-extender, from the tessera-cluster package, with
# podman and packaging/container/Containerfile. No base image is pulled: the
# root filesystem is staged here (target/image/rootfs) from the package's two
# binaries, the glibc and libgcc files they load — and those a host's NVML
# library loads (libdl, libpthread, librt) — taken from this machine's Debian
# packages, the CA bundle, their copyright files, and /etc/passwd, group and
# nsswitch.conf.
#
# Usage: bash scripts/image.sh [--deb FILE] [--prefix NAME/] [--archive DIR]
#   --deb FILE     the tessera-cluster .deb (default: the newest one in
#                  target/package/; scripts/package.sh makes it)
#   --prefix P     put P before each image name, e.g. registry.example.com/tessera/
#   --archive DIR  also write each image as an OCI archive,
#                  DIR/<image>_<version>.oci.tar (skopeo copy, ctr import)
#
# Prints the images' names, one per line, on stdout; logs go to stderr. The
# tag is the package's upstream version (0.1.0 for 0.1.0-1), as the manifests
# name it. Image times are the last commit's (SOURCE_DATE_EPOCH).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$tessera_root
cd "$root"

usage() { tessera_usage "${BASH_SOURCE[0]}"; }
die() {
    echo "image.sh: $*" >&2
    exit 1
}

deb=
prefix=
archive=
while [ $# -gt 0 ]; do
    case "$1" in
    --deb | --prefix | --archive)
        [ $# -ge 2 ] || usage
        case "$1" in
        --deb) deb=$2 ;;
        --prefix) prefix=$2 ;;
        --archive) archive=$2 ;;
        esac
        shift
        ;;
    -h | --help) usage ;;
    *)
        echo "image.sh: unknown argument '$1'" >&2
        usage
        ;;
    esac
    shift
done

for tool in podman dpkg-deb dpkg-query ldd readelf; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (apt-get install podman dpkg binutils libc-bin)"
done
target_dir=${CARGO_TARGET_DIR:-$root/target}
if [ -z "$deb" ]; then
    deb=$(ls -t "$target_dir"/package/tessera-cluster_*.deb 2>/dev/null | head -n1 || true)
    [ -n "$deb" ] || die "no tessera-cluster .deb in $target_dir/package (bash scripts/package.sh --deb-only)"
fi
[ -f "$deb" ] || die "--deb: $deb: no such file"
[ "$(dpkg-deb -f "$deb" Package)" = tessera-cluster ] || die "--deb: $deb is not the tessera-cluster package"
version=$(dpkg-deb -f "$deb" Version)
version=${version%-*}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}

work=$target_dir/image
rootfs=$work/rootfs
rm -rf "$work"
mkdir -p "$work/deb" "$rootfs"
dpkg-deb -x "$deb" "$work/deb"
binaries=(tessera-device-plugin tessera-scheduler-extender)

# A file of this machine into the same path under the root filesystem
# (links followed: the image holds plain files), and the copyright file of
# the Debian package that owns it.
copyrights=()
add_host_file() {
    local path=$1 real owner
    real=$(readlink -f "$path")
    install -D -m "$(stat -c %a "$real")" "$real" "$rootfs$path"
    owner=$(dpkg-query -S "$real" 2>/dev/null | head -n1 | cut -d: -f1 || true)
    [ -n "$owner" ] || owner=$(dpkg-query -S "$path" 2>/dev/null | head -n1 | cut -d: -f1 || true)
    [ -n "$owner" ] || die "$path: no Debian package owns it (its copyright cannot be shipped)"
    copyrights+=("$owner")
}

libs=()
for bin in "${binaries[@]}"; do
    file=$work/deb/usr/bin/$bin
    [ -x "$file" ] || die "$deb has no usr/bin/$bin"
    install -D -m 0755 "$file" "$rootfs/usr/bin/$bin"
    interpreter=$(readelf -l "$file" | sed -n 's/.*Requesting program interpreter: \(.*\)]/\1/p')
    [ -n "$interpreter" ] || die "$bin has no program interpreter"
    libs+=("$interpreter")
    # ldd's "name => /path (address)" lines; a "not found" fails here.
    if ldd "$file" | grep -q 'not found'; then
        die "$bin: $(ldd "$file" | grep 'not found' | head -n1)"
    fi
    while read -r path; do
        libs+=("$path")
    done < <(ldd "$file" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
done
# NVML (the host's, loaded by the plugin at run time) links these too.
libc_dir=$(dirname "$(printf '%s\n' "${libs[@]}" | grep '/libc\.so\.6$' | head -n1)")
[ "$libc_dir" != . ] || die "the binaries do not load libc.so.6"
for name in libdl.so.2 libpthread.so.0 librt.so.1; do
    [ -e "$libc_dir/$name" ] && libs+=("$libc_dir/$name")
done
mapfile -t libs < <(printf '%s\n' "${libs[@]}" | sort -u)
for lib in "${libs[@]}"; do
    add_host_file "$lib"
done

# The system's CA bundle: the Kubernetes client loads it when it starts,
# whatever the kubeconfig says (and talks to an API server with a public CA
# by it). update-ca-certificates makes it, from the ca-certificates package.
bundle=/etc/ssl/certs/ca-certificates.crt
[ -s "$bundle" ] || die "$bundle is missing (apt-get install ca-certificates)"
install -D -m 0644 "$bundle" "$rootfs$bundle"
copyrights+=(ca-certificates)

mkdir -p "$rootfs/etc" "$rootfs/tmp" "$rootfs/usr/share/doc/tessera-cluster"
chmod 1777 "$rootfs/tmp"
cp "$work/deb/usr/share/doc/tessera-cluster/copyright" "$rootfs/usr/share/doc/tessera-cluster/"
mapfile -t copyrights < <(printf '%s\n' "${copyrights[@]}" | sort -u)
for package in "${copyrights[@]}"; do
    install -D -m 0644 "/usr/share/doc/$package/copyright" "$rootfs/usr/share/doc/$package/copyright"
done
cat >"$rootfs/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin
PASSWD
cat >"$rootfs/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
echo 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"

echo "image.sh: root filesystem $rootfs: ${#libs[@]} libraries from ${copyrights[*]}; $(du -sh "$rootfs" | cut -f1)" >&2
for target in device-plugin scheduler-extender; do
    name=${prefix}tessera-$target:$version
    # No layer cache: it would keep an intermediate image per build.
    podman build --quiet --layers=false --target "$target" --build-arg "VERSION=$version" \
        --timestamp "$SOURCE_DATE_EPOCH" -t "$name" \
        -f packaging/container/Containerfile "$rootfs" >/dev/null
    if [ -n "$archive" ]; then
        mkdir -p "$archive"
        out=$archive/tessera-${target}_$version.oci.tar
        rm -f "$out"
        podman save --quiet --format oci-archive -o "$out" "$name"
        echo "image.sh: $out" >&2
    fi
    echo "$name"
done
# What the builds left untagged (the base stage, the images these replaced).
podman image prune -f --filter label=org.opencontainers.image.title=Tessera >/dev/null
