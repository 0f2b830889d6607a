#!/bin/busybox sh
# clb-probe VM tier, stage 1 (/init of the initramfs, busybox sh): load the virtio/9p/overlay
# modules, build the guest root (the package layer over the host's / , tmpfs on top), mount
# the results share into it and switch_root to stage 2 (/clb-vm/stage2.sh, host's /bin/sh).
/bin/busybox --install -s /bin
export PATH=/bin

# Tell the host through isa-debug-exit (qemu exits with rc*2+1), then power off.
report() {
	printf "\\$(printf %03o "$1")" | dd of=/dev/port bs=1 seek=244 count=1 2>/dev/null
	poweroff -f
}
fail() {
	echo "vm-init: $*"
	echo "vm-init: FAILED before running the command"
	report 125
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev || fail "mounting devtmpfs"

for m in $(cat /modules/order); do
	insmod "/modules/$m" || fail "insmod $m"
done

opts=trans=virtio,version=9p2000.L,msize=262144
mount -t 9p -o "$opts,ro,cache=loose" host /host || fail "mounting the host share"
mount -t 9p -o "$opts,ro,cache=loose" pkgs /pkgs || fail "mounting the package share"
mount -t tmpfs -o size=60% tmpfs /rw || fail "mounting tmpfs"
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/pkgs:/host,upperdir=/rw/upper,workdir=/rw/work /newroot ||
	fail "mounting the overlay root"
mkdir -p /newroot/clb-vm
mount -t 9p -o "$opts" results /newroot/clb-vm || fail "mounting the results share"
[ -f /newroot/clb-vm/stage2.sh ] || fail "no stage2.sh in the results share"
mount --move /dev /newroot/dev || fail "moving /dev"
umount /proc /sys
exec switch_root /newroot /bin/sh /clb-vm/stage2.sh
