#!/bin/busybox sh
# /init of the KVM test guest (see guest.ts). It runs as PID 1 from the initramfs and reports what it
# saw on the serial console as "BC-GUEST key=value" lines, which the tests grep. It must never exit:
# PID 1 exiting panics the kernel. So no `set -e`; every step reports its own failure and we go on.

/bin/busybox mkdir -p /proc /sys /dev /mnt /seed /tmp
/bin/busybox mount -t proc proc /proc
# Applet links are made here rather than at build time so the image never disagrees with its busybox.
/bin/busybox --install -s /bin
export PATH=/bin

mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
# The cpio's /dev/console is now hidden under devtmpfs; reopen the console from there.
exec </dev/console >/dev/console 2>&1

say() { echo "BC-GUEST $*"; }
fail() { echo "BC-GUEST error=$*"; }

# Poll up to ~10 s for a condition (the devices appear asynchronously as the drivers probe).
wait_until() {
  i=0
  while [ "$i" -lt 100 ]; do
    "$@" && return 0
    sleep 0.1
    i=$((i + 1))
  done
  return 1
}

# Modules come in dependency order from the builder; the kernel has no modprobe/depmod data here.
load_modules() {
  while read -r m; do
    [ -n "$m" ] || continue
    insmod "/lib/modules/$m.ko" || fail "insmod $m"
  done </etc/bc-modules
}

seed_by_label() { findfs LABEL=cidata >/dev/null 2>&1; }

# Prints the seed device: the filesystem labelled cidata, else the first IDE/SCSI cdrom.
find_seed() {
  if wait_until seed_by_label; then
    findfs LABEL=cidata
  elif [ -b /dev/sr0 ]; then
    echo /dev/sr0
  else
    return 1
  fi
}

# Value of a top-level "key: value" line of meta-data, without quotes or a trailing CR.
meta() {
  sed -n "s/^$1:[[:space:]]*//p" /seed/meta-data | head -n 1 | tr -d "\"'\r" | sed 's/[[:space:]]*$//'
}

# One line per authorized key: hex sha256 of the key blob (what OpenSSH's SHA256 fingerprint encodes).
report_ssh_keys() {
  [ -f /seed/user-data ] || return 0
  grep -oE '(ssh|ecdsa-sha2|sk-ssh|sk-ecdsa-sha2)-[A-Za-z0-9@.-]+ +[A-Za-z0-9+/]+=*' /seed/user-data |
    while read -r _type blob; do
      if printf '%s' "$blob" | base64 -d >/tmp/key.blob 2>/dev/null; then
        say "ssh-key-sha256=$(sha256sum /tmp/key.blob | cut -d ' ' -f 1)"
      else
        fail "ssh key not base64"
      fi
    done
}

# Unmounting (not just sync) checkpoints the ext4 journal, so the file is visible to debugfs on the host.
write_marker() {
  case "$1" in */* | "") fail "bad instance-id"; return 1 ;; esac
  mount -t ext4 -o rw /dev/vda /mnt || { fail "mount /dev/vda"; return 1; }
  written=
  if echo "$1" >"/mnt/bc-$1" && sync; then written=1; else fail "write /bc-$1"; fi
  umount /mnt || { fail "umount /dev/vda"; return 1; }
  [ -n "$written" ] && say "wrote=/bc-$1"
}

virtio_net_present() { grep -qx 0x0001 /sys/bus/virtio/devices/*/device 2>/dev/null; }
eth0_present() { [ -e /sys/class/net/eth0 ]; }

report_nic() {
  if virtio_net_present; then wait_until eth0_present; fi
  eth0_present || return 0
  ip link set eth0 up || fail "ip link set eth0 up"
  say "mac=$(tr 'A-F' 'a-f' </sys/class/net/eth0/address)"
}

load_modules
# Kernel messages from here on would interleave with our lines; errors still get through.
dmesg -n 4
wait_until test -b /dev/vda || fail "no /dev/vda"

if seed=$(find_seed) && mount -t iso9660 -o ro "$seed" /seed; then
  iid=$(meta instance-id)
  host=$(meta local-hostname)
  say "instance-id=$iid"
  say "hostname=$host"
  [ -n "$host" ] && hostname "$host"
  report_ssh_keys
  write_marker "$iid"
else
  fail "no seed (cidata) device"
fi

report_nic
say ready

# A counter kept only in memory: after a restore it goes on from the saved value, which is how the tests
# see that the guest's memory came back rather than a fresh boot.
tick=0
while :; do
  tick=$((tick + 1))
  say "tick=$tick"
  sleep 0.25
done
