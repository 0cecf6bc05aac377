package defense

import (
	"net/netip"
	"strings"

	"github.com/flashsale/flashsale"
)

// maxForwardedHops bounds how many X-Forwarded-For entries are examined, so
// a huge header costs bounded work.
const maxForwardedHops = 64

// ClientAddr returns the address of the client that sent a request.
//
// peer is the address of the TCP peer. If it is not inside one of the
// trusted prefixes, xff is ignored and peer is the answer (a client cannot
// choose its address by sending X-Forwarded-For). If peer is a trusted
// proxy, xff (every X-Forwarded-For header of the request joined with ",",
// in order) is walked from the right, skipping addresses of trusted proxies;
// the first untrusted address is the client. If every entry is trusted, the
// leftmost one is the answer. An entry that is not an address (garbage,
// "unknown", an obfuscated name) ends the walk: nothing left of it can be
// believed, so the last trusted hop seen is the answer.
//
// Entries may carry ports ("1.2.3.4:80", "[2001:db8::1]:443"), brackets and
// IPv6 zones; IPv4-mapped IPv6 addresses are returned as IPv4. The zero Addr
// is returned only for an invalid peer.
func ClientAddr(peer netip.Addr, xff string, trusted []netip.Prefix) netip.Addr {
	peer = normAddr(peer)
	if !peer.IsValid() || !inPrefixes(peer, trusted) {
		return peer
	}
	last := peer
	for hops := 0; hops < maxForwardedHops && xff != ""; {
		var part string
		if i := strings.LastIndexByte(xff, ','); i >= 0 {
			part, xff = xff[i+1:], xff[:i]
		} else {
			part, xff = xff, ""
		}
		part = strings.TrimSpace(part)
		if part == "" {
			continue // empty list element ("a,,b" or a trailing comma)
		}
		hops++
		a, ok := parseHostAddr(part)
		if !ok {
			return last
		}
		if !inPrefixes(a, trusted) {
			return a
		}
		last = a
	}
	return last
}

// parseHostAddr parses one X-Forwarded-For entry: an IPv4 or IPv6 address,
// optionally bracketed, optionally with a port. It does not allocate.
func parseHostAddr(s string) (netip.Addr, bool) {
	if len(s) > 64 { // longest real form: bracketed IPv6 with zone and port
		return netip.Addr{}, false
	}
	if a, err := netip.ParseAddr(s); err == nil {
		return normAddr(a), true
	}
	if s[0] == '[' {
		end := strings.IndexByte(s, ']')
		if end < 0 {
			return netip.Addr{}, false
		}
		rest := s[end+1:]
		if rest != "" && !validPort(rest) {
			return netip.Addr{}, false
		}
		a, err := netip.ParseAddr(s[1:end])
		if err != nil || !a.Is6() {
			return netip.Addr{}, false
		}
		return normAddr(a), true
	}
	// IPv4 with a port: exactly one colon.
	i := strings.IndexByte(s, ':')
	if i < 0 || strings.IndexByte(s[i+1:], ':') >= 0 || !validPort(s[i:]) {
		return netip.Addr{}, false
	}
	a, err := netip.ParseAddr(s[:i])
	if err != nil || !a.Is4() {
		return netip.Addr{}, false
	}
	return a, true
}

// validPort reports whether s is ":" followed by 1 to 5 decimal digits.
func validPort(s string) bool {
	if len(s) < 2 || len(s) > 6 || s[0] != ':' {
		return false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// normAddr drops an IPv6 zone and turns an IPv4-mapped IPv6 address into
// IPv4, so one client has one key and prefixes match.
func normAddr(a netip.Addr) netip.Addr {
	if a.Zone() != "" {
		a = a.WithZone("")
	}
	return a.Unmap()
}

func inPrefixes(a netip.Addr, ps []netip.Prefix) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ParsePrefixes parses a comma-separated list of CIDRs or single addresses
// (FLASHSALE_TRUSTED_PROXIES), e.g. "10.0.0.0/8, 192.168.1.7, fd00::/8".
// Blank entries are skipped; a single address becomes a /32 or /128; host
// bits are cleared; IPv4-mapped IPv6 prefixes become IPv4 prefixes. A bad
// entry is an INVALID *flashsale.Error naming it.
func ParsePrefixes(csv string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for part := range strings.SplitSeq(csv, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		p, err := parsePrefix(part)
		if err != nil {
			return nil, flashsale.Errorf(flashsale.CodeInvalid, "trusted proxies: %q is not a CIDR or address", truncate(part, 64))
		}
		out = append(out, p)
	}
	return out, nil
}

// parsePrefix parses a CIDR or a single address into a canonical prefix.
func parsePrefix(s string) (netip.Prefix, error) {
	if !strings.Contains(s, "/") {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		a = normAddr(a)
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a, bits := p.Addr(), p.Bits()
	if a.Is4In6() {
		if bits < 96 {
			return netip.Prefix{}, errMappedPrefix
		}
		a, bits = a.Unmap(), bits-96
	}
	return netip.PrefixFrom(a, bits).Masked(), nil
}

type constError string

func (e constError) Error() string { return string(e) }

const errMappedPrefix = constError("IPv4-mapped prefix shorter than /96")

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
