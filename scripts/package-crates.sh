#!/bin/sh
# Packages the crates a `cargo add aotriton` user gets (the runtime crate and the per-arch image
# crates) and proves them as such a user would: in a fresh directory with no Python and no
# network, a consumer crate (test/crates/consumer) builds against the packaged crates and the
# vendored dependencies, and runs to the no-driver error (or its launch, given a GPU); the same
# with `no-images` and a built-in image directory; and `DOCS_RS=1 cargo doc` succeeds offline.
#
#   scripts/package-crates.sh [IMAGES_DIR]
#
# IMAGES_DIR (default build/images) holds the packed archives (aotriton-<arch>.images) the
# superbuild produced; each is copied into its image crate (sm_90's and sm_80's split in two: one
# crate may be at most 10 MiB on crates.io). An arch without an archive is packaged without one (its
# feature then fails to build, naming the crate). The .crate files end up in
# target/package-crates/ (AOTRITON_CRATES_OUT overrides), listed with their sizes; each must be
# at most 10 MiB. Takes the dependencies from cargo's cache, fetching what is missing there; the
# consumer's builds themselves are offline.
set -eu
ROOT=$(cd "$(dirname "$0")/.." && pwd)
IMAGES=$(cd "${1:-$ROOT/build/images}" && pwd)
OUT=${AOTRITON_CRATES_OUT:-$ROOT/target/package-crates}
MAX_CRATE=10485760
# A part of a split archive; well below the limit, the crate's own files are a few KiB.
PART_SIZE=$((9 * 1024 * 1024))
started=$(date +%s)
say() { echo "package-crates: $*"; }
die() { echo "package-crates: FAIL: $*" >&2; exit 1; }

# The superbuild's variables would make the build script pack build/kernels instead of taking
# the image crates: this is the crate user's build, which has none of them.
unset AOTRITON_KERNEL_DIR AOTRITON_TARGET_ARCH AOTRITON_ARCHIVE_OUT_DIR AOTRITON_IMAGE_DIR AOTRITON_DEFAULT_IMAGE_DIR DOCS_RS

# 1. Archives into the image crates, with their SHA-256 (checked again by aotriton's build script).
packages="-p aotriton"
for spec in sm90:sm_90 sm80:sm_80 gfx942:gfx942 gfx90a:gfx90a gfx950:gfx950; do
  name=${spec%%:*} arch=${spec#*:}
  crate=$ROOT/crates/aotriton-images-$name
  archive=$IMAGES/aotriton-$arch.images
  rm -f "$crate"/aotriton-*.images* "$ROOT/crates/aotriton-images-$name-part2"/aotriton-*.images*
  packages="$packages -p aotriton-images-$name"
  [ -d "$ROOT/crates/aotriton-images-$name-part2" ] && packages="$packages -p aotriton-images-$name-part2"
  if [ ! -f "$archive" ]; then
    say "no $arch archive in $IMAGES: aotriton-images-$name is packaged without one"
    continue
  fi
  size=$(wc -c < "$archive")
  if [ -d "$ROOT/crates/aotriton-images-$name-part2" ]; then
    [ "$size" -le $((2 * PART_SIZE)) ] || die "$archive is $size bytes, more than two parts of $PART_SIZE"
    head -c "$PART_SIZE" "$archive" > "$crate/aotriton-$arch.images.part1"
    tail -c +$((PART_SIZE + 1)) "$archive" > "$ROOT/crates/aotriton-images-$name-part2/aotriton-$arch.images.part2"
  else
    [ "$size" -le "$PART_SIZE" ] || die "$archive is $size bytes: give aotriton-images-$name a second part (crates/generate.sh)"
    cp "$archive" "$crate/"
  fi
  (cd "$IMAGES" && sha256sum "aotriton-$arch.images") > "$crate/aotriton-$arch.images.sha256"
  say "$arch: $size bytes into aotriton-images-$name"
done

# 2. The .crate files. Not verified by cargo here: the consumer below is the stronger check.
rm -rf "$OUT"
mkdir -p "$OUT"
# Offline from cargo's cache when it has every dependency; else fetched (the consumer below never is).
(cd "$ROOT" && { cargo package --offline --allow-dirty --no-verify --quiet $packages --target-dir "$OUT/target" 2> /dev/null \
  || cargo package --allow-dirty --no-verify --quiet $packages --target-dir "$OUT/target"; })
mv "$OUT"/target/package/*.crate "$OUT/"
say ".crate sizes (limit $MAX_CRATE bytes):"
for f in "$OUT"/*.crate; do
  size=$(wc -c < "$f")
  printf '  %10d  %s\n' "$size" "$(basename "$f")"
  [ "$size" -le $MAX_CRATE ] || die "$(basename "$f") is larger than 10 MiB"
done

# 3. A fresh directory: a directory source with the packaged crates and the vendored
# dependencies, a new CARGO_HOME, no network, and a PATH with the toolchain and the C compiler
# (liblzma's sources) only: no Python, no cmake.
WORK=$(mktemp -d "${TMPDIR:-/tmp}/aotriton-crates.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/vendor" "$WORK/cargo-home" "$WORK/bin"
(cd "$ROOT" && { cargo vendor --offline --locked --versioned-dirs --quiet "$WORK/vendor" > /dev/null 2>&1 \
  || cargo vendor --locked --versioned-dirs --quiet "$WORK/vendor" > /dev/null; })
for f in "$OUT"/*.crate; do
  base=$(basename "$f" .crate)
  rm -rf "$WORK/vendor/$base"
  tar -xzf "$f" -C "$WORK/vendor"
  # A directory source checks the files a crate's checksum file lists (none here) and records the
  # .crate's own digest in consumers' lock files.
  printf '{"files":{},"package":"%s"}' "$(sha256sum "$f" | cut -d' ' -f1)" > "$WORK/vendor/$base/.cargo-checksum.json"
done
cat > "$WORK/cargo-home/config.toml" <<EOF
[source.crates-io]
replace-with = "packaged"
[source.packaged]
directory = "$WORK/vendor"
[net]
offline = true
EOF
for tool in cargo rustc rustdoc cc ar as ld; do
  path=$(command -v "$tool") || die "$tool not found"
  ln -s "$path" "$WORK/bin/$tool"
done
cp -r "$ROOT/test/crates/consumer" "$WORK/consumer"
fresh() { # runs "$@" in the consumer with only the fresh environment
  (cd "$WORK/consumer" && env -i HOME="$HOME" PATH="$WORK/bin" CARGO_HOME="$WORK/cargo-home" \
    RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" CARGO_TARGET_DIR="$WORK/target" CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}" "$@")
}
fresh sh -c 'command -v python3 python cmake' > /dev/null 2>&1 && die "python or cmake is reachable from the fresh PATH"

# 4. The default features (sm90: the image crates): builds offline and runs to the no-driver
# error; the sm_90 archive comes from the image crates, checked against their SHA-256.
say "consumer, default features: cargo run --offline"
fresh cargo run --offline --quiet > "$WORK/run.txt" 2>&1 || { cat "$WORK/run.txt"; die "the consumer failed"; }
cat "$WORK/run.txt"
grep -q '^embedded archs: sm_90$' "$WORK/run.txt" || die "the consumer does not embed sm_90"
grep -q '^archive sm_90: aotriton-sm_90.images' "$WORK/run.txt" || die "the sm_90 archive does not open"
grep -Eq '^attn_fwd: (NoDriver|launched)' "$WORK/run.txt" || die "attn_fwd did not reach the driver"

# Parts of the archive that do not add up to the digest the crate states (e.g. a part2 crate of
# another version): the build fails naming both digests.
part2=$(echo "$WORK"/vendor/aotriton-images-sm90-part2-*/aotriton-sm_90.images.part2)
cp "$part2" "$WORK/part2.orig"
printf 'x' >> "$part2"
say "consumer, a tampered sm_90 part: the build must fail"
if fresh cargo build --offline --quiet > "$WORK/tampered.txt" 2>&1; then
  die "a build with a tampered archive part succeeded"
fi
grep -q 'aotriton-images-sm90 (sm_90): its parts have SHA-256 .*, the crate states' "$WORK/tampered.txt" \
  || { cat "$WORK/tampered.txt"; die "the tampered build failed for another reason"; }
cp "$WORK/part2.orig" "$part2"

# An arch feature whose crate carries no archive fails the build, naming the crate.
if [ ! -f "$IMAGES/aotriton-sm_80.images" ]; then
  say "consumer, feature sm80 (no sm_80 archive packaged): the build must fail naming its crate"
  if fresh cargo build --offline --quiet --no-default-features --features sm80 > "$WORK/sm80.txt" 2>&1; then
    die "a build with an empty image crate succeeded"
  fi
  grep -q 'feature `sm80`: the crate aotriton-images-sm80 carries no sm_80 archive' "$WORK/sm80.txt" \
    || { cat "$WORK/sm80.txt"; die "the sm80 build failed for another reason"; }
fi

# 5. no-images: nothing embedded; the archives come from the directory given at build time,
# checked against the manifest beside them.
IMAGE_DIR=$WORK/images
mkdir -m 755 "$IMAGE_DIR"
cp "$IMAGES/aotriton-sm_90.images" "$IMAGE_DIR/"
(cd "$IMAGE_DIR" && sha256sum aotriton-sm_90.images > aotriton-images.sha256)
say "consumer, feature no-images with AOTRITON_DEFAULT_IMAGE_DIR=$IMAGE_DIR"
fresh AOTRITON_DEFAULT_IMAGE_DIR="$IMAGE_DIR" cargo run --offline --quiet --no-default-features --features no-images \
  > "$WORK/run-noimages.txt" 2>&1 || { cat "$WORK/run-noimages.txt"; die "the no-images consumer failed"; }
cat "$WORK/run-noimages.txt"
grep -q '^embedded archs: $' "$WORK/run-noimages.txt" || die "a no-images build embeds archives"
grep -q "^archive sm_90: $IMAGE_DIR/aotriton-sm_90.images" "$WORK/run-noimages.txt" || die "the built-in image dir is not used"
grep -Eq '^attn_fwd: (NoDriver|launched)' "$WORK/run-noimages.txt" || die "attn_fwd did not reach the driver"

# 6. docs.rs: as docs.rs does, in the unpacked crate with its [package.metadata.docs.rs]
# features and DOCS_RS set, offline; every public item documented.
say "DOCS_RS=1 cargo doc --offline in the unpacked aotriton crate"
cp -r "$WORK/vendor/aotriton-0.1.0" "$WORK/docsrs"
(cd "$WORK/docsrs" && env -i HOME="$HOME" PATH="$WORK/bin" CARGO_HOME="$WORK/cargo-home" \
  RUSTUP_HOME="${RUSTUP_HOME:-$HOME/.rustup}" CARGO_TARGET_DIR="$WORK/target" DOCS_RS=1 \
  RUSTDOCFLAGS="-D missing_docs -D rustdoc::broken_intra_doc_links" \
  cargo doc --offline --quiet --no-deps --no-default-features --features no-images,cudarc-adapters) \
  || die "the documentation build failed"
[ -f "$WORK/target/doc/aotriton/index.html" ] || die "no documentation written"
say "PASS in $(($(date +%s) - started)) s"
