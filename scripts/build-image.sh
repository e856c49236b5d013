#!/usr/bin/env bash
# Builds the container image offline: scripts/build-image.sh [--binary PATH] [--out DIR] [--fast]
#
# Without --binary it builds `sluice` in release (cargo build --release --locked -p sluice).
# The image is FROM scratch: /usr/bin/sluice, exactly the shared libraries and loader `ldd`
# names for it (copied to the paths the binary asks for), and /etc/passwd and /etc/group with
# one user, sluice (65532:65532), which the image runs as. No shell, no CA bundle: every CA a
# role trusts is a file its configuration names.
#
# It writes, under DIR (default target/image):
#   sluice-VERSION.oci/       an OCI image layout (oci-layout, index.json, blobs/sha256/...)
#   sluice-VERSION.oci.tar    the same layout as one tar, plus Docker's manifest.json: the
#                             forms `docker load`, `podman load`, `ctr images import` and
#                             `kind load image-archive` read, naming it sluice:VERSION (none
#                             of them runs here: sluice/tests/image.rs runs the layout itself)
# and prints the tar's path. The image is labelled with the version and git revision that
# `sluice --version` reports. Nothing of the build machine or the hour goes in: entries are
# sorted, owner and mtime fixed (the commit's time or $SOURCE_DATE_EPOCH), gzip stores no name.
#
# Why not umoci or buildah: no registry is needed for a single-layer image from scratch, and
# the OCI layout is three JSON documents and a tar (image-spec v1.1: image-layout.md,
# manifest.md, config.md), which sha256sum and tar write here with nothing to install.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
binary=""
out="$root/target/image"
compression=-9
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compression=-1; shift ;; # tests: a quicker, larger layer
    *) echo "usage: scripts/build-image.sh [--binary PATH] [--out DIR] [--fast]" >&2; exit 2 ;;
  esac
done
if [ -z "$binary" ]; then
  (cd "$root" && cargo build --release --locked -p sluice >&2)
  binary="${CARGO_TARGET_DIR:-$root/target}/release/sluice"
fi
# "sluice 0.1.0 (commit f54ce4d7d89d)": the labels say what the binary says.
read -r _ version _ revision < <("$binary" --version)
revision=${revision%)}
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) arch=$(uname -m) ;;
esac
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
uid=65532

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
rootfs=$work/rootfs
install -D -m 0755 "$binary" "$rootfs/usr/bin/sluice"
# Every library the dynamic loader resolves, and the loader itself, at the path the binary
# names (symbolic links resolved: the image holds files only). A static binary has none, and
# ldd says so and fails.
{ ldd "$binary" || true; } | awk '/=> \//{print $3} /^[ \t]*\//{print $1}' | while read -r lib; do
  install -D -m 0755 "$(readlink -f "$lib")" "$rootfs$lib"
done
install -d -m 0755 "$rootfs/etc" "$rootfs/tmp"
chmod 1777 "$rootfs/tmp"
printf 'root:x:0:0:root:/:/sbin/nologin\nsluice:x:%d:%d:sluice:/nonexistent:/sbin/nologin\n' \
  "$uid" "$uid" > "$rootfs/etc/passwd"
printf 'root:x:0:\nsluice:x:%d:\n' "$uid" > "$rootfs/etc/group"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group"

layout="$out/sluice-$version.oci"
rm -rf "$layout"
mkdir -p "$layout/blobs/sha256"
blob() { # FILE -> moves it into blobs/, prints "DIGEST SIZE"
  local digest size
  digest=$(sha256sum "$1" | cut -d' ' -f1)
  size=$(stat -c %s "$1")
  mv "$1" "$layout/blobs/sha256/$digest"
  echo "$digest $size"
}
tar --create --file "$work/layer.tar" --directory "$rootfs" --sort=name --numeric-owner \
  --owner=0 --group=0 --mtime="@$epoch" --format=gnu .
diff_id=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
gzip "$compression" -n "$work/layer.tar"
read -r layer_digest layer_size < <(blob "$work/layer.tar.gz")

labels=$(printf '"org.opencontainers.image.title":"sluice","org.opencontainers.image.version":"%s","org.opencontainers.image.revision":"%s","org.opencontainers.image.created":"%s"' \
  "$version" "$revision" "$created")
cat > "$work/config.json" <<EOF
{"architecture":"$arch","os":"linux","created":"$created","config":{"User":"$uid:$uid","Entrypoint":["/usr/bin/sluice"],"Cmd":["run","--config","/etc/sluice/node.yaml"],"WorkingDir":"/","Env":["PATH=/usr/bin"],"Labels":{$labels}},"rootfs":{"type":"layers","diff_ids":["sha256:$diff_id"]},"history":[{"created":"$created","created_by":"scripts/build-image.sh"}]}
EOF
read -r config_digest config_size < <(blob "$work/config.json")
cat > "$work/manifest.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:$config_digest","size":$config_size},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:$layer_digest","size":$layer_size}],"annotations":{$labels}}
EOF
read -r manifest_digest manifest_size < <(blob "$work/manifest.json")
# ref.name is the tag (OCI); io.containerd.image.name the full name `ctr images import` gives
# it. Kubernetes names the image `sluice:VERSION`, which is docker.io/library/sluice:VERSION.
cat > "$layout/index.json" <<EOF
{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:$manifest_digest","size":$manifest_size,"annotations":{"org.opencontainers.image.ref.name":"$version","io.containerd.image.name":"docker.io/library/sluice:$version"},"platform":{"architecture":"$arch","os":"linux"}}]}
EOF
echo '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
# What `docker load` before Docker 25 reads (later ones read index.json).
cat > "$layout/manifest.json" <<EOF
[{"Config":"blobs/sha256/$config_digest","RepoTags":["sluice:$version"],"Layers":["blobs/sha256/$layer_digest"]}]
EOF
archive="$out/sluice-$version.oci.tar"
tar --create --file "$archive" --directory "$layout" --sort=name --numeric-owner --owner=0 \
  --group=0 --mtime="@$epoch" .
echo "$archive"
