#!/usr/bin/env bash
# Builds Tessera's packages: tessera-node (metadata in cdi-gen/Cargo.toml) and
# tessera-cluster (plugin/Cargo.toml), as .deb and .rpm, into target/package/.
#
# Usage: bash scripts/package.sh [--profile release|dev] [--deb-only] [--no-build]
#   --profile   cargo profile of the binaries (default release; dev reuses the
#               tests' target/debug build and packs faster, for CI and the demo)
#   --deb-only  skip the .rpm files
#   --no-build  package the binaries already built with that profile
#
# Prints the paths of the files it wrote, one per line, on stdout; logs go to
# stderr. Needs cargo-deb, cargo-generate-rpm (unless --deb-only), help2man and
# jq: `source scripts/lib.sh; tessera_install_packaging_tools` installs them.
#
# How: the binaries are built with the chosen profile (the hook statically, by
# scripts/build-hook.sh), stripped copies and gzipped man pages (help2man, from
# each binary's --help and --version) are staged in target/package/stage/, and
# cargo-deb packs them with --no-build. There is one asset list per package,
# cargo-deb's; the rpm's is derived from it here (cargo metadata + jq → a TOML
# file for cargo generate-rpm --metadata-overwrite), and so are the rpm
# scriptlets, from the deb maintainer scripts with a first line that maps rpm's
# arguments to dpkg's.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
root=$tessera_root
cd "$root"

usage() { tessera_usage "${BASH_SOURCE[0]}"; }
die() {
    echo "package.sh: $*" >&2
    exit 1
}

profile=release
deb_only=
no_build=
while [ $# -gt 0 ]; do
    case "$1" in
    --profile)
        [ $# -ge 2 ] || usage
        profile=$2
        shift
        ;;
    --deb-only) deb_only=1 ;;
    --no-build) no_build=1 ;;
    -h | --help) usage ;;
    *)
        echo "package.sh: unknown argument '$1'" >&2
        usage
        ;;
    esac
    shift
done

export CARGO_INCREMENTAL=0
# Reproducible man page dates and archive times: the last commit's time.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}
export SOURCE_DATE_EPOCH

for tool in jq help2man strip gzip dpkg-parsechangelog; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (source scripts/lib.sh; tessera_install_packaging_tools)"
done
cargo deb --version >/dev/null 2>&1 || die "cargo-deb is missing (source scripts/lib.sh; tessera_install_packaging_tools)"
if [ -z "$deb_only" ]; then
    cargo generate-rpm --version >/dev/null 2>&1 ||
        die "cargo-generate-rpm is missing (source scripts/lib.sh; tessera_install_packaging_tools)"
fi

metadata=$(cargo metadata --no-deps --format-version 1 --locked)

# One version, the workspace's (Cargo.toml): the Debian changelog's top entry
# and the images the manifests name must say the same, or the packages would
# ship a changelog or manifests of another release.
workspace_version=$(jq -r '.packages[] | select(.name == "tessera-cdi") | .version' <<<"$metadata")
changelog_version=$(dpkg-parsechangelog -l packaging/debian/changelog -S Version)
[ "$changelog_version" = "$workspace_version-1" ] ||
    die "packaging/debian/changelog: its top entry is $changelog_version, the workspace is $workspace_version: add an entry for $workspace_version-1"
for image in tessera-device-plugin tessera-scheduler-extender; do
    grep -q "^ *image: $image:$workspace_version\$" packaging/kubernetes/*.yaml ||
        die "packaging/kubernetes: no manifest names the image $image:$workspace_version (the workspace's version)"
done

target_dir=${CARGO_TARGET_DIR:-$root/target}
case "$profile" in
release)
    # Only what the packages hold.
    [ -n "$no_build" ] || cargo build --release --locked -p tessera-cdi -p tessera-vgpu -p tessera-device-plugin \
        -p tessera-scheduler-extender >&2
    build_dir_name=release
    build_dir=$target_dir/release
    hook_profile=release
    deb_compression=()
    rpm_compression=zstd
    ;;
dev)
    # The same command as scripts/test.sh's build, so nothing is rebuilt there
    # (a subset of the workspace can unify dependency features differently).
    [ -n "$no_build" ] || cargo build --workspace --locked >&2
    build_dir_name=debug
    build_dir=$target_dir/debug
    hook_profile=debug
    # Larger, much quicker to write: dev packages are for CI and the demo.
    deb_compression=(--fast)
    rpm_compression=gzip
    ;;
*)
    echo "package.sh: --profile must be release or dev, not '$profile'" >&2
    exit 2
    ;;
esac
if [ -n "$no_build" ]; then
    hook=$target_dir/x86_64-unknown-linux-gnu/$build_dir_name/tessera-hook
else
    hook=$(bash scripts/build-hook.sh "$hook_profile")
fi
for f in "$hook" "$build_dir"/{tessera-cdi,tessera-device-plugin,tessera-scheduler-extender,kubectl-tessera,libtessera_vgpu.so}; do
    [ -f "$f" ] || die "$f is missing (build it, or drop --no-build)"
done

# The staging area the Cargo.toml asset lists name (relative to the crates).
# One run at a time (the demo and the package test both build packages): the
# second waits. Packages are written beside their final name and renamed, so
# a reader never sees half a file.
out=$root/target/package
stage=$out/stage
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9
rm -rf "$stage" "$out/rpm" "$out/tmp"
mkdir -p "$stage/bin" "$stage/lib" "$stage/man" "$out/rpm" "$out/tmp"

for bin in tessera-cdi tessera-device-plugin tessera-scheduler-extender kubectl-tessera; do
    strip -o "$stage/bin/$bin" "$build_dir/$bin"
done
strip -o "$stage/bin/tessera-hook" "$hook"
strip --strip-unneeded -o "$stage/lib/libtessera_vgpu.so" "$build_dir/libtessera_vgpu.so"
chmod 0755 "$stage"/bin/*
chmod 0644 "$stage"/lib/*

# Man pages from --help/--version; the one-line NAME text per binary.
man_page() {
    local bin=$1 name=$2
    help2man --no-info --no-discard-stderr --name="$name" --section=1 \
        --output="$stage/man/$bin.1" "$stage/bin/$bin" ||
        die "help2man failed for $bin (does '$bin --help' and '$bin --version' work?)"
    gzip -9n "$stage/man/$bin.1"
}
man_page tessera-cdi "write and check CDI specs for a node's NVIDIA GPUs and MIG devices"
man_page tessera-hook "OCI hook binding containers to Tessera GPU allocations"
man_page tessera-device-plugin "kubelet device plugin for GPU slices and MIG instances"
man_page tessera-scheduler-extender "kube-scheduler extender placing GPU slices and MIG instances"
man_page kubectl-tessera "kubectl plugin showing Tessera's GPU allocations"

# package name → crate holding its metadata
declare -A crate_of=([tessera-node]=tessera-cdi [tessera-cluster]=tessera-device-plugin)

# The rpm scriptlets: each deb maintainer script after a line setting dpkg's
# arguments from rpm's ($1: how many instances remain or will be installed).
# Erasing an rpm removes it for good, so %postun on erase is dpkg's "purge".
rpm_scriptlet() {
    local deb_script=$1 mapping=$2 dest=$3
    {
        echo '#!/bin/sh'
        echo "# Generated by scripts/package.sh from $deb_script: rpm's arguments mapped to dpkg's."
        echo "$mapping"
        sed '1{/^#!/d}' "$deb_script"
    } >"$dest"
}

written=()
for package in tessera-node tessera-cluster; do
    crate=${crate_of[$package]}
    deb_log=$(cargo deb --locked --no-build --no-strip -p "$crate" --output "$out/tmp/" "${deb_compression[@]}" 2>&1) ||
        die "cargo deb failed for $package: $deb_log"
    # Its warning that the staged files are not cargo's own build products is
    # the point of staging them; the path it wrote is printed once, below;
    # the rest goes to the log.
    grep -v -e "^$out/tmp/" -e "Only source paths starting with exactly" -e "does not match the pattern" \
        -e "Failed to find dependency specification" -e "No \$auto deps for .*/tessera-hook$" <<<"$deb_log" >&2 || true
    version=$(jq -r --arg c "$crate" '.packages[] | select(.name == $c) | .version' <<<"$metadata")
    deb=$out/${package}_${version}-1_amd64.deb
    [ -f "$out/tmp/${deb##*/}" ] || die "cargo-deb did not write $out/tmp/${deb##*/}"
    mv "$out/tmp/${deb##*/}" "$deb"
    written+=("$deb")

    [ -n "$deb_only" ] && continue
    scripts=$root/packaging/debian/$package
    rpm_scripts=$out/rpm/$package
    mkdir -p "$rpm_scripts"
    rpm_scriptlet "$scripts/postinst" 'if [ "$1" -ge 2 ]; then set -- configure upgrade; else set -- configure; fi' \
        "$rpm_scripts/post_install"
    rpm_scriptlet "$scripts/prerm" 'if [ "$1" -eq 0 ]; then set -- remove; else set -- upgrade; fi' \
        "$rpm_scripts/pre_uninstall"
    rpm_scriptlet "$scripts/postrm" 'if [ "$1" -eq 0 ]; then set -- purge; else set -- upgrade; fi' \
        "$rpm_scripts/post_uninstall"
    # The deb asset list → rpm assets: absolute sources (cargo-deb's are
    # relative to the crate), absolute destinations, the same modes. Left out:
    # what only dpkg reads (lintian overrides). cargo-deb's changelog option
    # is not an asset, so the rpm has no Debian changelog.
    toml=$out/rpm/$package.toml
    jq -r --arg c "$crate" --arg scripts "$rpm_scripts" '
        .packages[] | select(.name == $c) |
        (.manifest_path | sub("/Cargo.toml$"; "")) as $dir |
        "release = \"1\"",
        "post_install_script = \("\($scripts)/post_install" | tojson)",
        "pre_uninstall_script = \("\($scripts)/pre_uninstall" | tojson)",
        "post_uninstall_script = \("\($scripts)/post_uninstall" | tojson)",
        "assets = [",
        (.metadata.deb.assets[]
            | select(.[1] | startswith("usr/share/lintian/") | not)
            | "  { source = \("\($dir)/\(.[0])" | tojson), dest = \("/\(.[1])" | tojson), mode = \(.[2] | tojson) },"),
        "]"' <<<"$metadata" >"$toml"
    for f in "$rpm_scripts"/*; do
        [ -s "$f" ] || die "empty rpm scriptlet $f"
    done
    crate_dir=$(jq -r --arg c "$crate" '.packages[] | select(.name == $c) | .manifest_path' <<<"$metadata")
    crate_dir=$(dirname "$crate_dir")
    rpm_log=$(cargo generate-rpm -p "${crate_dir#"$root"/}" --metadata-overwrite "$toml" --output "$out/tmp/" --payload-compress "$rpm_compression" 2>&1) ||
        die "cargo generate-rpm failed for $package: $rpm_log"
    rpm=$out/$package-$version-1.x86_64.rpm
    [ -f "$out/tmp/${rpm##*/}" ] || die "cargo generate-rpm did not write $out/tmp/${rpm##*/}"
    mv "$out/tmp/${rpm##*/}" "$rpm"
    written+=("$rpm")
done

rmdir "$out/tmp"
printf '%s\n' "${written[@]}"
