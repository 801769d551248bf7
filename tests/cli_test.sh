#!/usr/bin/env bash
# End-to-end test of the `savepoint` command-line tool (docs/CLI.md).
#
# Usage: tests/cli_test.sh SAVEPOINT_BIN CKPT_DIR [ZSTD_CKPT_DIR]
#   SAVEPOINT_BIN  the savepoint executable
#   CKPT_DIR       a committed checkpoint with at least one tensor whose data covers byte 4106 of
#                  data-00000-00000.spd (the first tensor extent starts at 4096), and an int value
#                  named "step". It is copied, never modified.
#   ZSTD_CKPT_DIR  optional: a zstd-compressed checkpoint with a mostly-zero tensor "zeros"
#                  (tests/helpers/make_checkpoint DIR zstd); adds the compression checks.
# Needs bash, coreutils, od, dd and python3. Prints "N passed, M failed"; exits 1 on any failure.
set -u

if [[ $# -ne 2 && $# -ne 3 ]]; then
  echo "usage: $0 SAVEPOINT_BIN CKPT_DIR [ZSTD_CKPT_DIR]" >&2
  exit 2
fi
SP=$1
SRC=${2%/}
ZSRC=${3:-}
if [[ ! -x $SP ]]; then echo "$0: not an executable: $SP" >&2; exit 2; fi
if [[ ! -f $SRC/MANIFEST ]]; then echo "$0: not a checkpoint: $SRC" >&2; exit 2; fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/savepoint-cli-test.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
NAME=$(basename "$SRC")
OUT=$TMP/stdout
ERR=$TMP/stderr
PASSED=0
FAILED=0

# run CMD...: runs CMD, keeping its stdout in $OUT, stderr in $ERR and exit status in $RC.
run() {
  "$@" >"$OUT" 2>"$ERR"
  RC=$?
}

pass() { PASSED=$((PASSED + 1)); echo "PASS: $1"; }

fail() {
  FAILED=$((FAILED + 1))
  echo "FAIL: $1 (exit $RC)"
  echo "  --- stdout:"; sed -n '1,20s/^/  | /p' "$OUT"
  echo "  --- stderr:"; sed -n '1,20s/^/  | /p' "$ERR"
}

# check DESCRIPTION CONDITION...: passes when CONDITION (a command) succeeds.
check() {
  local what=$1
  shift
  if "$@"; then pass "$what"; else fail "$what"; fi
}

rc_is() { [[ $RC -eq $1 ]]; }
out_has() { grep -qF -- "$1" "$OUT"; }
err_has() { grep -qF -- "$1" "$ERR"; }
# json_ok PYTHON_EXPR: stdout is one JSON document `j` for which PYTHON_EXPR is true.
json_ok() {
  python3 -c '
import json, sys
try:
    j = json.load(sys.stdin)
    ok = eval(sys.argv[1])
except Exception as e:  # invalid JSON, or a key the expression needs is missing
    print("  json_ok: %s: %s" % (type(e).__name__, e))
    ok = False
sys.exit(0 if ok else 1)' "$1" <"$OUT"
}

# copy DEST_ROOT: a fresh copy of the checkpoint at DEST_ROOT/$NAME.
copy() {
  mkdir -p "$1" && cp -r "$SRC" "$1/$NAME"
}

# flip_byte FILE OFFSET: replaces the byte at OFFSET by its complement, in place.
flip_byte() {
  local old
  old=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
  printf "\\$(printf '%03o' $((255 - old)))" | dd of="$1" bs=1 seek="$2" conv=notrunc status=none
}

ROOT=$TMP/root
CKPT=$ROOT/$NAME
copy "$ROOT"

# --- global -------------------------------------------------------------------------------------
run "$SP" --version
check "--version exits 0 and prints the version" eval 'rc_is 0 && out_has "savepoint "'
run "$SP" --help
check "--help exits 0 and lists the subcommands" eval 'rc_is 0 && out_has inspect && out_has gc'
run "$SP"
check "no subcommand is a usage error (64)" eval 'rc_is 64 && err_has "savepoint: "'
run "$SP" frobnicate "$CKPT"
check "unknown subcommand exits 64" eval 'rc_is 64 && err_has "unknown subcommand"'
run "$SP" inspect --no-such-option "$CKPT"
check "unknown option exits 64" eval 'rc_is 64 && err_has "savepoint: inspect: "'
run "$SP" verify --threads 0 "$CKPT"
check "verify --threads 0 is rejected" rc_is 64

# --- inspect ------------------------------------------------------------------------------------
run "$SP" inspect "$CKPT"
check "inspect exits 0" rc_is 0
check "inspect prints a header line" eval 'head -n1 "$OUT" | grep -Eq "^checkpoint $CKPT \(format version [0-9]+, created [0-9-]*T[0-9:]*Z, "'
check "inspect prints the tensor table" eval 'out_has "NAME" && out_has "DTYPE" && out_has "CHUNKS"'
check "inspect prints the step value" eval 'grep -Eq "^step +int +[0-9-]+$" "$OUT"'
check "inspect prints totals" eval 'grep -Eq "^total: [1-9][0-9]* tensors, [0-9]+ bytes" "$OUT"'
run "$SP" inspect --json "$CKPT"
check "inspect --json exits 0" rc_is 0
check "inspect --json prints valid JSON" json_ok True
check "inspect --json has the documented keys" json_ok \
  'set(j) == {"path","format_version","encrypted","created_ns","total_file_bytes","tensors","values","metadata","totals"} and j["encrypted"] is False'
check "inspect --json tensors are well-formed" json_ok \
  'len(j["tensors"]) >= 1 and all(set(t) == {"name","dtype","shape","bytes","shards","chunks","codec","filter","stored_bytes"} for t in j["tensors"])'
check "inspect --json totals add up" json_ok \
  'j["totals"] == {"tensors": len(j["tensors"]), "tensor_bytes": sum(t["bytes"] for t in j["tensors"]), "stored_bytes": sum(t["stored_bytes"] for t in j["tensors"]), "compression_ratio": 1.0}'
check "inspect --json has the int value step" json_ok \
  'any(v["name"] == "step" and v["kind"] == "int" and isinstance(v["value"], int) for v in j["values"])'
run "$SP" inspect --json --manifest "$CKPT"
check "inspect --json --manifest adds the manifest" json_ok 'isinstance(j["manifest"], dict)'
run "$SP" inspect "$TMP/no-such-checkpoint"
check "inspect of a missing path exits 3" eval 'rc_is 3 && err_has "savepoint: inspect: not found: "'
run "$SP" inspect "$ROOT"
check "inspect of a non-checkpoint directory exits 3" eval 'rc_is 3 && [[ ! -s $OUT ]]'

# --- verify -------------------------------------------------------------------------------------
run "$SP" verify "$CKPT"
check "verify of an intact checkpoint exits 0" eval 'rc_is 0 && grep -Eq "^OK: .*: [0-9]+ tensors, [0-9]+ bytes, [0-9]+ chunks verified in [0-9.]+ s \([0-9.]+ GB/s\)$" "$OUT"'
run "$SP" verify --json --threads 2 "$CKPT"
check "verify --json of an intact checkpoint" eval 'rc_is 0 && json_ok "j[\"ok\"] is True and j[\"error\"] is None and j[\"code\"] == \"ok\" and j[\"chunks\"] >= 1"'
check "verify --json says native format, checksummed" json_ok \
  'j["format"] == "native" and j["checksums"] is True and isinstance(j["stored_throughput_gbps"], (int, float))'
run "$SP" verify "$CKPT"
check "verify prints nothing on stderr when it is not a terminal (no progress)" eval 'rc_is 0 && [[ ! -s $ERR ]]'
run "$SP" verify --json "$CKPT"
check "verify --json prints nothing on stderr on success" eval 'rc_is 0 && [[ ! -s $ERR ]]'

BAD=$TMP/bad
copy "$BAD"
flip_byte "$BAD/$NAME/data-00000-00000.spd" $((4096 + 10))
run "$SP" verify "$BAD/$NAME"
check "verify of a flipped byte exits 2 (corruption)" rc_is 2
check "verify reports the CRC32C mismatch" eval 'err_has "CRC32C mismatch" && err_has "savepoint: verify: corruption: "'
run "$SP" verify --json "$BAD/$NAME"
check "verify --json reports the corruption" eval 'rc_is 2 && json_ok "j[\"ok\"] is False and j[\"code\"] == \"corruption\" and \"CRC32C mismatch\" in j[\"error\"]"'

NOMAN=$TMP/nomanifest
copy "$NOMAN"
rm "$NOMAN/$NAME/MANIFEST"
run "$SP" verify "$NOMAN/$NAME"
check "verify without MANIFEST exits 3 (not found)" eval 'rc_is 3 && err_has "savepoint: verify: not found: "'

# --- ls and gc ----------------------------------------------------------------------------------
run "$SP" ls "$ROOT"
check "ls lists the checkpoint as ok" eval 'rc_is 0 && grep -Eq "^$NAME +[0-9-]+ .* ok$" "$OUT"'
run "$SP" ls --json "$ROOT"
check "ls --json lists the committed checkpoint" json_ok \
  'len(j["checkpoints"]) == 1 and j["checkpoints"][0]["committed"] is True and j["checkpoints"][0]["problem"] is None and isinstance(j["checkpoints"][0]["step"], int)'

DEBRIS=".x.savepoint-tmp.999999999.0123456789abcdef"
mkdir "$ROOT/$DEBRIS"
echo junk >"$ROOT/$DEBRIS/data-00000-00000.spd"
run "$SP" ls "$ROOT"
check "ls shows the debris as INCOMPLETE" eval 'rc_is 0 && grep -Eq "^\\$DEBRIS .* INCOMPLETE: " "$OUT" && grep -Eq "^$NAME .* ok$" "$OUT"'
run "$SP" ls --json "$ROOT"
check "ls --json marks the debris uncommitted" json_ok \
  'any(c["name"] == "'"$DEBRIS"'" and c["committed"] is False and c["problem"] and c["step"] is None for c in j["checkpoints"])'
run "$SP" gc --dry-run "$ROOT"
check "gc --dry-run reports the debris" eval 'rc_is 0 && out_has "would remove $ROOT/$DEBRIS"'
check "gc --dry-run keeps the debris" test -d "$ROOT/$DEBRIS"
run "$SP" gc --min-age 3600 "$ROOT"
check "gc --min-age 3600 keeps fresh debris" eval 'rc_is 0 && [[ -d $ROOT/$DEBRIS ]] && out_has "0 removed"'
run "$SP" gc "$ROOT"
check "gc removes the debris" eval 'rc_is 0 && out_has "removed $ROOT/$DEBRIS" && out_has "1 removed, 0 restored" && [[ ! -e $ROOT/$DEBRIS ]]'
check "gc keeps the committed checkpoint" test -f "$CKPT/MANIFEST"
run "$SP" gc --json "$ROOT"
check "gc --json on a clean root" json_ok 'j["removed"] == [] and j["restored"] == [] and j["dry_run"] is False'
run "$SP" verify "$CKPT"
check "the checkpoint still verifies after gc" rc_is 0
run "$SP" ls "$TMP/no-such-root"
check "ls of a missing root exits 3" eval 'rc_is 3 && err_has "savepoint: ls: "'
run "$SP" gc "$TMP/no-such-root"
check "gc of a missing root exits 3" eval 'rc_is 3 && err_has "savepoint: gc: "'

# --- cp -----------------------------------------------------------------------------------------
copy "$TMP/cp-src"
run "$SP" cp "$TMP/cp-src/$NAME" "$TMP/cp-dst/sub/copy"
check "cp copies a checkpoint, parents created" eval 'rc_is 0 && out_has "copied" && [[ -f $TMP/cp-dst/sub/copy/MANIFEST ]]'
run "$SP" verify "$TMP/cp-dst/sub/copy"
check "the copy verifies" rc_is 0
cmp -s "$TMP/cp-src/$NAME/MANIFEST" "$TMP/cp-dst/sub/copy/MANIFEST"
check "the copy's MANIFEST is the source's" rc_is 0
run "$SP" cp "$TMP/cp-src/$NAME" "$TMP/cp-dst/sub/copy"
check "cp onto a checkpoint exits 1" eval 'rc_is 1 && err_has "already exists"'
run "$SP" cp --overwrite --json "$TMP/cp-src/$NAME" "$TMP/cp-dst/sub/copy"
check "cp --overwrite --json" json_ok 'j["files"] >= 2 and j["bytes"] > 0'
mkdir -p "$TMP/cp-none"
run "$SP" cp "$TMP/cp-none" "$TMP/cp-dst/none"
check "cp of a directory that is no checkpoint exits 3" eval 'rc_is 3 && err_has "not a committed checkpoint" && [[ ! -e $TMP/cp-dst/none ]]'

# --- compressed checkpoints ---------------------------------------------------------------------
run "$SP" verify --json "$CKPT"
check "verify --json prints the verify stats" json_ok \
  'j["stored_bytes"] == j["bytes"] and j["compression_ratio"] == 1 and isinstance(j["direct_io"], bool) and j["throughput_gbps"] >= 0 and j["seconds"] >= 0'
run "$SP" inspect --json "$CKPT"
check "inspect --json: an uncompressed checkpoint has ratio 1" json_ok \
  'j["totals"]["compression_ratio"] == 1 and all(t["codec"] == "none" and t["stored_bytes"] == t["bytes"] for t in j["tensors"])'
if [[ -n $ZSRC ]]; then
  ZROOT=$TMP/zroot
  mkdir -p "$ZROOT" && cp -r "$ZSRC" "$ZROOT/z"
  run "$SP" inspect "$ZROOT/z"
  check "inspect shows codec and stored columns" eval 'rc_is 0 && out_has "CODEC" && out_has "zstd+shuffle" && out_has "compression ratio"'
  run "$SP" inspect --json "$ZROOT/z"
  check "inspect --json: per-tensor codec and stored bytes" json_ok \
    '[t for t in j["tensors"] if t["name"] == "zeros"][0]["codec"] == "zstd" and [t for t in j["tensors"] if t["name"] == "zeros"][0]["stored_bytes"] < 100000'
  check "inspect --json: the checkpoint's compression ratio" json_ok \
    'j["totals"]["compression_ratio"] > 1.5 and j["totals"]["stored_bytes"] < j["totals"]["tensor_bytes"]'
  run "$SP" verify --json "$ZROOT/z"
  check "verify --json of a compressed checkpoint" json_ok \
    'j["ok"] is True and j["stored_bytes"] < j["bytes"] and j["compression_ratio"] > 1.5'
  ZVERIFY=$(cat "$OUT")
  run "$SP" inspect --json "$ZROOT/z"
  ZINSPECT=$(cat "$OUT")
  check "verify --json of a compressed checkpoint: bytes are logical, stored_bytes as on disk" \
    python3 -c '
import json, sys
v, i = json.loads(sys.argv[1]), json.loads(sys.argv[2])
close = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
sys.exit(0 if v["bytes"] == i["totals"]["tensor_bytes"] and
         v["stored_bytes"] == i["totals"]["stored_bytes"] and v["seconds"] > 0 and
         close(v["throughput_gbps"], v["bytes"] / v["seconds"] / 1e9) and
         close(v["stored_throughput_gbps"], v["stored_bytes"] / v["seconds"] / 1e9) and
         v["throughput_gbps"] > v["stored_throughput_gbps"] else 1)' "$ZVERIFY" "$ZINSPECT"
  run "$SP" verify "$ZROOT/z"
  check "verify of a compressed checkpoint shows logical and stored bytes" eval \
    'rc_is 0 && grep -Eq "^OK: .*: 3 tensors, [0-9]+ bytes, [0-9]+ chunks verified in [0-9.]+ s \([0-9.]+ GB/s\); stored: [0-9]+ bytes read at [0-9.]+ GB/s, compression ratio [0-9.]+$" "$OUT"'
  run "$SP" inspect --json --manifest "$ZROOT/z"
  ZOFF=$(python3 -c 'import json,sys; j=json.load(sys.stdin); print([t for t in j["manifest"]["tensors"] if t["name"] == "zeros"][0]["shards"][0]["stored_offsets"][0])' <"$OUT")
  flip_byte "$ZROOT/z/data-00000-00000.spd" $((ZOFF + 20))
  run "$SP" verify --json "$ZROOT/z"
  check "verify names the corrupt compressed chunk" eval 'rc_is 2 && json_ok "j[\"code\"] == \"corruption\" and \"tensor \\\"zeros\\\" chunk 0\" in j[\"error\"]"'
fi
# --- convert (safetensors) ----------------------------------------------------------------------
ST=$TMP/st
mkdir -p "$ST"
run "$SP" convert "$CKPT" "$ST/m.safetensors"
check "convert native -> safetensors exits 0" eval 'rc_is 0 && out_has "(native) to $ST/m.safetensors (safetensors)"'
check "the safetensors header length is a multiple of 8" eval \
  '[[ $(( $(od -An -tu8 -N8 "$ST/m.safetensors" | tr -d " ") % 8 )) -eq 0 ]]'
run "$SP" inspect --json "$ST/m.safetensors"
check "inspect --json of a safetensors file" json_ok \
  'j["format"] == "safetensors" and any(t["name"] == "a" for t in j["tensors"]) and "savepoint.values" in j["__metadata__"]'
run "$SP" inspect "$ST/m.safetensors"
check "inspect of a safetensors file prints its tensors" eval 'rc_is 0 && out_has "OFFSET" && out_has "__metadata__:"'
run "$SP" convert "$ST/m.safetensors" "$ST/back"
check "convert safetensors -> native exits 0" eval 'rc_is 0 && "$SP" verify "$ST/back" >/dev/null'
run "$SP" inspect --json "$ST/back"
check "the round trip keeps the step value" json_ok \
  'any(v["name"] == "step" and v["value"] == 7 for v in j["values"])'
run "$SP" convert "$CKPT" "$ST/m.safetensors"
check "convert onto an existing file fails without --overwrite" eval 'rc_is 1 && err_has "exists"'
run "$SP" convert --overwrite --to safetensors "$ST/back" "$ST/m.safetensors"
check "convert --overwrite --to safetensors replaces it" eval 'rc_is 0 && [[ $(ls -A "$ST" | wc -l) -eq 2 ]]'
printf '\x10\x00\x00\x00\x00\x00\x00\x00{"a": [1, 2]}  ' >"$ST/bad.safetensors"
run "$SP" convert "$ST/bad.safetensors" "$ST/out"
check "convert of a hostile safetensors file exits 2" eval 'rc_is 2 && err_has "savepoint: convert: corruption: " && [[ ! -e $ST/out ]]'
run "$SP" convert "$ST/missing.safetensors" "$ST/out"
check "convert of a missing source exits 3" rc_is 3
run "$SP" convert --to onnx "$CKPT" "$ST/out"
check "convert --to with an unknown format exits 64" rc_is 64
run "$SP" convert "$CKPT" "$ST/quiet.safetensors"
check "convert prints nothing on stderr when it is not a terminal (no progress)" eval 'rc_is 0 && [[ ! -s $ERR ]]'

# --- verify (safetensors) -----------------------------------------------------------------------
run "$SP" verify "$ST/m.safetensors"
check "verify of a safetensors file exits 0" eval 'rc_is 0 && [[ ! -s $ERR ]] && grep -Eq "^OK: $ST/m.safetensors: safetensors file, [0-9]+ tensors, [0-9]+ bytes read in [0-9.]+ s \([0-9.]+ GB/s\); header valid, every byte readable \(safetensors has no checksums\)$" "$OUT"'
run "$SP" inspect --json "$ST/m.safetensors"
ST_BYTES=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["totals"]["tensor_bytes"])' <"$OUT")
run "$SP" verify --json --threads 3 "$ST/m.safetensors"
check "verify --json of a safetensors file" eval 'rc_is 0 && [[ ! -s $ERR ]] && json_ok "j[\"ok\"] is True and j[\"format\"] == \"safetensors\" and j[\"checksums\"] is False and j[\"code\"] == \"ok\" and j[\"tensors\"] >= 2 and j[\"bytes\"] == $ST_BYTES and j[\"stored_bytes\"] == j[\"bytes\"] and j[\"chunks\"] == 0 and j[\"direct_io\"] is False and j[\"compression_ratio\"] == 1"'
check "verify --json of a safetensors file has the native keys" json_ok \
  '{"path","ok","error","code","tensors","bytes","chunks","seconds","stored_bytes","throughput_gbps","direct_io","compression_ratio"} <= set(j)'
cp "$ST/m.safetensors" "$ST/short.safetensors"
truncate -s -1 "$ST/short.safetensors"
run "$SP" verify "$ST/short.safetensors"
check "verify of a truncated safetensors file exits 2" eval 'rc_is 2 && err_has "savepoint: verify: corruption: " && [[ ! -s $OUT ]]'
run "$SP" verify --json "$ST/bad.safetensors"
check "verify --json of a hostile safetensors file reports corruption" eval 'rc_is 2 && json_ok "j[\"ok\"] is False and j[\"code\"] == \"corruption\" and j[\"format\"] == \"safetensors\" and j[\"tensors\"] == 0"'

# --- merge --------------------------------------------------------------------------------------
run "$SP" merge "$CKPT" "$TMP/merged"
check "merge of a single-rank checkpoint exits 0, nothing on stderr" eval 'rc_is 0 && [[ ! -s $ERR ]] && out_has "OK: merged "'
run "$SP" verify "$TMP/merged"
check "the merged checkpoint verifies" rc_is 0
run "$SP" merge --json --format safetensors "$CKPT" "$TMP/merged-st"
check "merge --json --format safetensors" eval 'rc_is 0 && [[ ! -s $ERR ]] && json_ok "j[\"ok\"] is True and j[\"format\"] == \"safetensors\"" && [[ -f $TMP/merged-st/model.safetensors ]]'
run "$SP" merge --max-file-bytes 10 "$CKPT" "$TMP/merged2"
check "merge --max-file-bytes without --format safetensors exits 64" rc_is 64

# --- internal metadata: the Python package's structure tree -------------------------------------
# A safetensors file as the Python package would write it (metadata "savepoint.python" holding the
# structure, a large "savepoint.manager"), converted to a native checkpoint.
PYST=$TMP/py.safetensors
python3 - "$PYST" <<'PYEOF'
import json, struct, sys
tree = {"version": 1, "root": {"dict": [
    ["model", {"odict": [["w", {"torch": "model.w", "param": True, "grad": True}]]}],
    ["step", {"value": "step"}],
    ["opt", {"dict": [["state", {"dict": [[{"int": 0}, {"dict": [
        ["exp_avg", {"numpy": "opt.state.0.exp_avg"}]]}]]}]]}],
    ["xs", {"list": [{"none": None}, {"value": "step"}]}]]}}
manager = {"objects": {"obj%d" % i: {"category": "model", "num_shards": 1} for i in range(20)}}
internal = {"savepoint.python": tree, "savepoint.manager": manager, "epoch": 3}
header = {"model.w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
          "opt.state.0.exp_avg": {"dtype": "F32", "shape": [3], "data_offsets": [16, 28]},
          "__metadata__": {"purpose": "tree test", "savepoint.metadata": json.dumps(internal),
                           "savepoint.values": json.dumps([{"name": "step", "kind": "int",
                                                            "value": 5}])}}
h = json.dumps(header).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h + bytes(28))
PYEOF
run "$SP" convert "$PYST" "$TMP/pyckpt"
check "convert of a file with a Python structure exits 0" rc_is 0
PY=$TMP/pyckpt
run "$SP" inspect "$PY"
check "inspect hides the Python structure from the metadata line" eval \
  'rc_is 0 && grep -qx "metadata: {\"epoch\":3,\"purpose\":\"tree test\"}" "$OUT" && ! out_has "\"dict\""'
check "inspect summarizes the Python structure" eval 'grep -qx "python structure: 5 leaves (--tree to show)" "$OUT"'
check "inspect names the large internal metadata instead of printing it" eval \
  'grep -Eq "^internal metadata: savepoint.manager \([0-9.]+ [KMG]?i?B, --json to show\)$" "$OUT" && ! out_has "num_shards"'
run "$SP" inspect --tree "$PY"
check "inspect --tree prints the structure indented" eval 'rc_is 0 && out_has "python structure: 5 leaves" &&
  grep -qx "      \"w\": torch model.w  F32 \[2, 2\] (param, requires_grad)" "$OUT" &&
  grep -qx "        0: dict" "$OUT" && grep -qx "      \[0\]: none" "$OUT" &&
  grep -qx "    \"step\": value step  int 5" "$OUT"'
run "$SP" inspect --json "$PY"
check "inspect --json keeps the internal metadata as stored" json_ok \
  'j["metadata"]["savepoint.python"]["version"] == 1 and len(j["metadata"]["savepoint.manager"]["objects"]) == 20 and j["metadata"]["epoch"] == 3'
run "$SP" inspect --json --tree "$PY"
check "inspect --json --tree is a usage error (64)" rc_is 64
run "$SP" inspect --tree "$CKPT"
check "inspect --tree without a Python structure says so" eval 'rc_is 0 && out_has "python structure: none"'
run "$SP" inspect "$PYST"
check "inspect of a safetensors file hides the Python structure too" eval \
  'rc_is 0 && out_has "python structure: 5 leaves (--tree to show)" && ! out_has "exp_avg\\\"" && out_has "not shown: [\"savepoint.manager\",\"savepoint.python\"]"'
run "$SP" inspect --tree "$PYST"
check "inspect --tree of a safetensors file" eval 'rc_is 0 && grep -q "\"exp_avg\": numpy opt.state.0.exp_avg  F32 \[3\]" "$OUT"'

# --- MindSpore .ckpt (against files MindSpore itself writes: tests/mindspore/) -------------------
MS=$TMP/model.ckpt
run "$SP" convert "$CKPT" "$MS" --crc
check "convert to .ckpt with --crc exits 0" eval 'rc_is 0 && out_has "(ckpt)"'
run "$SP" inspect "$MS"
check "inspect of a .ckpt lists its entries and its CRC" eval \
  'rc_is 0 && out_has "MindSpore checkpoint" && out_has "CRC-32 trailer" && out_has "PIECES"'
run "$SP" inspect --json "$MS"
check "inspect --json of a .ckpt" json_ok 'j["format"] == "ckpt" and j["crc"] is not None and len(j["entries"]) > 0'
run "$SP" verify --json "$MS"
check "verify of a .ckpt checks its CRC" json_ok 'j["ok"] and j["format"] == "ckpt" and j["checksums"] and j["chunks"] == 1'
flip_byte "$MS" 200
run "$SP" verify "$MS"
check "verify of a damaged .ckpt exits 2 naming both CRCs" eval 'rc_is 2 && err_has "CRC-32 mismatch: the trailer says"'
run "$SP" convert "$CKPT" "$TMP/x.safetensors" --crc
check "--crc with a safetensors target writes MindSpore's crc_num" eval 'rc_is 0'
run "$SP" inspect --json "$TMP/x.safetensors"
check "... in MindSpore's flavour" json_ok 'j["mindspore_format"] and j["crc_num"] is not None'
run "$SP" convert "$CKPT" "$TMP/x_native" --crc
check "--crc with a native target is refused" eval '! rc_is 0 && err_has "--crc applies to .ckpt and .safetensors"'
run "$SP" convert "$CKPT" "$TMP/y.ckpt" --mindspore
check "--mindspore with a .ckpt target is refused" eval '! rc_is 0 && err_has "--mindspore applies"'

echo "$PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
