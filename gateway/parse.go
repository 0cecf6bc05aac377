package gateway

import (
	"net"
	"net/netip"

	"github.com/valyala/fasthttp"

	"github.com/flashsale/flashsale"
)

// parseID parses a positive decimal id as it appears in a path: digits only,
// no sign, no leading zero, at most int64.
func parseID(s string) (int64, bool) {
	if len(s) == 0 || len(s) > 19 || s[0] == '0' {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	// 19 digits can exceed int64 but not uint64.
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}

// parseUUID checks the canonical 8-4-4-4-12 hex form and returns it in
// lower case (a new string, safe to keep).
func parseUUID(s string) (string, bool) {
	if len(s) != 36 {
		return "", false
	}
	var b [36]byte
	for i := 0; i < 36; i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return "", false
			}
		default:
			switch {
			case c >= '0' && c <= '9', c >= 'a' && c <= 'f':
			case c >= 'A' && c <= 'F':
				c += 'a' - 'A'
			default:
				return "", false
			}
		}
		b[i] = c
	}
	return string(b[:]), true
}

// bearerToken returns the token of an `Authorization: Bearer <token>`
// header value (scheme case-insensitive), or "" when there is none.
func bearerToken(h string) string {
	const prefix = "bearer "
	if len(h) <= len(prefix) {
		return ""
	}
	for i := 0; i < len(prefix); i++ {
		c := h[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != prefix[i] {
			return ""
		}
	}
	t := h[len(prefix):]
	for len(t) > 0 && t[0] == ' ' {
		t = t[1:]
	}
	for len(t) > 0 && (t[len(t)-1] == ' ' || t[len(t)-1] == '\t') {
		t = t[:len(t)-1]
	}
	return t
}

// peerAddr is the address of a connection's remote end, without allocating
// for TCP peers.
func peerAddr(a net.Addr) netip.Addr {
	switch a := a.(type) {
	case *net.TCPAddr:
		ip, _ := netip.AddrFromSlice(a.IP)
		return ip.Unmap()
	case nil:
		return netip.Addr{}
	default:
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			return netip.Addr{}
		}
		return ap.Addr().Unmap()
	}
}

// validPresetName accepts preset names of 1..64 characters [a-zA-Z0-9_-].
func validPresetName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// parseItemQuery reads the polling call's choice, ?itemId=N, from a raw
// query string: present false without one; one positive id, or INVALID.
func parseItemQuery(q []byte) (itemID int64, present bool, err error) {
	if len(q) == 0 {
		return 0, false, nil
	}
	var args fasthttp.Args
	args.ParseBytes(q)
	vals := args.PeekMulti("itemId")
	if len(vals) == 0 {
		return 0, false, nil
	}
	id, ok := parseID(string(vals[0]))
	if len(vals) > 1 || !ok {
		return 0, false, flashsale.Invalid("itemId", "one positive integer item id")
	}
	return id, true, nil
}
