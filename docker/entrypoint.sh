#!/bin/sh
# The image's entrypoint (docker/README.md has the whole story).
#   fedmoe-entrypoint keys          make the run's keys once, into the key volumes
#   fedmoe-entrypoint coordinator   fedmoe-server with the stack's keys, database and settings
#   fedmoe-entrypoint client        fedmoe-client with an id of its own and its key
#   fedmoe-entrypoint view          fedmoe-history serve: the round log in a browser, on
#                                   port 8080 of the container, answering only with the token
#   fedmoe-entrypoint token         print the view's token
#   fedmoe-entrypoint health        exit 0 while the container's program is alive
#   fedmoe-entrypoint PROGRAM ...   any program, e.g. fedmoe-server --help
# Settings (environment):
#   FEDMOE_CLIENTS       client slots: keys made, partitions, clients a round needs (default 4)
#   FEDMOE_ROUNDS        rounds of the run (default 10)
#   FEDMOE_STRATEGY      local, fedavg, comigs, pfedmoap or full (default: the program's)
#   FEDMOE_MIN_CLIENTS   clients a round needs (default FEDMOE_CLIENTS)
#   FEDMOE_SERVER_ARGS   more fedmoe-server flags, e.g. "--seed 7 --aggregate median"
#   FEDMOE_CLIENT_ARGS   more fedmoe-client flags
#   FEDMOE_CONFIG        an INI file of fedmoe-server options in the container (default
#                        /etc/fedmoe/fedmoe-server.conf, where compose mounts it; used when
#                        not empty); the settings above and FEDMOE_SERVER_ARGS win
#   FEDMOE_COORDINATOR   host:port a client connects to (default coordinator:5555)
#   FEDMOE_CLIENT_ID     a client's id; default: from FEDMOE_CLIENT_SLOT (a swarm task's
#                        slot, 1..N: c000..) or JOB_COMPLETION_INDEX (a Kubernetes
#                        Indexed Job's, 0..N-1: c000..), else a free slot c000..
#                        claimed in /slots (kept by the container across restarts)
# Keys: in the volumes /keys/coordinator and /keys/clients (made by `keys`), or
# read-only secrets mounted at /secrets/coordinator (coordinator.key and the
# clients' .pub files) and /secrets/clients (the client's cNNN.key and
# coordinator.pub), copied to private files (mode 0600) at start. The view's
# token: /keys/view/token (made by `keys` when /keys/view is mounted) or the
# secret /secrets/view/token.
set -eu
KEYS_C=/keys/coordinator
KEYS_K=/keys/clients
KEYS_V=/keys/view
DB=/data/fedmoe.db  # the coordinator's round log, on the data volume
if [ -d /secrets/coordinator ] || [ -d /secrets/clients ] || [ -d /secrets/view ]; then
  # secrets are mounted readable by a group; the programs want key files only
  # their owner reads: private copies
  private=${HOME:-/var/lib/fedmoe}/keys
  umask 077
  mkdir -p "$private/coordinator/clients" "$private/clients" "$private/view"
  if [ -d /secrets/coordinator ]; then
    for f in /secrets/coordinator/*; do
      case "$f" in
        */coordinator.key|*/coordinator.pub) cp "$f" "$private/coordinator/" ;;
        *.pub) cp "$f" "$private/coordinator/clients/" ;;
      esac
    done
    KEYS_C=$private/coordinator
  fi
  if [ -d /secrets/clients ]; then
    cp /secrets/clients/* "$private/clients/"
    KEYS_K=$private/clients
  fi
  if [ -f /secrets/view/token ]; then
    cp /secrets/view/token "$private/view/token"
    KEYS_V=$private/view
  fi
  umask 022
fi
clients=${FEDMOE_CLIENTS:-4}

die() { echo "fedmoe-entrypoint: $*" >&2; exit 2; }

case "$clients" in ''|*[!0-9]*) die "FEDMOE_CLIENTS must be a number, not '$clients'" ;; esac

# The coordinator's pair and one pair per client slot, made once; the
# coordinator's allow-list gets the clients' public keys and the clients the
# coordinator's. Nothing secret is in the image: keys live in the volumes.
make_keys() {
  [ -w "$KEYS_C" ] && [ -w "$KEYS_K" ] || die "mount the key volumes writable at $KEYS_C and $KEYS_K"
  mkdir -p "$KEYS_C/clients"
  # the clients' pairs and the allow-list first, the coordinator's pair last: a
  # coordinator started beside this step (a swarm starts them together) waits
  # for its key, and then reads a complete allow-list
  made=0 i=0
  while [ "$i" -lt "$clients" ]; do
    id=$(printf 'c%03d' "$i")
    if [ ! -f "$KEYS_K/$id.key" ]; then
      fedmoe-keygen --out "$KEYS_K" "$id" >/dev/null
      made=$((made + 1))
    fi
    cp "$KEYS_K/$id.pub" "$KEYS_C/clients/$id.pub"
    i=$((i + 1))
  done
  if [ ! -f "$KEYS_C/coordinator.key" ]; then
    tmp=$(mktemp -d "$KEYS_C/.new.XXXXXX")
    fedmoe-keygen --out "$tmp" coordinator >/dev/null
    mv "$tmp/coordinator.pub" "$KEYS_C/coordinator.pub"
    mv "$tmp/coordinator.key" "$KEYS_C/coordinator.key"  # (whole: a rename)
    rmdir "$tmp"
  fi
  cp "$KEYS_C/coordinator.pub" "$KEYS_K/coordinator.pub"
  # the view's token (48 hex digits), where its volume is mounted
  view=""
  if [ -d "$KEYS_V" ] && [ -w "$KEYS_V" ]; then
    if [ ! -f "$KEYS_V/token" ]; then
      (umask 077 && od -An -N24 -tx1 /dev/urandom | tr -d ' \n' > "$KEYS_V/.token.new" &&
        echo >> "$KEYS_V/.token.new" && mv "$KEYS_V/.token.new" "$KEYS_V/token")
    fi
    view=" and the view's token"
  fi
  echo "fedmoe-entrypoint: keys ready: coordinator and $clients clients ($made new)$view"
}

run_coordinator() {
  [ -f "$KEYS_C/coordinator.key" ] || die "no coordinator key in $KEYS_C (run the keys service first)"
  set -- --bind "tcp://*:5555" --db "$DB" --key "$KEYS_C/coordinator.key" --allow "$KEYS_C/clients" \
         --partitions "$clients" --min-clients "${FEDMOE_MIN_CLIENTS:-$clients}" --rounds "${FEDMOE_ROUNDS:-10}" "$@"
  [ -n "${FEDMOE_STRATEGY:-}" ] && set -- "$@" --strategy "$FEDMOE_STRATEGY"
  config=${FEDMOE_CONFIG:-/etc/fedmoe/fedmoe-server.conf}
  if [ -n "${FEDMOE_CONFIG:-}" ] && [ ! -r "$config" ]; then die "FEDMOE_CONFIG: no readable file $config in the container"; fi
  if [ -s "$config" ]; then set -- --config "$config" "$@"; fi
  # shellcheck disable=SC2086 # FEDMOE_SERVER_ARGS is a list of flags
  exec fedmoe-server "$@" ${FEDMOE_SERVER_ARGS:-}
}

view_token() {
  [ -f "$KEYS_V/token" ] || die "no view token in $KEYS_V (run the keys service with the view-token volume, or mount the secret /secrets/view/token)"
  echo "$KEYS_V/token"
}

# The view of the coordinator's database (on the data volume, read-only): it
# waits for the coordinator to make the database, then serves on port 8080 of
# the container, every address (published by the stack), with the token.
run_view() {
  token=$(view_token)
  if [ ! -f "$DB" ]; then
    echo "fedmoe-entrypoint: view: waiting for the coordinator's database $DB"
    while [ ! -f "$DB" ]; do sleep 1; done
  fi
  exec fedmoe-history --db "$DB" serve --listen 0.0.0.0:8080 --token-file "$token" "$@"
}

# This container's client id: FEDMOE_CLIENT_ID, or the slot it claimed before
# (a restart keeps it), or the first free one (mkdir is atomic).
client_id() {
  if [ -n "${FEDMOE_CLIENT_ID:-}" ]; then echo "$FEDMOE_CLIENT_ID"; return; fi
  case "${FEDMOE_CLIENT_SLOT:-}" in
    ''|*[!0-9]*) ;;  # (compose passes the swarm template through unexpanded)
    *) [ "$FEDMOE_CLIENT_SLOT" -ge 1 ] && { printf 'c%03d\n' $((FEDMOE_CLIENT_SLOT - 1)); return; } ;;
  esac
  case "${JOB_COMPLETION_INDEX:-}" in
    ''|*[!0-9]*) ;;
    *) printf 'c%03d\n' "$JOB_COMPLETION_INDEX"; return ;;
  esac
  me=$(hostname)
  for f in /slots/c*.owner; do
    [ -f "$f" ] && [ "$(cat "$f")" = "$me" ] && { basename "$f" .owner; return; }
  done
  i=0
  while [ "$i" -lt "$clients" ]; do
    id=$(printf 'c%03d' "$i")
    if mkdir "/slots/$id" 2>/dev/null; then
      echo "$me" > "/slots/$id.owner"
      echo "$id"
      return
    fi
    i=$((i + 1))
  done
  die "no free client slot: FEDMOE_CLIENTS=$clients slots are all taken (more replicas than FEDMOE_CLIENTS?)"
}

run_client() {
  id=$(client_id)
  [ -f "$KEYS_K/$id.key" ] || die "no key for client $id in $KEYS_K (FEDMOE_CLIENTS=$clients; run the keys service)"
  mkdir -p /var/lib/fedmoe/state
  set -- --connect "tcp://${FEDMOE_COORDINATOR:-coordinator:5555}" --id "$id" --key "$KEYS_K/$id.key" \
         --server-key "$KEYS_K/coordinator.pub" --state-dir /var/lib/fedmoe/state "$@"
  # shellcheck disable=SC2086
  exec fedmoe-client "$@" ${FEDMOE_CLIENT_ARGS:-}
}

# Alive while a fedmoe program runs in the container (and, for the
# coordinator, port 5555 is listening: 15B3 in /proc/net/tcp*; for the view,
# port 8080: 1F90).
listening() { grep -q ":$1 [0-9A-F:]* 0A " /proc/net/tcp /proc/net/tcp6 2>/dev/null; }  # (hex port)
health() {
  for c in /proc/[0-9]*/comm; do
    case "$(cat "$c" 2>/dev/null)" in
      fedmoe-server) listening 15B3 && exit 0; exit 1 ;;
      fedmoe-client) exit 0 ;;
      fedmoe-history) listening 1F90 && exit 0; exit 1 ;;
    esac
  done
  exit 1
}

case "${1:-}" in
  keys) make_keys ;;
  coordinator) shift; run_coordinator "$@" ;;
  client) shift; run_client "$@" ;;
  view) shift; run_view "$@" ;;
  token) cat "$(view_token)" ;;
  health) health ;;
  "") exec fedmoe-server --help ;;
  *) exec "$@" ;;
esac
