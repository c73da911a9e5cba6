#!/usr/bin/env bash
# Soak test (by hand, not in CI): two kilnd sharing one redis-server, each in
# a network namespace of its own, under 32 clients of mixed Compile /
# Execute / PutBuffer / GetBuffer for a bounded time, while the script
#   - restarts Redis (its entries are gone: the servers rebuild and refill),
#   - cuts server a's link for a while and restores it,
#   - SIGKILLs server b and starts it again on the same cache directory,
#   - fills Redis to its maxmemory (noeviction: writes refused) and later
#     empties it.
# Checks: zero wrong results (every Execute returns the program's exact
# result, every download the bytes uploaded: no corrupt cache entry is
# served), every failure a gRPC status, and server a's RSS flat within 10%
# after warm-up (its peak over the rest of the run against its RSS when
# warm-up ended: 20% of the run, at least 60 s of a run of 180 s or more).
# Prints the figures for bench/RESULTS.md.
#
# Needs root (ip netns, veth), redis-server and redis-cli, a built kilnd and
# a Python with grpcio and grpcio-tools.
#
#   sudo scripts/soak.sh [SECONDS]        (default 300)
#   env: KILND (default build/server/kilnd), KILN_PYTHON (.venv/bin/python),
#        SOAK_CLIENTS (32), SOAK_KEEP=1 keeps the work directory
#
# Topology: namespaces kiln-soak-a and kiln-soak-b, each joined to the
# root namespace by a veth pair (10.231.1.0/24 and 10.231.2.0/24); Redis
# and the clients live in the root namespace; a server listens on .2 of its
# subnet and reaches Redis at .1.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DURATION=${1:-300}
KILND=${KILND:-$ROOT/build/server/kilnd}
PY=${KILN_PYTHON:-$ROOT/.venv/bin/python}
CLIENTS=${SOAK_CLIENTS:-32}
RPORT=6390
NS=(kiln-soak-a kiln-soak-b)
SECRET=kiln-soak-secret-0123456789abcdef

[ "$(id -u)" = 0 ] || { echo "soak: needs root (ip netns)"; exit 2; }
[ -x "$KILND" ] || { echo "soak: no kilnd at $KILND"; exit 2; }
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
  { echo "soak: needs redis-server and redis-cli"; exit 2; }

WORK=$(mktemp -d /tmp/kiln-soak.XXXXXX)
PIDS_KILND=("" "")
PID_REDIS=""
log() { echo "soak: [$(date +%T)] $*"; }

cleanup() {
  set +e
  [ -n "${PID_CLIENTS:-}" ] && kill "$PID_CLIENTS" 2>/dev/null
  for p in "${PIDS_KILND[@]}" "$PID_REDIS" "${PID_RSS:-}"; do
    [ -n "$p" ] && kill "$p" 2>/dev/null
  done
  for _ in $(seq 150); do # the servers drain (SIGTERM): give them 15 s
    busy=0
    for p in "${PIDS_KILND[@]}" "$PID_REDIS"; do [ -n "$p" ] && kill -0 "$p" 2>/dev/null && busy=1; done
    [ $busy = 0 ] && break
    sleep 0.1
  done
  for p in "${PIDS_KILND[@]}" "$PID_REDIS"; do [ -n "$p" ] && kill -9 "$p" 2>/dev/null; done
  for i in 0 1; do
    ip link del "ks-$i" 2>/dev/null
    ip netns del "${NS[$i]}" 2>/dev/null
  done
  [ "${SOAK_KEEP:-0}" = 1 ] && echo "soak: work directory kept: $WORK" || rm -rf "$WORK"
}
trap cleanup EXIT

# ---- network ----------------------------------------------------------------------
for i in 0 1; do
  n=$((i + 1))
  ip netns del "${NS[$i]}" 2>/dev/null || true
  ip link del "ks-$i" 2>/dev/null || true
  ip netns add "${NS[$i]}"
  ip link add "ks-$i" type veth peer name "ks-$i-ns"
  ip link set "ks-$i-ns" netns "${NS[$i]}"
  ip addr add "10.231.$n.1/24" dev "ks-$i"
  ip link set "ks-$i" up
  ip netns exec "${NS[$i]}" ip addr add "10.231.$n.2/24" dev "ks-$i-ns"
  ip netns exec "${NS[$i]}" ip link set "ks-$i-ns" up
  ip netns exec "${NS[$i]}" ip link set lo up
done

# ---- processes --------------------------------------------------------------------
start_redis() {
  redis-server --port $RPORT --bind "127.0.0.1 10.231.1.1 10.231.2.1" --protected-mode no \
    --save "" --appendonly no --maxmemory 96mb --maxmemory-policy noeviction \
    >>"$WORK/redis.log" 2>&1 &
  PID_REDIS=$!
  for _ in $(seq 100); do redis-cli -p $RPORT ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  log "redis did not start"; return 1
}

start_kilnd() { # index
  local i=$1 n=$(($1 + 1))
  mkdir -p "$WORK/cache-$i"
  KILN_CACHE_SECRET=$SECRET ip netns exec "${NS[$i]}" "$KILND" \
    --listen "10.231.$n.2:50051" --metrics-listen "10.231.$n.2:9464" \
    --redis-url "10.231.$n.1:$RPORT" --redis-timeout-ms 200 \
    --cache-dir "$WORK/cache-$i" --cache-memory-bytes 32Mi --cache-disk-bytes 256Mi \
    --cpu-devices 2 --interp-devices 2 --compile-threads 2 \
    >>"$WORK/kilnd-$i.out" 2>>"$WORK/kilnd-$i.err" &
  PIDS_KILND[$i]=$!
  for _ in $(seq 200); do
    grep -q "metrics listening" "$WORK/kilnd-$i.out" 2>/dev/null && return 0
    sleep 0.1
  done
  log "kilnd $i did not start"; tail "$WORK/kilnd-$i.err"; return 1
}

rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }

start_redis
start_kilnd 0
start_kilnd 1
log "servers up: 10.231.1.2:50051 (a), 10.231.2.2:50051 (b); redis 127.0.0.1:$RPORT"

# RSS of both servers every 2 s: seconds since start, a's RSS, b's RSS (KiB).
T0=$(date +%s)
( while sleep 2; do
    echo "$(($(date +%s) - T0)) $(rss_kb "${PIDS_KILND[0]}") $(rss_kb "$(pgrep -n -f "kilnd --listen 10.231.2.2" || echo 0)")"
  done ) >"$WORK/rss.txt" &
PID_RSS=$!

"$PY" "$ROOT/scripts/soak_clients.py" --servers 10.231.1.2:50051,10.231.2.2:50051 \
  --clients "$CLIENTS" --duration "$DURATION" --proto-dir "$ROOT/proto" \
  --out "$WORK/clients.json" >"$WORK/clients.log" 2>&1 &
PID_CLIENTS=$!

at() { # seconds since T0 to wait for
  local t=$1 now
  now=$(($(date +%s) - T0))
  [ "$t" -gt "$now" ] && sleep $((t - now))
  return 0
}

# ---- the faults -------------------------------------------------------------------
D=$DURATION
at $((D * 20 / 100))
log "restarting Redis"
kill "$PID_REDIS"; wait "$PID_REDIS" 2>/dev/null || true
sleep 2
start_redis

at $((D * 35 / 100))
log "cutting server a's link for 10 s"
ip link set ks-0 down
sleep 10
ip link set ks-0 up
log "link restored"

at $((D * 50 / 100))
log "SIGKILL server b, then starting it again"
kill -9 "${PIDS_KILND[1]}"; wait "${PIDS_KILND[1]}" 2>/dev/null || true
sleep 1
start_kilnd 1

at $((D * 65 / 100))
log "filling Redis to its maxmemory"
fill=0
while :; do
  out=$(redis-cli -p $RPORT EVAL "for i=1,256 do redis.call('SET', 'soakfill:'..ARGV[1]..':'..i, string.rep('x', 65536)) end return 1" 0 "$fill" 2>&1 || true)
  fill=$((fill + 1))
  case "$out" in *OOM*) break ;; esac
  [ $fill -gt 4096 ] && break
done
log "Redis full: $(redis-cli -p $RPORT INFO memory | grep -E '^used_memory_human' | tr -d '\r')"

at $((D * 85 / 100))
log "emptying Redis"
redis-cli -p $RPORT FLUSHALL >/dev/null

wait "$PID_CLIENTS" && crc=0 || crc=$?
PID_CLIENTS=""
kill "$PID_RSS" 2>/dev/null || true
PID_RSS=""

# ---- verdict ----------------------------------------------------------------------
alive=yes
for i in 0 1; do kill -0 "${PIDS_KILND[$i]}" 2>/dev/null || alive="no (server $i)"; done
WARM=$((D * 20 / 100)) # at least a minute when the run allows it
[ $WARM -lt 60 ] && [ "$D" -ge 180 ] && WARM=60
read -r base peak <<<"$(awk -v w="$WARM" '$1 >= w && $2 > 0 { if (!b) b = $2; if ($2 > p) p = $2 } END { print b + 0, p + 0 }' "$WORK/rss.txt")"
growth=$(awk -v b="$base" -v p="$peak" 'BEGIN { if (b > 0) printf "%.1f", 100 * (p - b) / b; else print "nan" }')
"$PY" - "$WORK/clients.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
for op, o in sorted(s.items()):
    st = ", ".join(f"{k} {v}" for k, v in sorted(o["status"].items())) or "none"
    print(f"soak: {op}: {o['ok']} ok, failures by status: {st}; wrong {o['wrong']}; "
          f"not a status {o['not_status']}; p50 {o['p50_ms']:.1f} ms, p99 {o['p99_ms']:.1f} ms")
EOF
log "server a RSS: $((base / 1024)) MiB after warm-up (${WARM} s), peak $((peak / 1024)) MiB after: +${growth}%"
log "servers alive at the end: $alive; clients exit $crc"
for i in 0 1; do
  log "server $i log: $(grep -c . "$WORK/kilnd-$i.err" || true) lines; last: $(tail -1 "$WORK/kilnd-$i.err")"
done
ok=1
[ "$crc" = 0 ] || { log "FAIL: wrong results or failures that were not a status"; ok=0; }
[ "$alive" = yes ] || { log "FAIL: a server died"; ok=0; }
awk -v g="$growth" 'BEGIN { exit !(g != "nan" && g + 0 <= 10) }' || { log "FAIL: RSS grew ${growth}% after warm-up"; ok=0; }
[ $ok = 1 ] && log "PASS" || exit 1
