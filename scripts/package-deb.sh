#!/usr/bin/env bash
# Builds the Debian packages:
#   scripts/package-deb.sh [--binary PATH] [--out DIR] [--fast] [--revision N]
#
# Without --binary it builds `sluice` in release (cargo build --release --locked -p sluice).
# Writes sluice_<version>-<N>_<arch>.deb and sluice-dbgsym_<version>-<N>_<arch>.deb (N: the
# Debian revision, default 1; a higher one packages the same upstream version as an upgrade)
# and prints their paths, one per line, the package first.
#
# sluice: /usr/bin/sluice stripped (its debug info split into sluice-dbgsym under
# /usr/lib/debug/.build-id/, found through the binary's build id or .gnu_debuglink), Depends
# from dpkg-shlibdeps on that binary, its man pages and bash/zsh/fish completions, the systemd
# units of deploy/systemd/ (none enabled), an example node config (/etc/sluice/node.yaml, a
# conffile), example configs for every role in /usr/share/doc/sluice/examples/, the docs,
# copyright and changelog, and the maintainer scripts of deploy/debian/ (user, state directory
# and JWT secret on install; units stopped on remove, restarted on upgrade; all removed on
# purge). Needs dpkg-deb and dpkg-shlibdeps (dpkg-dev), objcopy and readelf (binutils).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
debian="$root/deploy/debian"
binary=""
out="$root/target/debian"
compression=(-Zxz)
revision=1
usage="usage: scripts/package-deb.sh [--binary PATH] [--out DIR] [--fast] [--revision N]"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --fast) compression=(-Zgzip -z1); shift ;;
    --revision) revision=$2; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
case "$revision" in
  '' | *[!0-9]*) echo "--revision takes a number: $revision" >&2; exit 2 ;;
esac
if [ -z "$binary" ]; then
  (cd "$root" && cargo build --release --locked -p sluice >&2)
  binary="${CARGO_TARGET_DIR:-$root/target}/release/sluice"
fi
upstream=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
version="$upstream-$revision"
arch=$(dpkg --print-architecture)
units=$(cd "$root/deploy/systemd" && echo *.service)

# dpkg-shlibdeps wants the source tree's layout: debian/control, debian/<package>/DEBIAN.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
stage="$work/debian/sluice"
dbgsym="$work/debian/sluice-dbgsym"
install -d -m 0755 "$stage/DEBIAN" "$dbgsym/DEBIAN"
printf 'Source: sluice\n\nPackage: sluice\nArchitecture: any\n' > "$work/debian/control"

# Depends: the packages of the libraries the binary links (its NEEDED entries), at the versions
# its symbols need (stripping leaves the dynamic section as it is).
install -D -m 0755 "$binary" "$stage/usr/bin/sluice"
shlibs=$(cd "$work" && dpkg-shlibdeps -O -edebian/sluice/usr/bin/sluice | sed -n 's/^shlibs:Depends=//p')
if [ -z "$shlibs" ]; then
  echo "dpkg-shlibdeps found no library dependencies for $binary" >&2
  exit 1
fi

# The debug info goes to a file named by the build id, where gdb and debuginfod look for it;
# the binary keeps only what it runs with, plus a .gnu_debuglink naming that file.
build_id=$(readelf --notes "$stage/usr/bin/sluice" | sed -n 's/^ *Build ID: *//p' | head -1)
if [ -z "$build_id" ]; then
  echo "$binary has no build id (link with --build-id)" >&2
  exit 1
fi
debug_file="$dbgsym/usr/lib/debug/.build-id/${build_id:0:2}/${build_id:2}.debug"
install -d "$(dirname "$debug_file")"
objcopy --only-keep-debug --compress-debug-sections "$stage/usr/bin/sluice" "$debug_file"
chmod 0644 "$debug_file"
# As dh_strip does: debug sections, unneeded symbols, the compiler's .comment and .note.
objcopy --remove-section=.comment --remove-section=.note --strip-unneeded \
  --add-gnu-debuglink="$debug_file" "$stage/usr/bin/sluice"

for unit in "$root"/deploy/systemd/*.service; do
  install -D -m 0644 "$unit" "$stage/lib/systemd/system/$(basename "$unit")"
done
install -D -m 0644 "$debian/node.yaml" "$stage/etc/sluice/node.yaml"
# Man pages and shell completions come from the binary's own CLI definition (`sluice man`,
# `sluice completions`), so they say what this build's --help says.
"$stage/usr/bin/sluice" man --out-dir "$stage/usr/share/man/man1"
gzip -9n "$stage"/usr/share/man/man1/*.1
install -d "$stage/usr/share/bash-completion/completions" "$stage/usr/share/zsh/vendor-completions" \
  "$stage/usr/share/fish/vendor_completions.d"
"$stage/usr/bin/sluice" completions bash > "$stage/usr/share/bash-completion/completions/sluice"
"$stage/usr/bin/sluice" completions zsh > "$stage/usr/share/zsh/vendor-completions/_sluice"
"$stage/usr/bin/sluice" completions fish > "$stage/usr/share/fish/vendor_completions.d/sluice.fish"

doc="$stage/usr/share/doc/sluice"
for file in "$root"/README.md "$root"/docs/*.md; do
  install -D -m 0644 "$file" "$doc/$(basename "$file")"
done
install -d "$doc/examples"
install -m 0644 "$debian"/examples/* "$doc/examples/"
install -m 0644 "$debian/copyright" "$doc/copyright"
install -D -m 0644 "$debian/lintian-overrides" "$stage/usr/share/lintian/overrides/sluice"
# The changelog's newest entry must be this version: a revision it does not list yet gets an
# entry of its own on top (a rebuild of the same upstream version), dated after the entry
# below it as lintian requires.
{
  if ! head -1 "$debian/changelog" | grep -qF "sluice ($version)"; then
    previous=$(date -d "$(sed -n 's/^ -- .*>  //p' "$debian/changelog" | head -1)" +%s)
    stamp=${SOURCE_DATE_EPOCH:-$(date +%s)}
    if [ "$stamp" -le "$previous" ]; then stamp=$((previous + 1)); fi
    printf 'sluice (%s) unstable; urgency=medium\n\n' "$version"
    printf '  * Rebuild of %s (scripts/package-deb.sh --revision %s).\n\n' "$upstream" "$revision"
    printf ' -- Sluice developers <sluice@example.invalid>  %s\n\n' "$(date -R -u -d "@$stamp")"
  fi
  cat "$debian/changelog"
} | gzip -9n > "$doc/changelog.Debian.gz"
chmod 0644 "$doc/changelog.Debian.gz"
install -d "$dbgsym/usr/share/doc"
ln -s sluice "$dbgsym/usr/share/doc/sluice-dbgsym"

# control: Installed-Size in KiB of what the package installs (DEBIAN/ is still empty).
control() {
  local template=$1 tree=$2
  sed -e "s/@VERSION@/$version/g" -e "s/@ARCH@/$arch/" -e "s/@SHLIBS_DEPENDS@/$shlibs/" \
    -e "s/@BUILD_ID@/$build_id/" -e "s/@INSTALLED_SIZE@/$(du -sk --apparent-size "$tree" | cut -f1)/" \
    "$template"
}
control "$debian/control" "$stage" > "$stage/DEBIAN/control"
control "$debian/control.dbgsym" "$dbgsym" > "$dbgsym/DEBIAN/control"
for script in postinst prerm postrm; do
  sed "s/@UNITS@/$units/" "$debian/$script" > "$stage/DEBIAN/$script"
  chmod 0755 "$stage/DEBIAN/$script"
done
install -m 0644 "$debian/conffiles" "$stage/DEBIAN/"
(cd "$stage" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
  xargs -0 md5sum) > "$stage/DEBIAN/md5sums"
(cd "$dbgsym" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z |
  xargs -0 md5sum) > "$dbgsym/DEBIAN/md5sums"
chmod 0644 "$stage/DEBIAN/md5sums" "$dbgsym/DEBIAN/md5sums"

mkdir -p "$out"
deb="$out/sluice_${version}_${arch}.deb"
dbgsym_deb="$out/sluice-dbgsym_${version}_${arch}.deb"
dpkg-deb --root-owner-group "${compression[@]}" --build "$stage" "$deb" >&2
dpkg-deb --root-owner-group "${compression[@]}" --build "$dbgsym" "$dbgsym_deb" >&2
echo "$deb"
echo "$dbgsym_deb"
