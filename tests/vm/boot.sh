#!/bin/sh
# Installed in the VM lab's image as /usr/local/sbin/roce-lab-boot, run once by
# roce-lab.service: mounts the host's 9p share, runs its guest.sh, powers off.
# What the scenarios do lives in the share, so changing them needs no new image.
mkdir -p /mnt/share
# The 9p channel registers when its virtio device is probed, which may come after
# this service starts ("9pnet_virtio: no channels available for device share"): the
# mount is tried again for up to 30 s.
mount_share() {
	mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 share /mnt/share
}
tries=0
until mount_share; do
	tries=$((tries + 1))
	[ $tries -lt 30 ] || break
	sleep 1
done
if mountpoint -q /mnt/share; then
	mkdir -p /mnt/share/out
	/bin/sh /mnt/share/vm/guest.sh /mnt/share >/mnt/share/out/guest.log 2>&1
	echo "roce-lab: guest.sh exited $?" >/dev/console
	sync
else
	echo "roce-lab: mounting the 9p share failed" >/dev/console
fi
systemctl --no-block poweroff
