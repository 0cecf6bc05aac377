package push

import (
	"bytes"
	"crypto/ecdh"
	"encoding/base64"
	"encoding/json"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/flashsale/flashsale"
)

// Limits of a subscription as the browser sends it
// (PushSubscription.toJSON()): the push services' endpoints are a few
// hundred bytes.
const (
	MaxBodyBytes     = 4096
	MaxEndpointBytes = 2048
)

// Subscription is a checked Web Push subscription: an endpoint URL and
// the browser's keys, base64url without padding.
type Subscription struct {
	Endpoint string `json:"endpoint"`
	P256dh   string `json:"p256dh"`
	Auth     string `json:"auth"`
}

// Hosts are the endpoint hosts (names or addresses, lower case, no port)
// that may be reached over plain http and at loopback or private
// addresses: a local push service, or a test's
// (FLASHSALE_PUSH_INSECURE_HOSTS). Any other endpoint must be https to a
// host name or a global address.
type Hosts map[string]bool

// ParseHosts reads a comma-separated host list.
func ParseHosts(s string) Hosts {
	h := Hosts{}
	for _, p := range strings.Split(s, ",") {
		if p = strings.ToLower(strings.TrimSpace(p)); p != "" {
			h[strings.Trim(p, "[]")] = true
		}
	}
	return h
}

// Parse checks a subscription as the browser's PushSubscription.toJSON()
// gives it ({"endpoint", "expirationTime", "keys": {"p256dh", "auth"}})
// and returns it. Anything malformed is INVALID with a message safe to
// show; an unknown field is refused like any of the contract's bodies.
func Parse(body []byte, insecure Hosts) (Subscription, error) {
	if len(body) > MaxBodyBytes {
		return Subscription{}, flashsale.Errorf(flashsale.CodeTooLarge, "a subscription is at most %d bytes", MaxBodyBytes)
	}
	var in struct {
		Endpoint       string           `json:"endpoint"`
		ExpirationTime *json.RawMessage `json:"expirationTime"`
		Keys           struct {
			P256dh string `json:"p256dh"`
			Auth   string `json:"auth"`
		} `json:"keys"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return Subscription{}, flashsale.Invalid("body", "not a push subscription")
	}
	if dec.More() {
		return Subscription{}, flashsale.Invalid("body", "one JSON object")
	}
	if err := checkEndpoint(in.Endpoint, insecure); err != nil {
		return Subscription{}, err
	}
	dh, err := decodeKey(in.Keys.P256dh)
	if err != nil || len(dh) != 65 {
		return Subscription{}, flashsale.Invalid("keys.p256dh", "an uncompressed P-256 point, base64url")
	}
	if _, err := ecdh.P256().NewPublicKey(dh); err != nil {
		return Subscription{}, flashsale.Invalid("keys.p256dh", "an uncompressed P-256 point, base64url")
	}
	auth, err := decodeKey(in.Keys.Auth)
	if err != nil || len(auth) != 16 {
		return Subscription{}, flashsale.Invalid("keys.auth", "16 bytes, base64url")
	}
	return Subscription{
		Endpoint: in.Endpoint,
		P256dh:   base64.RawURLEncoding.EncodeToString(dh),
		Auth:     base64.RawURLEncoding.EncodeToString(auth),
	}, nil
}

// checkEndpoint accepts an absolute https URL (http only to an insecure
// host) with no credentials and no fragment, whose host is a name or a
// global unicast address (loopback and private ones only when insecure):
// the server posts to it, so it must not be a way into the private
// network.
func checkEndpoint(raw string, insecure Hosts) error {
	bad := func(why string) error { return flashsale.Invalid("endpoint", "%s", why) }
	if raw == "" {
		return bad("missing")
	}
	if len(raw) > MaxEndpointBytes {
		return bad("too long")
	}
	for i := 0; i < len(raw); i++ {
		if raw[i] <= ' ' || raw[i] >= 0x7f {
			return bad("not a URL")
		}
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Host == "" || u.Opaque != "" {
		return bad("not an absolute URL")
	}
	if u.User != nil || u.Fragment != "" || strings.HasSuffix(raw, "#") {
		return bad("no credentials or fragment")
	}
	host := strings.ToLower(u.Hostname())
	if host == "" {
		return bad("no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("bad port")
		}
	}
	allowed := insecure[host]
	switch u.Scheme {
	case "https":
	case "http":
		if !allowed {
			return bad("must be https")
		}
	default:
		return bad("must be https")
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !allowed && (!ip.IsGlobalUnicast() || ip.IsPrivate()) {
			return bad("not a public address")
		}
	} else if !allowed && (host == "localhost" || strings.HasSuffix(host, ".localhost")) {
		return bad("not a public address")
	}
	return nil
}

// decodeKey reads base64url with or without padding (browsers send it
// without; some libraries with).
func decodeKey(s string) ([]byte, error) {
	return base64.RawURLEncoding.DecodeString(strings.TrimRight(s, "="))
}
