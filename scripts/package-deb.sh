#!/usr/bin/env bash
# Builds the Debian package: scripts/package-deb.sh [--binary PATH] [--out DIR]
#
# Without --binary it builds `sluice` in release (cargo build --release --locked -p sluice).
# The package installs /usr/bin/sluice, its man pages and bash/zsh/fish completions, the
# systemd units of deploy/systemd/ (none enabled),
# an example node config (/etc/sluice/node.yaml, a conffile), the docs, and on install a
# `sluice` system user, /var/lib/sluice and a random JWT secret for the example.
# Prints the path of the .deb it wrote. Needs dpkg-deb (Debian's dpkg).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
binary=""
out="$root/target/debian"
compression=(-Zxz)
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compression=(-Zgzip -z1); shift ;;
    *) echo "usage: scripts/package-deb.sh [--binary PATH] [--out DIR] [--fast]" >&2; exit 2 ;;
  esac
done
if [ -z "$binary" ]; then
  (cd "$root" && cargo build --release --locked -p sluice >&2)
  binary="${CARGO_TARGET_DIR:-$root/target}/release/sluice"
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
arch=$(dpkg --print-architecture)
stage=$(mktemp -d)
chmod 0755 "$stage"
trap 'rm -rf "$stage"' EXIT
install -D -m 0755 "$binary" "$stage/usr/bin/sluice"
for unit in "$root"/deploy/systemd/*.service; do
  install -D -m 0644 "$unit" "$stage/lib/systemd/system/$(basename "$unit")"
done
install -D -m 0644 "$root/deploy/debian/node.yaml" "$stage/etc/sluice/node.yaml"
# Man pages and shell completions come from the binary's own CLI definition (`sluice man`,
# `sluice completions`), so they say what this build's --help says.
"$binary" man --out-dir "$stage/usr/share/man/man1"
gzip -9n "$stage"/usr/share/man/man1/*.1
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
  "$stage/usr/share/fish/vendor_completions.d"
"$binary" completions bash > "$stage/usr/share/bash-completion/completions/sluice"
"$binary" completions zsh > "$stage/usr/share/zsh/vendor-completions/_sluice"
"$binary" completions fish > "$stage/usr/share/fish/vendor_completions.d/sluice.fish"
for doc in "$root"/README.md "$root"/docs/*.md; do
  install -D -m 0644 "$doc" "$stage/usr/share/doc/sluice/$(basename "$doc")"
done
install -d "$stage/DEBIAN"
sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$arch/" "$root/deploy/debian/control" > "$stage/DEBIAN/control"
install -m 0755 "$root/deploy/debian/postinst" "$root/deploy/debian/postrm" "$stage/DEBIAN/"
install -m 0644 "$root/deploy/debian/conffiles" "$stage/DEBIAN/"
mkdir -p "$out"
deb="$out/sluice_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compression[@]}" --build "$stage" "$deb" >&2
echo "$deb"
