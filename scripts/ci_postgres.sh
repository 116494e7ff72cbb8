#!/usr/bin/env bash
# Start a throwaway PostgreSQL server on loopback for the fleet tests; prints the URL to export.
# Usage: eval "$(scripts/ci_postgres.sh start)"; ...; scripts/ci_postgres.sh stop
# Installs Debian's postgresql when missing (CI machines start without it). Data lives in a temp dir
# owned by the postgres user, because the server refuses to run as root.
set -euo pipefail
PGDIR=${CGTUNE_PGDIR:-/tmp/cgtune-pg}
PORT=${CGTUNE_PGPORT:-55432}

bin_dir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  [ -n "$d" ] && echo "$d"
}

case "${1:-start}" in
  start)
    if [ -z "$(bin_dir)" ]; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) >&2
    fi
    BIN=$(bin_dir)
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    rm -rf "$PGDIR" && mkdir -p "$PGDIR" && chown postgres "$PGDIR"
    runuser -u postgres -- "$BIN/initdb" -D "$PGDIR/data" -A trust -U cgtune >/dev/null
    runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDIR/data" -l "$PGDIR/log" -w \
      -o "-c listen_addresses=127.0.0.1 -p $PORT -k $PGDIR -c max_connections=200" start >/dev/null
    runuser -u postgres -- "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U cgtune cgtune_test
    echo "export CGTUNE_TEST_POSTGRES_URL=postgresql+psycopg2://cgtune:cgtune-test@127.0.0.1:$PORT/cgtune_test"
    ;;
  stop)
    BIN=$(bin_dir) || exit 0
    [ -d "$PGDIR/data" ] && runuser -u postgres -- "$BIN/pg_ctl" -D "$PGDIR/data" -m fast -w stop >/dev/null || true
    rm -rf "$PGDIR"
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
