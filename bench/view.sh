#!/usr/bin/env bash
# The browser view's benchmark (issue 16): API latency on a round log of
# ROUNDS x CLIENTS (fedmoe-viewlog writes it through the store), median and p99
# over 1,000 requests of each endpoint, one at a time (wrk, stopped after 1,000
# answers), and the page's load time in headless Chromium (bench/view_page_load.py).
#   bench/view.sh [ROUNDS=1000] [CLIENTS=1000] [OUT=bench-view]
# Environment: BUILD (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-1000} clients=${2:-1000} out=${3:-bench-view}
build=${BUILD:-build}
mkdir -p "$out"
bench/machine.sh > "$out/machine.txt"
db="$out/view-${rounds}x${clients}.db"
if [[ ! -f $db ]]; then
  start=$(date +%s.%N)
  "$build/bench/fedmoe-viewlog" "$db" "$rounds" "$clients"
  echo "log of $rounds rounds x $clients clients written in $(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s: $(du -m "$db" | cut -f1) MB" >&2
fi
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$build/server/fedmoe-history" --db "$db" serve --listen "127.0.0.1:$port" 2>/dev/null &
srv=$!
trap 'kill $srv 2>/dev/null' EXIT
for _ in $(seq 50); do curl -s -o /dev/null "http://127.0.0.1:$port/api/runs" && break; sleep 0.1; done
cat > "$out/stop.lua" <<'LUA'
local n = 0
response = function(status, headers, body)
  n = n + 1
  if status ~= 200 then print("status " .. status) end
  if n >= 1000 then wrk.thread:stop() end
end
LUA
half=$((rounds / 2))
{
  printf "%-58s %8s %10s %10s %10s\n" endpoint bytes requests "median ms" "p99 ms"
  for path in "/api/runs" "/api/runs/run-viewlog" "/api/runs/run-viewlog/rounds" \
              "/api/runs/run-viewlog/rounds?since=$((rounds - 1))" \
              "/api/runs/run-viewlog/rounds/$half/clients" \
              "/api/runs/run-viewlog/rounds/$half/clients?sort=test_accuracy&order=desc" \
              "/api/runs/run-viewlog/clients/client-00007" "/" "/app.js"; do
    bytes=$(curl -s "http://127.0.0.1:$port$path" | wc -c)
    # (wrk runs for its whole duration even after the script stops it at 1,000
    # answers: a one-second probe sizes the duration to about 1.5x what they need)
    rate=$(wrk -t1 -c1 -d1s "http://127.0.0.1:$port$path" | awk '/Requests\/sec/ { print $2 }')
    secs=$(awk -v r="$rate" 'BEGIN { d = int(1500 / (r > 0 ? r : 1)) + 2; print (d > 600 ? 600 : d) }')
    wrk -t1 -c1 -d"${secs}s" --latency -s "$out/stop.lua" "http://127.0.0.1:$port$path" > "$out/wrk.txt"
    awk -v p="$path" -v b="$bytes" '
      function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
      $1 == "50%" { med = ms($2) } $1 == "99%" { p99 = ms($2) } / requests in / { n = $1 }
      END { printf "%-58s %8d %10d %10.3f %10.3f\n", p, b, n, med, p99 }' "$out/wrk.txt"
  done
} | tee "$out/latency.txt"
python3 bench/view_page_load.py "http://127.0.0.1:$port/#/run/run-viewlog" | tee "$out/page.txt"
