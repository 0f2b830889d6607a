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
python3 - "$out/confirmed.jsonl" <<'PY'
import json, sys
events = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
want = {
    "healthcheck_blackhole": {"drop_reason": "NOT_SPECIFIED", "dst_port": 30080, "outcome": "dropped"},
    "vip_port_unserved": {"drop_reason": "NO_SOCKET", "vip_port": 443, "outcome": "refused"},
    "hairpin": {"drop_reason": "IP_RPFILTER", "vip_port": 80, "outcome": "dropped"},
}
kinds = sorted(e["kind"] for e in events)
ok = kinds == sorted(want)
for e in events:
    exp = want.get(e["kind"], {})
    good = all(e.get(k) == v for k, v in exp.items()) and e.get("vip") == "203.0.113.10"
    ok = ok and good
    print(f"older-kernel: {e['kind']}: {'confirmed' if good else 'WRONG'} "
          f"({e.get('drop_reason')} at {e.get('drop_location')}, outcome {e.get('outcome')})")
if kinds != sorted(want):
    print(f"older-kernel: FAIL: confirmed kinds {kinds}, expected one each of {sorted(want)} "
          "(the healthy twins must add none)")
sys.exit(0 if ok else 1)
PY
echo "older-kernel: PASS"
