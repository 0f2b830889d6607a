#!/bin/sh
# clb-probe VM tier, stage 2: PID 1 in the guest root (host's userland, package layer, tmpfs
# upper). Mounts the kernel file systems, runs /clb-vm/cmd.sh (bash) with output to the console
# and /clb-vm/output.log, writes its exit code to /clb-vm/rc and reports it via isa-debug-exit.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root TERM=dumb LC_ALL=C.UTF-8
R=/clb-vm

report() {
	sync
	printf "\\$(printf %03o $(($1 & 127)))" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	echo o >/proc/sysrq-trigger
	sleep 10
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mkdir -p /dev/pts /dev/shm
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
ln -sf /proc/self/fd /dev/fd
ln -sf /proc/self/fd/0 /dev/stdin
ln -sf /proc/self/fd/1 /dev/stdout
ln -sf /proc/self/fd/2 /dev/stderr
# Fresh /tmp and /run (the host's /run/netns must not leak in), unless the workspace is there.
. "$R/vm.env"
for d in /tmp /run; do
	case "$CLB_VM_WORKSPACE/" in
	"$d"/*) ;;
	*) mount -t tmpfs tmpfs "$d" ;;
	esac
done
mount -t bpf bpf /sys/fs/bpf
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo clb-vm >/proc/sys/kernel/hostname
ip link set lo up

echo "vm-init: guest up, kernel $(uname -r); running the command"
{
	bash "$R/cmd.sh" </dev/null
	echo $? >"$R/rc"
} 2>&1 | tee "$R/output.log"
rc=$(cat "$R/rc" 2>/dev/null || echo 125)
echo "vm-init: command exited $rc"
report "$rc"
