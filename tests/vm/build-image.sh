#!/bin/sh
# Builds the VM lab's image from Debian packages only, as root:
#   build-image.sh OUT MIRROR KERNEL PACKAGES_FILE BOOT_SCRIPT APT_CACHE
# OUT: an empty directory; on success it holds disk.img (ext4, the root file
# system), vmlinuz, initrd.img and kernel-release. KERNEL is a Debian package,
# optionally with /SUITE (linux-image-amd64/bookworm-backports). APT_CACHE keeps
# downloaded .debs between builds. Everything this script changes lives under OUT.
set -eu

OUT=$1
MIRROR=$2
KERNEL=$3
PACKAGES=$4
BOOT=$5
CACHE=$6
ROOT=$OUT/rootfs

say() { echo "[vm] image: $*" >&2; }

cleanup() {
	for m in dev/pts dev sys proc var/cache/apt/archives; do
		if mountpoint -q "$ROOT/$m" 2>/dev/null; then umount -l "$ROOT/$m" || true; fi
	done
}
trap cleanup EXIT INT TERM

mkdir -p "$ROOT" "$CACHE/archives/partial"
say "debootstrap bookworm (minbase) from $MIRROR"
debootstrap --variant=minbase --include=systemd-sysv,udev,kmod,iproute2 \
	--cache-dir="$CACHE/archives" bookworm "$ROOT" "$MIRROR" >"$OUT/debootstrap.log" 2>&1 || {
	tail -n 30 "$OUT/debootstrap.log" >&2
	exit 1
}

mount -t proc proc "$ROOT/proc"
mount -t sysfs sys "$ROOT/sys"
mount --bind /dev "$ROOT/dev"
mount --bind /dev/pts "$ROOT/dev/pts"
mount --bind "$CACHE/archives" "$ROOT/var/cache/apt/archives"

# Nothing started while installing.
printf '#!/bin/sh\nexit 101\n' >"$ROOT/usr/sbin/policy-rc.d"
chmod 755 "$ROOT/usr/sbin/policy-rc.d"

suite=bookworm
case $KERNEL in */*) suite=${KERNEL#*/} ;; esac
{
	echo "deb $MIRROR bookworm main"
	if [ "$suite" != bookworm ]; then echo "deb $MIRROR $suite main"; fi
} >"$ROOT/etc/apt/sources.list"

pkgs=$(grep -v '^[[:space:]]*#' "$PACKAGES" | tr '\n' ' ')
say "apt-get install $pkgs $KERNEL"
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get update -q >"$OUT/apt.log" 2>&1 || {
	tail -n 30 "$OUT/apt.log" >&2
	exit 1
}
# shellcheck disable=SC2086
chroot "$ROOT" env DEBIAN_FRONTEND=noninteractive LC_ALL=C \
	apt-get install -y -q --no-install-recommends -o Dpkg::Use-Pty=0 $pkgs "$KERNEL" >>"$OUT/apt.log" 2>&1 || {
	tail -n 30 "$OUT/apt.log" >&2
	exit 1
}
rm -f "$ROOT/usr/sbin/policy-rc.d"

# The guest: root on /dev/vda, no network but the lab's veths, the lab's unit.
echo roce-lab >"$ROOT/etc/hostname"
echo '/dev/vda / ext4 rw,relatime 0 1' >"$ROOT/etc/fstab"
install -m 755 "$BOOT" "$ROOT/usr/local/sbin/roce-lab-boot"
cat >"$ROOT/etc/systemd/system/roce-lab.service" <<'UNIT'
[Unit]
Description=roce-agent VM lab: run the shared scenarios, then power off
After=local-fs.target systemd-modules-load.service
Wants=local-fs.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/roce-lab-boot
StandardOutput=journal+console
StandardError=journal+console
TimeoutStartSec=infinity

[Install]
WantedBy=multi-user.target
UNIT
chroot "$ROOT" systemctl enable roce-lab.service >/dev/null 2>&1
# No login prompts on the console, no timers.
chroot "$ROOT" systemctl mask serial-getty@ttyS0.service getty@tty1.service \
	apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer >/dev/null 2>&1 || true

cleanup
trap - EXIT INT TERM

release=$(ls "$ROOT/lib/modules" | head -n 1)
cp "$ROOT/boot/vmlinuz-$release" "$OUT/vmlinuz"
cp "$ROOT/boot/initrd.img-$release" "$OUT/initrd.img"
echo "$release" >"$OUT/kernel-release"
# The .debs stay in APT_CACHE only.
rm -rf "$ROOT/var/cache/apt/archives" "$ROOT/var/lib/apt/lists"
mkdir -p "$ROOT/var/cache/apt/archives/partial" "$ROOT/var/lib/apt/lists/partial"

say "mkfs.ext4 (kernel $release)"
truncate -s 2G "$OUT/disk.img"
mkfs.ext4 -q -F -L roce-lab -d "$ROOT" "$OUT/disk.img"
rm -rf "$ROOT"
