#!/usr/bin/env bash
# Writes the seed corpora of the fuzz targets, made from the golden files of
# format v1, into OUT_DIR/<target>/ (one directory per ckpt_fuzz_<target>):
#
#   fuzz/make_corpus.sh OUT_DIR [GOLDEN_DIR]
#
# GOLDEN_DIR defaults to tests/data/v1/golden. Every step-*/ in it with a
# MANIFEST and its shard-*.ckpt files is used, and the `latest` file. The
# seeds are generated, not checked in, so they follow the golden files when
# those are regenerated. Needs bash, coreutils (head, tail, od, stat); the
# zstd command, when present, adds compressed blocks to the `block` seeds.
set -euo pipefail

if (($# < 1 || $# > 2)); then
  echo "usage: $0 OUT_DIR [GOLDEN_DIR]" >&2
  exit 2
fi
out=$1
golden=${2:-$(cd "$(dirname "$0")/.." && pwd)/tests/data/v1/golden}
if [[ ! -d $golden ]]; then
  echo "make_corpus: no golden directory $golden" >&2
  exit 1
fi

targets=(manifest shard_header shard_tail shard_index latest block plan_record
  reshard_overrides hdf5_plan safetensors_header pickle torch_zip)
for t in "${targets[@]}"; do mkdir -p "$out/$t"; done

# le64 N: N as 8 little-endian bytes on stdout.
le64() {
  local v=$1 i s=
  for ((i = 0; i < 8; i++)); do
    s+=$(printf '\\x%02x' $(((v >> (8 * i)) & 255)))
  done
  printf "$s"
}
# le32 N: N as 4 little-endian bytes on stdout.
le32() {
  local v=$1 i s=
  for ((i = 0; i < 4; i++)); do
    s+=$(printf '\\x%02x' $(((v >> (8 * i)) & 255)))
  done
  printf "$s"
}
# read_le64 FILE OFFSET: the u64le at OFFSET of FILE, in decimal (values
# below 2^63 only; used for offsets and lengths).
read_le64() {
  local v=0 b i=0
  for b in $(od -An -v -t u1 -j "$2" -N 8 "$1"); do
    v=$((v | (b << (8 * i))))
    i=$((i + 1))
  done
  echo "$v"
}
fsize() { stat -c %s "$1"; }

n_step=0
for step in "$golden"/step-*; do
  [[ -d $step ]] || continue
  n_step=$((n_step + 1))
  s=$(basename "$step")
  if [[ -f $step/MANIFEST ]]; then
    cp "$step/MANIFEST" "$out/manifest/$s-MANIFEST"
  fi
  for f in "$step"/shard-*.ckpt; do
    [[ -f $f ]] || continue
    b=$s-$(basename "$f" .ckpt)
    size=$(fsize "$f")
    # shard_header: the first 64 bytes.
    head -c 64 "$f" >"$out/shard_header/$b-header"
    # shard_tail: the last 32 bytes (file size = input size, 32: rejected,
    # and the first 8 bytes as the size), and the file size as u64le
    # followed by them (a valid tail for the first-8-bytes size).
    tail -c 32 "$f" >"$out/shard_tail/$b-tail"
    { le64 "$size"; tail -c 32 "$f"; } >"$out/shard_tail/$b-size-tail"
    # shard_index: the whole file, and a compact copy without the payload
    # area (header, index, tail with index_offset 64). The compact copy's
    # chunks point past its index, so it fails the payload-range check, but
    # all its bytes are index bytes: mutations land in the index instead of
    # the payload, and the fuzzer gets to the end of the index parser.
    cp "$f" "$out/shard_index/$b"
    off=$(read_le64 "$f" $((size - 32)))
    len=$(read_le64 "$f" $((size - 24)))
    if ((off >= 64 && off + len + 32 == size)); then
      {
        head -c 64 "$f"
        tail -c $((len + 32)) "$f" | head -c "$len"
        le64 64
        le64 "$len"
        tail -c 16 "$f"  # index checksum (of the same bytes) and magic
      } >"$out/shard_index/$b-compact"
    else
      echo "make_corpus: $f: tail does not locate the index; no compact seed" >&2
    fi
  done
done
if ((n_step == 0)); then
  echo "make_corpus: no step-* directory in $golden" >&2
  exit 1
fi
if [[ -f $golden/latest ]]; then
  cp "$golden/latest" "$out/latest/latest"
fi

# block: codec byte, raw size (u32le), stored bytes (see block_fuzz.cc).
{ printf '\x00'; le32 16; printf '0123456789abcdef'; } >"$out/block/raw-16"
# A zstd frame with one RLE block: 100 x 'a' (magic, single-segment
# descriptor, 1-byte content size 100, block header last|RLE|100, 'a').
{ printf '\x01'; le32 100; printf '\x28\xb5\x2f\xfd\x20\x64\x23\x03\x00\x61'; } \
  >"$out/block/zstd-rle-100"
# A zstd frame with one raw block "hello" (not smaller than 5 raw bytes, so
# Decode rejects it; a starting point for the frame parser).
{ printf '\x01'; le32 5; printf '\x28\xb5\x2f\xfd\x20\x05\x29\x00\x00hello'; } \
  >"$out/block/zstd-rawblock-5"
if command -v zstd >/dev/null; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  seq 1 1500 >"$tmp/seq"
  for f in "$tmp/seq" "$golden"/step-*/MANIFEST; do
    [[ -f $f ]] || continue
    if [[ $f == "$tmp/seq" ]]; then
      name=zstd-seq
    else
      name=zstd-$(basename "$(dirname "$f")")-MANIFEST
    fi
    # From a file (not a pipe) the frame records its content size, which
    # Decode requires.
    zstd -q -c -3 "$f" >"$tmp/z"
    if (($(fsize "$tmp/z") < $(fsize "$f"))); then
      { printf '\x01'; le32 "$(fsize "$f")"; cat "$tmp/z"; } >"$out/block/$name"
    fi
  done
fi

# plan_record: PLAN section bodies (spec/FORMAT.md §7.4): version 1, world
# size, then per rank a 16-byte fingerprint, a write count and the
# delta-coded positions (varints). No golden file holds a PLAN section, so
# the seeds are written here: valid records and near misses.
# fp N: the 16 bytes N, N+1, ..., N+15 (a fingerprint).
fp() {
  local i s=
  for ((i = $1; i < $1 + 16; i++)); do s+=$(printf '\\x%02x' "$i"); done
  printf "$s"
}
{ printf '\x01\x01'; fp 0; printf '\x00'; } >"$out/plan_record/one-rank-no-writes"
{ printf '\x01\x01'; fp 16; printf '\x03\x02\x00\x06'; } >"$out/plan_record/one-rank-3-writes"
{
  printf '\x01\x03'
  fp 32; printf '\x04\x00\x00\x03\xa6\x02'  # 0, 1, 5, 300
  fp 48; printf '\x00'
  fp 64; printf '\x01\x07'
} >"$out/plan_record/three-ranks"
# A position near 2^32 - 1 (varint 0xfffffffe), then one more after it.
{ printf '\x01\x01'; fp 80; printf '\x02\xfe\xff\xff\xff\x0f\x00'; } \
  >"$out/plan_record/position-max"
{ printf '\x02\x01'; fp 96; printf '\x00'; } >"$out/plan_record/version-2"
{ printf '\x01\x02'; fp 112; printf '\x00'; } >"$out/plan_record/truncated-rank"

# reshard_overrides: ckpt-reshard --layout files (tools/reshard/overrides.h),
# valid ones and near misses.
seed_overrides() { printf '%s' "$2" >"$out/reshard_overrides/$1.json"; }
seed_overrides empty '{"entries": {}}'
seed_overrides tp '{"entries": {"layers.*.attn.qkv": {"split": "dim0"}, "layers.*.mlp.down": {"split": "dim1"}, "embed": {"split": "flat"}}}'
seed_overrides globs '{"entries": {"norm": {"split": "replicated"}, "a?c[0-9]": {"split": "dim31"}, "*": {"split": "flat"}}}'
seed_overrides unicode '{"entries": {"\u00e9t\u00e9": {"split": "dim2"}}}'
seed_overrides bad-split '{"entries": {"x": {"split": "dim01"}}}'
seed_overrides bad-type '{"entries": {"x": {"split": 1}, "y": {"splt": "dim0"}}}'
seed_overrides not-object '[{"entries": {}}]'

# hdf5_plan: HDF5 files for ckpt-convert --from hdf5. Exports of the golden
# checkpoint by ckpt-convert (every dtype, objects, metadata attributes;
# CKPT_CONVERT or build/bin/ckpt-convert), when that binary is there.
convert=${CKPT_CONVERT:-$(cd "$(dirname "$0")/.." && pwd)/build/bin/ckpt-convert}
if [[ -x $convert ]]; then
  for step in "$golden"/step-*; do
    [[ -f $step/MANIFEST ]] || continue
    for c in none deflate; do
      "$convert" "$step" "$out/hdf5_plan/$(basename "$step")-$c.h5" --to hdf5 \
        --compression "$c" --force >/dev/null
    done
  done
else
  echo "make_corpus: no ckpt-convert at $convert: hdf5_plan gets no seeds" >&2
fi

# safetensors_header, pickle, torch_zip: the interop fixtures of
# tests/data/interop/ (the reference implementation's safetensors samples,
# DCP metadata of torch 1.13 and 2.13 (global and rank-local), torch.save
# records of both, and the hostile files), plus exports of the golden
# checkpoint.
interop=$(cd "$(dirname "$0")/.." && pwd)/tests/data/interop
if [[ -d $interop ]]; then
  cp "$interop"/safetensors/*.safetensors "$out/safetensors_header/"
  printf '%s' '{"metadata":{"total_size":6},"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00002-of-00002.safetensors"}}' \
    >"$out/safetensors_header/index.json"
  for d in dcp_torch113 dcp_torch213 megatron_torch_dist hostile/dcp_os_system hostile/dcp_outside; do
    cp "$interop/$d/.metadata" "$out/pickle/$(echo "$d" | tr / -).metadata"
  done
  cp "$interop/dcp_torch213_rank_local/__0.metadata" "$out/pickle/dcp_torch213_rank_local-__0.metadata"
  cp "$interop/hostile/os_system.pkl" "$out/pickle/"
  for f in "$interop"/hostile/*.zip "$interop"/megatron_torch_dist/common.pt \
      "$interop"/dcp_torch113/__0_0.distcp "$interop"/dcp_torch113/__0_1.distcp \
      "$interop"/dcp_torch213_item_files/__0_0.distcp "$interop"/dcp_torch213_item_files/__1_7.distcp; do
    cp "$f" "$out/torch_zip/$(basename "$(dirname "$f")")-$(basename "$f")"
  done
fi
if [[ -x $convert ]]; then
  for step in "$golden"/step-*; do
    [[ -f $step/MANIFEST ]] || continue
    "$convert" "$step" "$out/safetensors_header/$(basename "$step").safetensors" \
      --to safetensors --force >/dev/null
  done
fi

for t in "${targets[@]}"; do
  echo "make_corpus: $t: $(find "$out/$t" -type f | wc -l) seeds in $out/$t"
done
