#!/usr/bin/env bash
# Refresh the chat page's vendored libraries (web/vendor/) from the npm registry at pinned
# versions, check each tarball against its pinned SHA-512, keep each license beside its
# files, record the versions in web/vendor/VERSIONS, and check the page's weight.
#
#   scripts/vendor-web.sh           fetch, verify, unpack, check sizes
#   scripts/vendor-web.sh --check   only check the sizes of what is in web/ now
#
# To move to a new version: change its line below (version and the registry's
# dist.integrity, from `curl -s https://registry.npmjs.org/PKG/VERSION`), run this script,
# run the browser tests (tests/web/test_page_browser.py), commit web/vendor/ with the new line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
vendor=$root/web/vendor
registry=${NPM_REGISTRY:-https://registry.npmjs.org}
# All of web/ (HTML, CSS, scripts; not the license files) must stay under this: the chat
# page, the admin page and people mode's modules (337 KB). What the chat page itself loads
# (308 KB in open mode) is measured by tests/web/test_page_browser.py, under 320 KB.
BUDGET_BYTES=$((350 * 1024))

# package  version  integrity (sha512, base64)  directory  files to keep (path in the tarball)
PACKAGES=(
  "marked 18.2.1 ii4bxCTCqqwpT86XZWgJNs+ZnAIZksmLGYMViWA7PDIXYIeNo1x6cDdX3JOip9NM/cI6p8z57FxliACboTruMA== marked lib/marked.umd.js LICENSE"
  "dompurify 3.5.0 LYC0ZkE8P1V42JsRYTwMdme/2ET8SpOc5AA2eOFjP/IadvRd2fwiT4TVz5vkfy0XUx12aS2UaRkTnfVPNOv9vw== dompurify dist/purify.min.js LICENSE LICENSE-MPL"
  # The "common" build: core plus 36 common languages (bash, c, cpp, python, sql, ...) in one browser script (129 KB);
  # core plus the same languages one file each would be no smaller.
  "@highlightjs/cdn-assets 11.12.0 KvOKXODaiFmId9xaq3xc5xCL66wVLUuOngDbO9B/kewbFTqdGbn2nJxNhN3H5R1cgDTVj6R8vH0zgiNDEGjpDw== highlight highlight.min.js LICENSE"
)

say() { echo "vendor-web: $*" >&2; }

page_weight() {
  # Everything the page loads: web/ minus licenses and the version record.
  find "$root/web" -type f ! -name 'LICENSE*' ! -name VERSIONS -printf '%s %P\n' | sort -k2
}

check_sizes() {
  local total=0 size path
  while read -r size path; do
    printf '%8d  web/%s\n' "$size" "$path"
    total=$((total + size))
  done < <(page_weight)
  printf '%8d  total (budget %d)\n' "$total" "$BUDGET_BYTES"
  if [ "$total" -ge "$BUDGET_BYTES" ]; then
    say "the page weighs $total bytes, over the budget of $BUDGET_BYTES"
    return 1
  fi
}

if [ "${1:-}" = --check ]; then
  check_sizes
  exit
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
versions="# Written by scripts/vendor-web.sh: package version integrity\n"
for line in "${PACKAGES[@]}"; do
  read -r pkg version integrity dir files <<<"$line"
  base=${pkg##*/}
  url="$registry/$pkg/-/$base-$version.tgz"
  say "$pkg@$version"
  curl -fsSL --retry 2 -o "$tmp/$base.tgz" "$url"
  got=$(openssl dgst -sha512 -binary "$tmp/$base.tgz" | base64 -w0)
  if [ "$got" != "$integrity" ]; then
    say "$url: sha512-$got is not the pinned sha512-$integrity"
    exit 1
  fi
  mkdir -p "$tmp/$base"
  tar -xzf "$tmp/$base.tgz" -C "$tmp/$base"
  rm -rf "${vendor:?}/$dir.new"
  mkdir -p "$vendor/$dir.new"
  for f in $files; do
    # Drop the source-map comment: the maps are not vendored (a browser's devtools would
    # ask for them and get 404s).
    sed '/^\/\/# sourceMappingURL=/d' "$tmp/$base/package/$f" > "$vendor/$dir.new/$(basename "$f")"
  done
  rm -rf "${vendor:?}/$dir"
  mv "$vendor/$dir.new" "$vendor/$dir"
  versions+="$pkg $version sha512-$integrity\n"
done
printf '%b' "$versions" > "$vendor/VERSIONS"
check_sizes
