package loadtest

import "syscall"

// ipBindAddressNoPort is IP_BIND_ADDRESS_NO_PORT (linux/in.h): with a
// source address bound before connect, the kernel picks the port at connect
// time, so ports are shared across destinations instead of reserved per
// bind.
const ipBindAddressNoPort = 24

func bindNoPort(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_IP, ipBindAddressNoPort, 1)
	})
	if err != nil {
		return err
	}
	// An old kernel without the option still works, with bind's port rules.
	_ = serr
	return nil
}
