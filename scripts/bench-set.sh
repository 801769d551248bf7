# The benchmark set of issue 3 (sourced by scripts/bench --set; not run on its own).
#
# Every round (R of them, interleaved like the default mode) runs on the same byte count, back to
# back: dd write (O_DIRECT + fsync), dd read (O_DIRECT), raw_io_bench with pwrite and with io_uring
# (the disk's ceiling for savepoint's chunk pattern), then save_load_bench with the phases
#   save      sync Save until durable                       vs dd write   goal >= 0.95x
#   load      cold Load (O_DIRECT, caches dropped)          vs dd read    goal >= 0.95x
#   loadinto  cold LoadInto existing buffers                (shown, no goal)
#   memcpy    one-thread memcpy of the state into touched memory
#   async     SaveAsync: time the caller is blocked (2nd save, warm staging pool)
#                                                           vs memcpy     goal <= 1.2x
#   mmap-one  cold Open + MapTensor + read one byte per page of the largest tensor
#                                                                         goal < 50 ms
# then compress_bench once (ratio and single-thread speed, f32 / bf16 / sparse, with and without
# byte shuffle). The table shows medians over the rounds, the ratio to the same-run reference and
# whether each goal is met.
#
# Uses from scripts/bench: bench, raw, compress, work, bytes, repeats, bench_args, raw_args,
# settle, dd_write, dd_read, dd_file, check.

set_results=$(mktemp)
trap 'cleanup; rm -f "$results" "$sweep_results" "$set_results"' EXIT

# "name key value" triples (seconds, gbps and the mmap-one breakdown) from save_load_bench lines.
set_fields() {
  awk '$1 !~ /^#/ { for (i = 2; i <= NF; i++) {
         split($i, kv, "=");
         if (kv[1] ~ /^(seconds|gbps|open_ms|map_ms|touch_ms)$/) print $1, kv[1], kv[2] } }'
}
# Median of the values recorded for (name, key).
set_median() {
  awk -v n="$1" -v k="$2" '$1 == n && $2 == k { print $3 }' "$set_results" | sort -g |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                              else printf "%.4f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# The values of every round for (name, key), times $3 (default 1).
set_runs() {
  awk -v n="$1" -v k="$2" -v f="${3:-1}" '$1 == n && $2 == k {
        if (f == 1) printf "%s%s", sep, $3; else printf "%s%.1f", sep, $3 * f; sep = " " }
      END { print "" }' "$set_results"
}

set_busy=""
for r in $(seq 1 "$repeats"); do
  busy=$(settle)
  set_busy="$set_busy $busy%"
  w=$(dd_write)
  rd=$(dd_read)
  rm -f "$dd_file"
  echo "round $r (CPUs ${busy}% busy before): dd write $w GB/s, dd read $rd GB/s"
  { echo "dd-write gbps $w"; echo "dd-read gbps $rd"; } >>"$set_results"
  out=$("$raw" "${raw_args[@]}" --fallocate; "$raw" "${raw_args[@]}" --fallocate --uring
        "$bench" "${bench_args[@]}" --phases save,load,loadinto,memcpy,async,mmap-one)
  echo "$out" | sed 's/^/  /'
  echo "$out" | set_fields >>"$set_results"
done

echo
echo "== benchmark set: $bytes bytes, medians of $repeats (CPUs busy before rounds:$set_busy) =="
for b in $set_busy; do
  if [ "${b%\%}" -ge 20 ]; then
    echo "warning: other processes were using the CPUs; the numbers are skewed (see --wait-idle)"
    break
  fi
done
set_missed=0
# One table row: label, value, unit, reference value, reference label, ratio op ("/" = value/ref),
# goal comparison ("ge X", "le X", "lt X" on the ratio, or "" for none), runs.
set_row() {
  local label=$1 value=$2 unit=$3 ref=$4 ref_label=$5 goal=$6 runs=$7 ratio verdict=""
  ratio=$(awk -v v="$value" -v r="$ref" 'BEGIN { if (r == "" || r + 0 == 0) print "-";
                                                 else printf "%.2fx", v / r }')
  if [ -n "$goal" ]; then
    local x=$value
    if [ "$ratio" != "-" ]; then x=${ratio%x}; fi
    if awk -v x="$x" -v op="${goal% *}" -v g="${goal#* }" 'BEGIN {
         ok = (op == "ge" && x >= g) || (op == "le" && x <= g) || (op == "lt" && x < g);
         exit !ok }'; then
      verdict=met
    else
      verdict=MISSED
      set_missed=1
    fi
    goal=$(echo "$goal" | sed 's/^ge />= /; s/^le /<= /; s/^lt /< /')
  fi
  printf "%-26s %10s %-5s %-20s %7s  %-9s %-6s  %s\n" "$label" "$value" "$unit" "$ref_label" \
    "$ratio" "$goal" "$verdict" "$runs"
}
g() { set_median "$1" gbps; }
ms() { awk -v s="$(set_median "$1" seconds)" 'BEGIN { printf "%.1f", s * 1000 }'; }
printf "%-26s %10s %-5s %-20s %7s  %-9s %-6s  %s\n" measurement value unit "vs" ratio goal result runs
set_row "dd write (8M, direct)" "$(g dd-write)" GB/s "" "(reference)" "" "$(set_runs dd-write gbps)"
set_row "dd read (8M, direct)" "$(g dd-read)" GB/s "" "(reference)" "" "$(set_runs dd-read gbps)"
set_row "raw write, pwrite" "$(g raw-write-falloc)" GB/s "$(g dd-write)" "dd write" "" \
  "$(set_runs raw-write-falloc gbps)"
set_row "raw write, io_uring" "$(g raw-write-falloc-uring)" GB/s "$(g raw-write-falloc)" \
  "raw write, pwrite" "" "$(set_runs raw-write-falloc-uring gbps)"
set_row "raw read, pwrite" "$(g raw-read)" GB/s "$(g dd-read)" "dd read" "" \
  "$(set_runs raw-read gbps)"
set_row "raw read, io_uring" "$(g raw-read-uring)" GB/s "$(g raw-read)" "raw read, pwrite" "" \
  "$(set_runs raw-read-uring gbps)"
set_row "sync save" "$(g save)" GB/s "$(g dd-write)" "dd write" "ge 0.95" "$(set_runs save gbps)"
set_row "cold load (O_DIRECT)" "$(g load)" GB/s "$(g dd-read)" "dd read" "ge 0.95" \
  "$(set_runs load gbps)"
set_row "cold loadinto" "$(g loadinto)" GB/s "$(g dd-read)" "dd read" "" \
  "$(set_runs loadinto gbps)"
set_row "memcpy, 1 thread" "$(ms memcpy)" ms "" "(reference)" "" "$(set_runs memcpy seconds 1000)"
set_row "async stall (2nd save)" "$(ms async-stall)" ms "$(ms memcpy)" "memcpy" "le 1.2" \
  "$(set_runs async-stall seconds 1000)"
set_row "async stall (1st save)" "$(ms async-first-stall)" ms "$(ms memcpy)" "memcpy" "" \
  "$(set_runs async-first-stall seconds 1000)"
set_row "async persist" "$(g async-persist)" GB/s "$(g dd-write)" "dd write" "" \
  "$(set_runs async-persist gbps)"
set_row "mmap open+access 1 tensor" "$(ms mmap-one)" ms "" "" "lt 50" \
  "$(set_runs mmap-one seconds 1000)"
echo "  mmap-one breakdown (medians): open $(set_median mmap-one open_ms) ms," \
  "map $(set_median mmap-one map_ms) ms, touch $(set_median mmap-one touch_ms) ms"

echo
echo "== compression (compress_bench, 1 thread) =="
"$compress" --mib "$(awk -v b="$bytes" 'BEGIN { m = int(b / 16 / 1048576);
                                                      print (m < 16 ? 16 : (m > 256 ? 256 : m)) }')"

if [ "$check" = 1 ] && [ "$set_missed" = 1 ]; then exit 1; fi
exit 0
