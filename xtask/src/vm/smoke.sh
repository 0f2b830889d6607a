#!/bin/bash
# VM tier smoke scenario: the stock Debian kernel loads IPVS and dummy, takes a kube-proxy style
# virtual server on a VIP bound to kube-ipvs0, and has BTF with the skb drop reasons.
# Exits 0 only when every step worked.
set -u
failures=0
step() {
	echo "+ $*"
	if ! "$@"; then
		echo "smoke: FAILED: $*"
		failures=$((failures + 1))
	fi
}

echo "smoke: uname -r = $(uname -r)"
step modprobe ip_vs ip_vs_rr dummy
step ip link add kube-ipvs0 type dummy
step ip addr add 203.0.113.10/32 dev kube-ipvs0
step ipvsadm -A -t 203.0.113.10:80 -s rr
step ipvsadm -a -t 203.0.113.10:80 -r 198.19.1.11:8080 -m
echo "smoke: ipvsadm -Ln:"
step ipvsadm -Ln
if ipvsadm -Ln | grep -q '198.19.1.11:8080 *Masq'; then
	echo "smoke: IPVS real server present"
else
	echo "smoke: FAILED: the real server is not in ipvsadm -Ln"
	failures=$((failures + 1))
fi
if [ -e /sys/kernel/btf/vmlinux ]; then
	echo "smoke: /sys/kernel/btf/vmlinux present ($(stat -c %s /sys/kernel/btf/vmlinux) bytes)"
else
	echo "smoke: FAILED: no /sys/kernel/btf/vmlinux"
	failures=$((failures + 1))
fi
# Drop reasons (>= 5.17) or, before them, the two-argument kfree_skb tracepoint (skb, location).
btf=$(bpftool btf dump file /sys/kernel/btf/vmlinux format c)
reasons=$(grep -c SKB_DROP_REASON_ <<<"$btf")
echo "smoke: SKB_DROP_REASON_ lines in BTF: ${reasons:-0}"
echo "smoke: kfree_skb prototype: $(grep -m1 'btf_trace_kfree_skb)' <<<"$btf")"
if [ "${reasons:-0}" -le 0 ] && ! grep -q 'btf_trace_kfree_skb)' <<<"$btf"; then
	echo "smoke: FAILED: neither SKB_DROP_REASON_ nor the kfree_skb tracepoint in the kernel's BTF"
	failures=$((failures + 1))
fi
echo "smoke: $failures failure(s)"
[ "$failures" -eq 0 ]
