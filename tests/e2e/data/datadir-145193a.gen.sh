# Writes the data directory in datadir-145193a.tar.gz with the code of commit 145193a (before the
# architecture move): run from a checkout of that commit, then tar -czf ... -C data .
set -e
D=${1:-./compat-data}
.venv/bin/dmq serve --data-dir $D --http-addr 127.0.0.1:18480 --raft-addr 127.0.0.1:19490 > serve.log 2>&1 &
PID=$!
for i in $(seq 1 100); do curl -sf 127.0.0.1:18480/v1/cluster >/dev/null && break; sleep 0.2; done
H=127.0.0.1:18480
for i in $(seq 1 50); do C=$(curl -s -o /dev/null -w "%{http_code}" -X POST $H/v1/topics -H "Content-Type: application/json" -d "{\"name\": \"orders\", \"partitions\": 3}"); [ "$C" = 201 ] && break; sleep 0.2; done; echo created $C
curl -s -X POST $H/v1/topics -H 'Content-Type: application/json' -d '{"name": "profiles", "partitions": 1, "config": {"cleanup_policy": "compact"}}'; echo
for i in $(seq 0 9); do :;
curl -s -X POST $H/v1/topics/orders/records -H 'Content-Type: application/json' -d "{\"records\": [{\"key\": \"k$i\", \"value\": \"v$i\", \"timestamp\": 170000000000$i, \"headers\": {\"h\": \"x$i\"}}]}"; echo
done
curl -s -X POST $H/v1/topics/profiles/records -H 'Content-Type: application/json' -d '{"records": [{"key": "a", "value": "1", "timestamp": 1700000000000}, {"key": "a", "value": "2", "timestamp": 1700000000001}]}'; echo
P=$(curl -s -X POST $H/v1/producers -H 'Content-Type: application/json' -d '{}'); echo $P
M=$(curl -s -X POST $H/v1/groups/workers/members -H 'Content-Type: application/json' -d '{"topics": ["orders"]}'); echo $M
MID=$(echo $M | python3 -c 'import json,sys; print(json.load(sys.stdin)["member_id"])')
GEN=$(echo $M | python3 -c 'import json,sys; print(json.load(sys.stdin)["generation"])')
curl -s -X POST $H/v1/groups/workers/offsets -H 'Content-Type: application/json' -d "{\"member_id\": \"$MID\", \"generation\": $GEN, \"offsets\": [{\"topic\": \"orders\", \"partition\": 0, \"offset\": 2}]}"; echo
curl -s -X DELETE $H/v1/groups/workers/members/$MID; echo
curl -s $H/v1/groups/workers/offsets; echo
kill -TERM $PID; wait $PID || true
