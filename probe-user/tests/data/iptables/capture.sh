#!/bin/sh
# Regenerates lab-capture-v4.txt / lab-capture-v6.txt: loads the lab rulesets into a scratch
# network namespace with iptables-restore / ip6tables-restore and stores what iptables-save
# prints back. Needs root. The namespace is always deleted.
set -eu
cd "$(dirname "$0")"
NS="clbtest-ipt-$$"
ip netns add "$NS"
trap 'ip netns del "$NS"' EXIT INT TERM
grep -v '^#' lab-kube-proxy.rules | ip netns exec "$NS" iptables-restore
grep -v '^#' lab-kube-proxy-v6.rules | ip netns exec "$NS" ip6tables-restore
{
  echo "# Captured by capture.sh: \`ip netns exec NS iptables-save -t nat\` after loading"
  echo "# lab-kube-proxy.rules; $(iptables-save --version), kernel $(uname -r)."
  ip netns exec "$NS" iptables-save -t nat
} > lab-capture-v4.txt
{
  echo "# Captured by capture.sh: \`ip netns exec NS ip6tables-save -t nat\` after loading"
  echo "# lab-kube-proxy-v6.rules; $(ip6tables-save --version), kernel $(uname -r)."
  ip netns exec "$NS" ip6tables-save -t nat
} > lab-capture-v6.txt
