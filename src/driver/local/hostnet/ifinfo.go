package hostnet

import (
	"bytes"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// ifinfo is what the driver asks of an interface, one ioctl each: O(1)
// whatever the number of interfaces (net.InterfaceByName dumps them all:
// with hundreds of VMs' veths that is most of a create_vm).
type ifinfo struct {
	index int
	mac   net.HardwareAddr
	up    bool
	addr  netip.Prefix // the primary IPv4 address
}

// ifreq is struct ifreq: a name and a union (a sockaddr, flags, an index).
type ifreq struct {
	name [unix.IFNAMSIZ]byte
	data [24]byte
}

func ioctlIf(fd int, req uintptr, name string, r *ifreq) error {
	*r = ifreq{}
	copy(r.name[:], name)
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), req, uintptr(unsafe.Pointer(r))); e != 0 {
		return e
	}
	return nil
}

// lookupIf answers name's index, hardware address, whether it is up and
// its IPv4 address; unix.ENODEV when there is no such interface.
func lookupIf(name string) (ifinfo, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return ifinfo{}, err
	}
	defer unix.Close(fd)
	var r ifreq
	var i ifinfo
	if err := ioctlIf(fd, unix.SIOCGIFINDEX, name, &r); err != nil {
		return ifinfo{}, err
	}
	i.index = int(*(*int32)(unsafe.Pointer(&r.data[0])))
	if err := ioctlIf(fd, unix.SIOCGIFHWADDR, name, &r); err == nil {
		i.mac = bytes.Clone(r.data[2:8]) // a sockaddr: family, then the address
	}
	if err := ioctlIf(fd, unix.SIOCGIFFLAGS, name, &r); err == nil {
		i.up = *(*uint16)(unsafe.Pointer(&r.data[0]))&unix.IFF_UP != 0
	}
	if err := ioctlIf(fd, unix.SIOCGIFADDR, name, &r); err == nil {
		a := netip.AddrFrom4([4]byte(r.data[4:8])) // sockaddr_in: family, port, address
		if err := ioctlIf(fd, unix.SIOCGIFNETMASK, name, &r); err == nil {
			ones, _ := net.IPMask(r.data[4:8]).Size()
			i.addr = netip.PrefixFrom(a, ones)
		}
	}
	return i, nil
}
