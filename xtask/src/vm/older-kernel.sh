#!/bin/bash
# The older-kernel tier: the lab and the real agent inside the VM's Debian 6.1 kernel (no tcx:
# clsact attach; no IP_LOCAL_SOURCE: the health-check drop is NOT_SPECIFIED at the route-input
# site). Each failure must be confirmed with this kernel's reason, each healthy twin must stay
# silent, and nothing may stay attached. Run by `cargo xtask test` through `cargo xtask vm-test`.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${CLB_VM_RESULTS:-$(mktemp -d)}
probe=target/debug/probe
xtask=target/debug/xtask
echo "older-kernel: kernel $(uname -r)"
trap '$xtask lab down >/dev/null 2>&1 || true' EXIT
$xtask lab up
ip netns exec clb-node $probe agent --nic eth0 --socket /tmp/clb-vm.sock \
    --record "$out/events.jsonl" --events "$out/confirmed.jsonl" 2>"$out/agent.log" &
agent=$!
for _ in $(seq 1 90); do
    grep -q "attached and address sets loaded" "$out/agent.log" && break
    kill -0 $agent 2>/dev/null || { cat "$out/agent.log"; exit 1; }
    sleep 1
done
grep "programs loaded" "$out/agent.log" | sed 's/^.*features=/older-kernel: /'
for s in healthcheck-blackhole healthcheck-ok vip-port-unserved vip-port-served \
         hairpin-rpfilter hairpin-snat outside-client pod-to-pod; do
    $xtask lab traffic "$s"
done
sleep 5
kill -TERM $agent
wait $agent
if ip netns exec clb-node tc filter show dev eth0 ingress | grep -q clb_ \
   || ip netns exec clb-node tc qdisc show dev eth0 | grep -q clsact; then
    echo "older-kernel: FAIL: filters or the clsact qdisc left after exit"; exit 1
fi
# Aggregates, not lines: an aggregate is written again (count raised) when its repeats span
# more than 10 s, which SYN retransmits on a loaded machine do. So: exactly one aggregate key per
# expected kind and none of any other kind; every line of a key agrees on what it says, and its
# count never goes down.
python3 - "$out/confirmed.jsonl" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
want = {
    "healthcheck_blackhole": {"drop_reason": "NOT_SPECIFIED", "dst_port": 30080, "outcome": "dropped"},
    "vip_port_unserved": {"drop_reason": "NO_SOCKET", "vip_port": 443, "outcome": "refused"},
    "hairpin": {"drop_reason": "IP_RPFILTER", "vip_port": 80, "outcome": "dropped"},
}
keys = {}
for e in events:
    keys.setdefault(e["kind"], {}).setdefault(e["key"], []).append(e)
ok = sorted(keys) == sorted(want)
if not ok:
    print(f"older-kernel: FAIL: confirmed kinds {sorted(keys)}, expected {sorted(want)} "
          "(the healthy twins must add none)")
for kind, by_key in sorted(keys.items()):
    exp = want.get(kind, {})
    if len(by_key) != 1:
        ok = False
        print(f"older-kernel: FAIL: {kind}: {len(by_key)} aggregates {sorted(by_key)}, expected one")
    for key, lines in by_key.items():
        counts = [e.get("count", 0) for e in lines]
        good = all(all(e.get(k) == v for k, v in exp.items()) and e.get("vip") == "203.0.113.10"
                   for e in lines) and counts[0] >= 1 and counts == sorted(counts)
        ok = ok and good
        last = lines[-1]
        print(f"older-kernel: {kind}: {'confirmed' if good else 'WRONG'} "
              f"({last.get('drop_reason')} at {last.get('drop_location')}, outcome "
              f"{last.get('outcome')}, count {counts[-1]} in {len(lines)} line(s))")
sys.exit(0 if ok else 1)
PY
echo "older-kernel: PASS"
