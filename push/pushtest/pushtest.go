// Package pushtest is a local Web Push service for tests: it plays both
// the browser (it makes the subscription's keys) and the push service (it
// takes the application server's POST), and decrypts every notification
// as a browser would (RFC 8291: ECDH P-256, HKDF, AES-128-GCM, content
// coding aes128gcm of RFC 8188) after checking its VAPID token (RFC 8292).
// It is written from the RFCs, not from the sender's code, so that it
// checks that code. It imports nothing of the module and is never in the
// production binary (layout_test.go, notShipped).
package pushtest

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdh"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// Notice is one notification the service received and decrypted.
type Notice struct {
	Path    string // the endpoint's path: which subscription
	Payload []byte // the plaintext
	Subject string // the VAPID token's sub
	TTL     string
	Topic   string
	Urgency string
}

// Service is a local push service. Its zero value is not usable: call New.
type Service struct {
	t         testing.TB
	srv       *httptest.Server
	vapidKey  []byte // the application server's public key it expects (k)
	mu        sync.Mutex
	subs      map[string]*sub   // by endpoint path
	status    map[string]int    // answer by endpoint path (default 201)
	errs      []error           // requests it refused, for Err
	Received  chan Notice       // every notification decrypted, in order
	requests  map[string]int    // requests by endpoint path
	lastToken map[string]string // VAPID token by path (tests of reuse)
}

type sub struct {
	key  *ecdh.PrivateKey
	auth []byte
}

// New starts a service that accepts notifications signed by the VAPID
// public key vapidPublic (base64url), closed when the test ends.
func New(t testing.TB, vapidPublic string) *Service {
	t.Helper()
	k, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(vapidPublic, "="))
	if err != nil {
		t.Fatalf("pushtest: VAPID public key: %v", err)
	}
	s := &Service{t: t, vapidKey: k, subs: map[string]*sub{}, status: map[string]int{},
		Received: make(chan Notice, 1024), requests: map[string]int{}, lastToken: map[string]string{}}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.srv.Close)
	return s
}

// URL is the service's base URL (http://127.0.0.1:port).
func (s *Service) URL() string { return s.srv.URL }

// Subscribe makes a browser's subscription at path (e.g. "/u/1") and
// returns it as PushSubscription.toJSON() gives it.
func (s *Service) Subscribe(path string) []byte {
	s.t.Helper()
	key, err := ecdh.P256().GenerateKey(rand.Reader)
	if err != nil {
		s.t.Fatal(err)
	}
	auth := make([]byte, 16)
	_, _ = rand.Read(auth)
	s.mu.Lock()
	s.subs[path] = &sub{key: key, auth: auth}
	s.mu.Unlock()
	b, _ := json.Marshal(map[string]any{
		"endpoint":       s.srv.URL + path,
		"expirationTime": nil,
		"keys": map[string]string{
			"p256dh": base64.RawURLEncoding.EncodeToString(key.PublicKey().Bytes()),
			"auth":   base64.RawURLEncoding.EncodeToString(auth),
		},
	})
	return b
}

// Answer makes the service answer status to every notification for path
// (404 and 410: the subscription is gone).
func (s *Service) Answer(path string, status int) {
	s.mu.Lock()
	s.status[path] = status
	s.mu.Unlock()
}

// Requests is how many notifications reached path, decrypted or not.
func (s *Service) Requests(path string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.requests[path]
}

// Err returns the reasons the service refused requests (a bad token, a
// payload it could not decrypt), nil when it refused none.
func (s *Service) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return errors.Join(s.errs...)
}

func (s *Service) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests[r.URL.Path]++
	sb := s.subs[r.URL.Path]
	status := s.status[r.URL.Path]
	s.mu.Unlock()
	n, err := s.check(r, sb)
	if err != nil {
		s.mu.Lock()
		s.errs = append(s.errs, fmt.Errorf("%s %s: %w", r.Method, r.URL.Path, err))
		s.mu.Unlock()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if status != 0 {
		w.WriteHeader(status)
		return
	}
	s.Received <- n
	w.WriteHeader(http.StatusCreated)
}

func (s *Service) check(r *http.Request, sb *sub) (Notice, error) {
	if r.Method != http.MethodPost {
		return Notice{}, errors.New("not a POST")
	}
	if sb == nil {
		return Notice{}, errors.New("no such subscription")
	}
	if got := r.Header.Get("Content-Encoding"); got != "aes128gcm" {
		return Notice{}, fmt.Errorf("Content-Encoding %q, want aes128gcm", got)
	}
	if r.Header.Get("TTL") == "" {
		return Notice{}, errors.New("no TTL header (RFC 8030 requires one)")
	}
	sub, err := s.checkVAPID(r.Header.Get("Authorization"), "http://"+r.Host)
	if err != nil {
		return Notice{}, fmt.Errorf("VAPID: %w", err)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 8192))
	if err != nil {
		return Notice{}, err
	}
	plain, err := decrypt(body, sb.key, sb.auth)
	if err != nil {
		return Notice{}, fmt.Errorf("decrypt: %w", err)
	}
	return Notice{Path: r.URL.Path, Payload: plain, Subject: sub, TTL: r.Header.Get("TTL"),
		Topic: r.Header.Get("Topic"), Urgency: r.Header.Get("Urgency")}, nil
}

// checkVAPID checks "vapid t=<jwt>, k=<key>" (RFC 8292): k is the
// expected key, the JWT is ES256 signed by it, for this audience, not
// expired, at most 24 hours ahead, with a sub. It returns the sub.
func (s *Service) checkVAPID(h, aud string) (string, error) {
	rest, ok := strings.CutPrefix(h, "vapid ")
	if !ok {
		return "", fmt.Errorf("the Authorization header %q is not vapid", h)
	}
	var tok, key string
	for _, p := range strings.Split(rest, ",") {
		p = strings.TrimSpace(p)
		if v, ok := strings.CutPrefix(p, "t="); ok {
			tok = v
		} else if v, ok := strings.CutPrefix(p, "k="); ok {
			key = v
		}
	}
	k, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(key, "="))
	if err != nil || string(k) != string(s.vapidKey) {
		return "", errors.New("k is not the expected public key")
	}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return "", errors.New("t is not a JWT")
	}
	var hdr struct{ Alg, Typ string }
	if err := decodeJSON(parts[0], &hdr); err != nil || hdr.Alg != "ES256" {
		return "", fmt.Errorf("JWT header %+v: not ES256", hdr)
	}
	pub, err := ecdsa.ParseUncompressedPublicKey(elliptic.P256(), k)
	if err != nil {
		return "", fmt.Errorf("k: %w", err)
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil || len(sig) != 64 {
		return "", errors.New("JWT signature is not 64 bytes (r||s)")
	}
	digest := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if !ecdsa.Verify(pub, digest[:], new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:])) {
		return "", errors.New("JWT signature does not verify")
	}
	var claims struct {
		Aud string `json:"aud"`
		Exp int64  `json:"exp"`
		Sub string `json:"sub"`
	}
	if err := decodeJSON(parts[1], &claims); err != nil {
		return "", err
	}
	now := time.Now().Unix()
	switch {
	case claims.Aud != aud:
		return "", fmt.Errorf("aud %q, want %q", claims.Aud, aud)
	case claims.Exp <= now || claims.Exp > now+24*3600:
		return "", fmt.Errorf("exp %d not within 24 h of now %d", claims.Exp, now)
	case !strings.HasPrefix(claims.Sub, "mailto:") && !strings.HasPrefix(claims.Sub, "https:"):
		return "", fmt.Errorf("sub %q is no contact", claims.Sub)
	}
	return claims.Sub, nil
}

func decodeJSON(part string, v any) error {
	b, err := base64.RawURLEncoding.DecodeString(part)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// decrypt reads one aes128gcm message (RFC 8188 header: salt(16) rs(4)
// idlen(1) keyid(idlen), here the sender's ephemeral public key) for the
// user agent key ua and auth secret, as RFC 8291 section 3.4 derives it.
func decrypt(body []byte, ua *ecdh.PrivateKey, auth []byte) ([]byte, error) {
	if len(body) < 21 {
		return nil, errors.New("short header")
	}
	salt, rs, idlen := body[:16], binary.BigEndian.Uint32(body[16:20]), int(body[20])
	if idlen != 65 || len(body) < 21+idlen {
		return nil, fmt.Errorf("keyid of %d bytes, want the 65-byte sender key", idlen)
	}
	asPub, err := ecdh.P256().NewPublicKey(body[21 : 21+idlen])
	if err != nil {
		return nil, fmt.Errorf("sender key: %w", err)
	}
	ct := body[21+idlen:]
	if rs < 18 || uint32(len(ct)) > rs {
		return nil, fmt.Errorf("one record of %d bytes with rs %d", len(ct), rs)
	}
	secret, err := ua.ECDH(asPub)
	if err != nil {
		return nil, err
	}
	prkKey, err := hkdf.Extract(sha256.New, secret, auth)
	if err != nil {
		return nil, err
	}
	info := "WebPush: info\x00" + string(ua.PublicKey().Bytes()) + string(asPub.Bytes())
	ikm, err := hkdf.Expand(sha256.New, prkKey, info, 32)
	if err != nil {
		return nil, err
	}
	prk, err := hkdf.Extract(sha256.New, ikm, salt)
	if err != nil {
		return nil, err
	}
	cek, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: aes128gcm\x00", 16)
	if err != nil {
		return nil, err
	}
	nonce, err := hkdf.Expand(sha256.New, prk, "Content-Encoding: nonce\x00", 12)
	if err != nil {
		return nil, err
	}
	block, err := aes.NewCipher(cek)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	plain, err := gcm.Open(nil, nonce, ct, nil)
	if err != nil {
		return nil, err
	}
	// The last record ends with its delimiter 0x02 and zero padding.
	i := len(plain) - 1
	for i >= 0 && plain[i] == 0 {
		i--
	}
	if i < 0 || plain[i] != 2 {
		return nil, errors.New("no last-record delimiter")
	}
	return plain[:i], nil
}
