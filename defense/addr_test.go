package defense

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/flashsale/flashsale"
)

func mustPrefixes(t testing.TB, csv string) []netip.Prefix {
	t.Helper()
	ps, err := ParsePrefixes(csv)
	if err != nil {
		t.Fatalf("ParsePrefixes(%q): %v", csv, err)
	}
	return ps
}

func TestClientAddr(t *testing.T) {
	trusted := mustPrefixes(t, "10.0.0.0/8, 192.168.1.7, fd00::/8")
	tests := []struct {
		name string
		peer string
		xff  string
		want string
	}{
		{"no header", "198.51.100.9", "", "198.51.100.9"},
		{"forged header from untrusted peer ignored", "198.51.100.9", "1.2.3.4", "198.51.100.9"},
		{"forged chain from untrusted peer ignored", "198.51.100.9", "1.2.3.4, 10.0.0.1", "198.51.100.9"},
		{"trusted proxy: client appended by proxy", "10.1.2.3", "198.51.100.9", "198.51.100.9"},
		{"trusted proxy: rightmost untrusted, forged left part ignored", "10.1.2.3", "6.6.6.6, 198.51.100.9", "198.51.100.9"},
		{"two trusted hops skipped", "10.1.2.3", "6.6.6.6, 198.51.100.9, 192.168.1.7, 10.9.9.9", "198.51.100.9"},
		{"several headers joined", "10.1.2.3", "6.6.6.6,198.51.100.9 , ,10.0.0.5", "198.51.100.9"},
		{"all entries trusted: leftmost", "10.1.2.3", "10.0.0.2, 10.0.0.3", "10.0.0.2"},
		{"trusted proxy, empty header: the proxy", "10.1.2.3", " , ", "10.1.2.3"},
		{"garbage stops the walk at the last trusted hop", "10.1.2.3", "198.51.100.9, evil, 10.0.0.4", "10.0.0.4"},
		{"garbage right next to the proxy", "10.1.2.3", "198.51.100.9, unknown", "10.1.2.3"},
		{"ipv4 with port", "10.1.2.3", "198.51.100.9:4711", "198.51.100.9"},
		{"bad port is garbage", "10.1.2.3", "198.51.100.9:47x1", "10.1.2.3"},
		{"ipv6 client via ipv4 proxy", "10.1.2.3", "2001:db8::1", "2001:db8::1"},
		{"ipv6 bracketed with port", "10.1.2.3", "[2001:db8::1]:443", "2001:db8::1"},
		{"ipv6 bracketed without port", "10.1.2.3", "[2001:db8::1]", "2001:db8::1"},
		{"ipv6 zone dropped", "10.1.2.3", "fe80::1%eth0", "fe80::1"},
		{"ipv6 trusted proxy", "fd00::1", "2001:db8::7, fd12::3", "2001:db8::7"},
		{"ipv6 untrusted peer ignores header", "2001:db8::99", "2001:db8::7", "2001:db8::99"},
		{"ipv4-mapped peer is unmapped and trusted", "::ffff:10.1.2.3", "198.51.100.9", "198.51.100.9"},
		{"ipv4-mapped entry unmapped", "10.1.2.3", "::ffff:198.51.100.9", "198.51.100.9"},
		{"ipv4-mapped untrusted peer unmapped", "::ffff:198.51.100.9", "1.2.3.4", "198.51.100.9"},
		{"ipv4-mapped forged trusted entry still trusted", "10.1.2.3", "198.51.100.9, ::ffff:10.0.0.8", "198.51.100.9"},
		{"brackets around ipv4 are garbage", "10.1.2.3", "[198.51.100.9]", "10.1.2.3"},
		{"unterminated bracket is garbage", "10.1.2.3", "[2001:db8::1", "10.1.2.3"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := ClientAddr(netip.MustParseAddr(tc.peer), tc.xff, trusted)
			if want := netip.MustParseAddr(tc.want); got != want {
				t.Errorf("ClientAddr(%s, %q) = %s, want %s", tc.peer, tc.xff, got, want)
			}
		})
	}
}

func TestClientAddrBoundsWork(t *testing.T) {
	trusted := mustPrefixes(t, "10.0.0.0/8")
	xff := "198.51.100.9," + strings.Repeat("10.0.0.1,", 1000)
	// More trusted hops than we walk: the last examined trusted hop.
	if got := ClientAddr(netip.MustParseAddr("10.0.0.2"), xff, trusted); !trusted[0].Contains(got) {
		t.Errorf("got %s, want an address of 10.0.0.0/8", got)
	}
	if got := ClientAddr(netip.Addr{}, "1.2.3.4", trusted); got.IsValid() {
		t.Errorf("invalid peer: got %s, want the zero Addr", got)
	}
}

func TestParsePrefixes(t *testing.T) {
	tests := []struct {
		in      string
		want    string // prefixes joined by " ", or "ERR"
		wantErr bool
	}{
		{in: "", want: ""},
		{in: " , ", want: ""},
		{in: "10.0.0.0/8", want: "10.0.0.0/8"},
		{in: "10.1.2.3/8, 192.168.1.7", want: "10.0.0.0/8 192.168.1.7/32"},
		{in: "2001:db8::1/64,::1", want: "2001:db8::/64 ::1/128"},
		{in: "::ffff:10.0.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:10.0.0.1", want: "10.0.0.1/32"},
		{in: "10.0.0.0/33", wantErr: true},
		{in: "10.0.0.0/8, nope", wantErr: true},
		{in: "::ffff:0:0/90", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.in, func(t *testing.T) {
			ps, err := ParsePrefixes(tc.in)
			if tc.wantErr {
				if flashsale.ErrorCode(err) != flashsale.CodeInvalid {
					t.Fatalf("err = %v, want INVALID", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, p := range ps {
				got = append(got, p.String())
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Errorf("got %q, want %q", g, tc.want)
			}
		})
	}
}

func FuzzClientAddr(f *testing.F) {
	for _, s := range []string{"", "1.2.3.4", "1.2.3.4, 10.0.0.1", "[2001:db8::1]:80", "fe80::1%eth0", "::ffff:1.2.3.4",
		"unknown", ",,,", "[", "]:", "1.2.3.4:", "[::1]:99999999", "1.2.3.4:5:6"} {
		f.Add([]byte{10, 0, 0, 1}, s)
		f.Add([]byte{198, 51, 100, 9}, s)
		f.Add(netip.MustParseAddr("fd00::1").AsSlice(), s)
	}
	trusted := mustPrefixes(f, "10.0.0.0/8, fd00::/8")
	f.Fuzz(func(t *testing.T, peerBytes []byte, xff string) {
		peer, ok := netip.AddrFromSlice(peerBytes)
		if !ok {
			return
		}
		got := ClientAddr(peer, xff, trusted)
		np := normAddr(peer)
		if !got.IsValid() || got.Zone() != "" || got.Is4In6() {
			t.Fatalf("ClientAddr(%s, %q) = %s: not a normalized address", peer, xff, got)
		}
		if !inPrefixes(np, trusted) {
			if got != np {
				t.Fatalf("untrusted peer %s: got %s, want the peer", peer, got)
			}
			return
		}
		if got == np {
			return
		}
		// The answer must be an entry of the header.
		found := false
		for e := range strings.SplitSeq(xff, ",") {
			if a, ok := parseHostAddr(strings.TrimSpace(e)); ok && a == got {
				found = true
				break
			}
		}
		if !found {
			t.Fatalf("ClientAddr(%s, %q) = %s: not in the header", peer, xff, got)
		}
	})
}
